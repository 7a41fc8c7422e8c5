"""The claim GETs' connection pool, set up from the shared API client.

The shared client (`dracommon.kubeapi`) keeps the server address, TLS settings and
credentials, wherever they came from: a kubeconfig, or the pod's service account, whose token
it re-reads as it rotates. Two kinds of client hold them: the plugin's own `RestClient` (it
says its server, makes its TLS context and its authorization header), and a `kubernetes`
package ApiClient (the dev cluster, tests, kubeconfigs only that package reads), whose
settings the pool takes as urllib3 gets them from it (`kubernetes.client.rest.
RESTClientObject`). Either way the authorization header is asked of the client on every
request, as the client itself does, so a rotated token is used at once. Settings the pool does
not reproduce (a proxy, a hostname check other than the server's own name) leave the reads on
the shared client's threads.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import urlsplit

from draplugin.prepare.httpget import Answer, GetPool

log = logging.getLogger(__name__)

# When the shared client does not say how many requests it runs at once.
DEFAULT_CONNECTIONS: Final = 64


class Unsupported(Exception):
    """A client setting the pool does not reproduce."""


class ClaimPool:
    """GETs of API paths with the shared client's server, TLS and headers."""

    def __init__(self, pool: GetPool, prefix: str, headers: Callable[[], list[tuple[str, str]]]) -> None:
        self.pool = pool
        self._prefix = prefix
        self._headers = headers

    async def get(self, path: str) -> Answer:
        return await self.pool.get(self._prefix + path, self._headers())

    def close(self) -> None:
        self.pool.close()


def claim_pool(api: Any) -> ClaimPool | None:
    """The pool for `api` (an `AsyncKubeApi`); None when its client is not one the pool can
    stand in for (said in the log: the reads then go through the client's threads)."""
    client = getattr(getattr(api, "api", None), "api_client", None)
    try:
        if callable(getattr(client, "ssl_context", None)) and callable(getattr(client, "headers", None)):
            return _from_rest_client(client)
        configuration = getattr(client, "configuration", None)
        if client is None or configuration is None:
            return None
        return _from_configuration(client, configuration)
    except (Unsupported, OSError, ssl.SSLError, ValueError) as err:
        log.info("claim reads go through the client's worker threads", extra={"reason": str(err)})
        return None


def _pool(server: str, context: Callable[[], ssl.SSLContext], server_hostname: Any, size: Any) -> GetPool:
    url = urlsplit(server)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise Unsupported(f"server {server!r} is not an http(s) URL")
    tls = context() if url.scheme == "https" else None
    return GetPool(
        url.hostname,
        url.port or (443 if tls is not None else 80),
        ssl_context=tls,
        server_hostname=str(server_hostname) if server_hostname else None,
        max_connections=int(size or DEFAULT_CONNECTIONS),
    )


def _from_rest_client(client: Any) -> ClaimPool:
    """The plugin's own client: its server, TLS context, tls-server-name and pool size as it has
    them, and its authorization header (a token file re-read as the client re-reads it)."""
    server = str(client.server)
    pool = _pool(
        server,
        client.ssl_context,
        getattr(client.configuration, "tls_server_name", None),
        getattr(client, "pool_size", None),
    )

    def headers() -> list[tuple[str, str]]:
        return [("Accept", "application/json"), *((str(k), str(v)) for k, v in client.headers().items())]

    return ClaimPool(pool, urlsplit(server).path.rstrip("/"), headers)


def _from_configuration(client: Any, configuration: Any) -> ClaimPool:
    """A `kubernetes` ApiClient: its Configuration's settings, as its REST client reads them."""
    if getattr(configuration, "proxy", None):
        raise Unsupported("the client goes through a proxy")
    if getattr(configuration, "assert_hostname", None) is not None:
        raise Unsupported("the client checks the server's certificate against another name")
    server = str(configuration.host)
    pool = _pool(
        server,
        lambda: _tls_context(configuration),
        getattr(configuration, "tls_server_name", None),
        getattr(configuration, "connection_pool_maxsize", None),
    )

    def headers() -> list[tuple[str, str]]:
        # What ApiClient.param_serialize sends on a GET: its default headers (User-Agent), its
        # cookie, Accept, and the BearerToken auth setting, computed now (the refresh hook runs).
        out = [(str(k), str(v)) for k, v in dict(client.default_headers).items()]
        if getattr(client, "cookie", None):
            out.append(("Cookie", str(client.cookie)))
        out.append(("Accept", "application/json"))
        auth = configuration.auth_settings().get("BearerToken")
        if auth and auth.get("in") == "header" and auth.get("value"):
            out.append((str(auth["key"]), str(auth["value"])))
        return out

    return ClaimPool(pool, urlsplit(server).path.rstrip("/"), headers)


def _tls_context(configuration: Any) -> ssl.SSLContext:
    """As urllib3 builds it from the client's settings: verify against `ssl_ca_cert` (or the
    CA data, or the system's roots) unless `verify_ssl` is off; the client certificate if any."""
    if configuration.verify_ssl:
        ca_data = getattr(configuration, "ca_cert_data", None)
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None, cadata=ca_data or None)
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    return context
