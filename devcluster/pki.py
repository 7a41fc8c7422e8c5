"""Keys and certificates for a throw-away test cluster, made with `openssl`."""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path


class PKIError(RuntimeError):
    pass


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise PKIError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def rsa_key(path: Path) -> Path:
    """An RSA private key (PEM). kube-apiserver derives the public half itself."""
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(path))
    path.chmod(0o600)
    return path


@dataclass(frozen=True)
class CertKey:
    cert: Path
    key: Path


def self_signed_ca(directory: Path, common_name: str) -> CertKey:
    """The cluster's CA: it signs client certificates (kube-apiserver --client-ca-file) and the
    kubelets' serving certificates (kube-apiserver --kubelet-certificate-authority)."""
    ca = CertKey(directory / "client-ca.crt", directory / "client-ca.key")
    rsa_key(ca.key)
    _openssl(
        "req", "-x509", "-new", "-key", str(ca.key), "-subj", f"/CN={common_name}",
        "-days", "30", "-out", str(ca.cert),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return ca


def client_cert(ca: CertKey, directory: Path, stem: str, user: str, groups: tuple[str, ...]) -> CertKey:
    """A client certificate: the apiserver reads the user from CN and groups from O."""
    subject = "".join(f"/O={group}" for group in groups) + f"/CN={user}"
    return _signed(ca, directory, stem, subject, "clientAuth", "")


def serving_cert(
    ca: CertKey,
    directory: Path,
    stem: str,
    common_name: str,
    ips: tuple[str, ...],
    dns_names: tuple[str, ...],
) -> CertKey:
    """A TLS server certificate for the given addresses (the kubelet's, for the API server to verify)."""
    names = [f"IP:{ip}" for ip in ips] + [f"DNS:{name}" for name in dns_names]
    return _signed(
        ca, directory, stem, f"/CN={common_name}", "serverAuth", f"subjectAltName={','.join(names)}\n"
    )


def _signed(ca: CertKey, directory: Path, stem: str, subject: str, usage: str, extra: str) -> CertKey:
    out = CertKey(directory / f"{stem}.crt", directory / f"{stem}.key")
    rsa_key(out.key)
    csr = directory / f"{stem}.csr"
    ext = directory / f"{stem}.ext"
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                   f"extendedKeyUsage={usage}\n{extra}")  # fmt: skip
    _openssl("req", "-new", "-key", str(out.key), "-subj", subject, "-out", str(csr))
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-set_serial", str(secrets.randbits(63)), "-days", "30", "-extfile", str(ext), "-out", str(out.cert),
    )  # fmt: skip
    csr.unlink()
    ext.unlink()
    return out
