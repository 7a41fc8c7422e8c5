"""Which server and credentials, read from a kubeconfig or a pod's service account, without the
`kubernetes` package (which costs ~0.3 s and ~6 MiB to import: its package imports requests,
oauthlib, websocket and its generated client).

What is read is what a daemon's credentials are in practice: the server, its CA (file or
data), `insecure-skip-tls-verify`, `tls-server-name`, a bearer token (inline or `tokenFile`,
read again as the service account's is rotated) and a client certificate and key (files or
data). A kubeconfig user that needs more (an `exec` credential plugin, an `auth-provider`,
username and password) or a cluster behind a `proxy-url` raises `NeedsKubernetesClient`: the
`kubernetes` package's loader handles those, and `load_api_client` falls back to it.

Several kubeconfig files (`$KUBECONFIG` lists them with ':') merge as kubectl merges them: the
first file to name a cluster, user or context, or the current context, wins; relative paths in
a file are relative to that file's directory.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

# Where a pod's service account is mounted (the kubelet rotates the token file in place).
SERVICE_ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# User fields that authenticate in ways only the kubernetes package's loader serves.
_NEEDS_LIBRARY: Final = ("exec", "auth-provider", "username", "password")


class CredentialsError(RuntimeError):
    """The kubeconfig or service account cannot be used (missing, malformed, unknown context)."""


class NeedsKubernetesClient(Exception):
    """The kubeconfig asks for what only the `kubernetes` package's loader does."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """A server and how to authenticate to it. `*_data` fields are PEM bytes."""

    server: str
    ca_file: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    token: str | None = None
    token_file: str | None = None
    cert_file: str | None = None
    cert_data: bytes | None = None
    key_file: str | None = None
    key_data: bytes | None = None


def in_cluster(environ: os._Environ[str] | dict[str, str] | None = None) -> Credentials:
    """The pod's service account, as client-go's rest.InClusterConfig finds it; `CredentialsError`
    outside a pod."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise CredentialsError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    token, ca = SERVICE_ACCOUNT_DIR / "token", SERVICE_ACCOUNT_DIR / "ca.crt"
    for needed in (token, ca):
        if not needed.is_file():
            raise CredentialsError(f"{needed} does not exist: not a pod with a service account")
    if not token.read_text().strip():
        raise CredentialsError(f"{token} is empty")
    address = f"[{host}]" if ":" in host else host
    return Credentials(server=f"https://{address}:{port}", ca_file=str(ca), token_file=str(token))


def contexts(paths: str) -> tuple[dict[str, dict[str, Any]], str | None]:
    """Every context of the merged kubeconfig(s) (`paths` separated by ':'), by name, and the current one."""
    merged = _merge(paths)
    return merged.contexts, merged.current


def from_kubeconfig(paths: str, context: str | None = None) -> Credentials:
    """The credentials of `context` (default: the current one) in the merged kubeconfig(s)."""
    merged = _merge(paths)
    name = context or merged.current
    if not name:
        raise CredentialsError(f"{paths}: no current-context, and no context was named")
    if name not in merged.contexts:
        raise CredentialsError(f"{paths}: context {name!r} does not exist")
    ctx = merged.contexts[name]
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if cluster_name not in merged.clusters:
        raise CredentialsError(f"{paths}: context {name!r} names missing cluster {cluster_name!r}")
    cluster, base = merged.clusters[cluster_name]
    user, user_base = merged.users.get(user_name, ({}, base)) if user_name else ({}, base)
    if user_name and user_name not in merged.users:
        raise CredentialsError(f"{paths}: context {name!r} names user {user_name!r}, which does not exist")
    if cluster.get("proxy-url") or any(user.get(key) for key in _NEEDS_LIBRARY):
        raise NeedsKubernetesClient(f"context {name!r} has an exec plugin, auth provider, password or proxy")
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise CredentialsError(f"{paths}: cluster {cluster_name!r} has no server")
    return Credentials(
        server=server.rstrip("/"),
        ca_file=_path(cluster, "certificate-authority", base),
        ca_data=_data(cluster, "certificate-authority-data", paths),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=cluster.get("tls-server-name") or None,
        token=user.get("token") or None,
        token_file=_path(user, "tokenFile", user_base),
        cert_file=_path(user, "client-certificate", user_base),
        cert_data=_data(user, "client-certificate-data", paths),
        key_file=_path(user, "client-key", user_base),
        key_data=_data(user, "client-key-data", paths),
    )


@dataclass
class _Merged:
    clusters: dict[str, tuple[dict[str, Any], Path]]
    users: dict[str, tuple[dict[str, Any], Path]]
    contexts: dict[str, dict[str, Any]]
    current: str | None


def _merge(paths: str) -> _Merged:
    import yaml  # here: in a pod, with its service account, no kubeconfig is read

    merged = _Merged({}, {}, {}, None)
    files = [p for p in paths.split(os.pathsep) if p and Path(p).is_file()]
    if not files:
        raise CredentialsError(f"no kubeconfig file among {paths}")
    for file in files:
        try:
            doc = yaml.safe_load(Path(file).read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise CredentialsError(f"cannot read kubeconfig {file}: {err}") from err
        if not isinstance(doc, dict):
            raise CredentialsError(f"kubeconfig {file} is not a mapping")
        base = Path(file).resolve().parent
        for key, into in (("clusters", merged.clusters), ("users", merged.users)):
            for entry in _entries(doc, key, file):
                into.setdefault(entry["name"], (dict(entry.get(key[:-1]) or {}), base))
        for entry in _entries(doc, "contexts", file):
            merged.contexts.setdefault(entry["name"], dict(entry.get("context") or {}))
        if merged.current is None and doc.get("current-context"):
            merged.current = str(doc["current-context"])
    return merged


def _entries(doc: dict[str, Any], key: str, file: str) -> list[dict[str, Any]]:
    entries = doc.get(key) or []
    if not isinstance(entries, list) or not all(isinstance(e, dict) and e.get("name") for e in entries):
        raise CredentialsError(f"kubeconfig {file}: {key} must be a list of named entries")
    return entries


def _path(section: dict[str, Any], key: str, base: Path) -> str | None:
    value = section.get(key)
    return str(base / value) if isinstance(value, str) and value else None


def _data(section: dict[str, Any], key: str, where: str) -> bytes | None:
    value = section.get(key)
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as err:
        raise CredentialsError(f"{where}: {key} is not base64: {err}") from err
