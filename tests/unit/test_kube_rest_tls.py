"""`RestClient` over real TLS: the server's certificate checked against the kubeconfig's CA (inline
data), the client certificate and key given inline, `tls-server-name` for a server reached by IP,
and `insecure-skip-tls-verify`. The certificates are made by openssl (devcluster.pki)."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from devcluster.pki import CertKey, client_cert, self_signed_ca, serving_cert
from dracommon.kubeapi import ApiError, KubeApi, load_api_client


@dataclass
class TlsServer:
    port: int
    ca: CertKey
    client: CertKey
    seen: list[str]


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    pki = tmp_path_factory.mktemp("pki")
    ca = self_signed_ca(pki, "test-ca")
    server_cert = serving_cert(ca, pki, "server", "api", (), ("api.internal",))
    client = client_cert(ca, pki, "client", "alice", ("team",))
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            peer = self.connection.getpeercert()
            subject = dict(x[0] for x in peer["subject"]) if peer else {}
            seen.append(f"{subject.get('commonName', '')} {self.headers.get('Authorization', '')}")
            body = json.dumps({"kind": "Status", "user": subject.get("commonName")}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None: ...

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server_cert.cert, server_cert.key)
    context.load_verify_locations(ca.cert)
    context.verify_mode = ssl.CERT_OPTIONAL
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield TlsServer(httpd.server_address[1], ca, client, seen)
    httpd.shutdown()
    httpd.server_close()


def kubeconfig(path: Path, cluster: dict[str, object], user: dict[str, object]) -> str:
    path.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }))  # fmt: skip
    return str(path)


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_inline_ca_client_certificate_and_tls_server_name(tls_server: TlsServer, tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path / "kc",
        {"server": f"https://127.0.0.1:{tls_server.port}", "tls-server-name": "api.internal",
         "certificate-authority-data": b64(tls_server.ca.cert)},
        {"client-certificate-data": b64(tls_server.client.cert),
         "client-key-data": b64(tls_server.client.key)},
    )  # fmt: skip
    with load_api_client(path) as client:
        assert KubeApi(client).get("/version") == {"kind": "Status", "user": "alice"}


def test_a_server_name_the_certificate_does_not_have_is_refused(
    tls_server: TlsServer, tmp_path: Path
) -> None:
    path = kubeconfig(
        tmp_path / "kc",
        {"server": f"https://127.0.0.1:{tls_server.port}", "certificate-authority": str(tls_server.ca.cert)},
        {"token": "t"},
    )
    with load_api_client(path) as client, pytest.raises(ApiError) as caught:
        KubeApi(client).get("/version")
    assert caught.value.status == 0 and "certificate" in str(caught.value).lower()


def test_insecure_skip_tls_verify_accepts_any_certificate(tls_server: TlsServer, tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path / "kc",
        {"server": f"https://127.0.0.1:{tls_server.port}", "insecure-skip-tls-verify": True},
        {"token": "secret"},
    )
    with load_api_client(path) as client:
        assert KubeApi(client).get("/version")["user"] is None
    assert tls_server.seen[-1] == " Bearer secret"
