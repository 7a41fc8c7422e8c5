"""`RestClient`: HTTP to one API server over urllib3's connection pool, with `Credentials`.

The transport under `KubeApi`, as the `kubernetes` package's ApiClient was (it is urllib3
underneath too): the same pool, timeouts and retries, without importing that package's
client, config loaders and their dependencies. A bearer token from a file (the service
account's, rotated by the kubelet) is read again at most once a minute, as client-go does.
The TLS context is made with the first request, so building a client never fails on a
certificate, and loading credentials never contacts the server.

`RestClient(configuration=client.configuration)` is a second client to the same server with
a pool of its own, as `type(api_client)(configuration=...)` was for the kubernetes client.
"""

from __future__ import annotations

import os
import ssl
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlencode

from dracommon.kubeapi.credentials import Credentials

if TYPE_CHECKING:
    # Imported with the first request (~20 ms and ~4 MiB): the plugin's sockets open before it.
    import urllib3

# The kubernetes client's default pool size (Configuration.connection_pool_maxsize).
DEFAULT_POOL_SIZE: Final = (os.cpu_count() or 1) * 5
TOKEN_REREAD_S: Final = 60.0

Timeout = float | tuple[float, float]


class RestClient:
    """Requests to the server `configuration` names; safe to use from several threads."""

    def __init__(
        self, configuration: Credentials, *, pool_size: int = DEFAULT_POOL_SIZE, retries: int | None = None
    ) -> None:
        self.configuration = configuration
        self.pool_size = pool_size
        self.retries = retries
        self._lock = threading.Lock()
        self._pool: urllib3.PoolManager | None = None
        self._token = configuration.token
        self._token_read_at = float("-inf")

    @property
    def server(self) -> str:
        return self.configuration.server

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context for the server: its CA (or none checked when insecure) and our client
        certificate; `ssl.SSLError`/`OSError` for unusable files."""
        creds = self.configuration
        if creds.insecure:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            cadata = creds.ca_data.decode() if creds.ca_data else None
            context = ssl.create_default_context(cafile=creds.ca_file, cadata=cadata)
        if creds.cert_file or creds.cert_data:
            _load_client_cert(context, creds)
        return context

    def headers(self) -> dict[str, str]:
        """The authentication header (none without a token)."""
        token = self._current_token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def ensure_pool(self, size: int, retries: int | None = None) -> None:
        """At least `size` pooled connections; `retries` (None: leave as is) for urllib3's own
        retries of one request. A pool already made is replaced (its connections dropped)."""
        with self._lock:
            if self.pool_size >= size and (retries is None or retries == self.retries):
                return
            self.pool_size = max(self.pool_size, size)
            if retries is not None:
                self.retries = retries
            old, self._pool = self._pool, None
        if old is not None:
            old.clear()

    def urlopen(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] | Mapping[str, str] = (),
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        timeout: Timeout,
    ) -> urllib3.BaseHTTPResponse:
        """One request; the response unread (stream it, or `read()` it: the connection goes back to
        the pool once the body is read). urllib3's errors (and `OSError`) when no answer came."""
        import urllib3

        url = self.server + path + (f"?{urlencode(query)}" if query else "")
        sent = {**self.headers(), **(headers or {})}
        limit = (
            urllib3.Timeout(connect=timeout[0], read=timeout[1])
            if isinstance(timeout, tuple)
            else urllib3.Timeout(total=timeout)
        )
        return self._manager().request(
            method, url, body=body, headers=sent, timeout=limit, preload_content=False, redirect=False
        )

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.clear()

    def __enter__(self) -> RestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _manager(self) -> urllib3.PoolManager:
        import urllib3

        with self._lock:
            if self._pool is None:
                kw: dict[str, Any] = {"maxsize": self.pool_size, "num_pools": 4}
                if self.retries is not None:
                    kw["retries"] = urllib3.Retry(total=self.retries, redirect=0)
                if self.server.startswith("https:"):
                    kw["ssl_context"] = self.ssl_context()
                    if self.configuration.tls_server_name:
                        kw["server_hostname"] = self.configuration.tls_server_name
                    if self.configuration.insecure:
                        kw["cert_reqs"] = "CERT_NONE"
                        kw["assert_hostname"] = False
                self._pool = urllib3.PoolManager(**kw)
            return self._pool

    def _current_token(self) -> str | None:
        path = self.configuration.token_file
        if path is None:
            return self._token
        now = time.monotonic()
        if now - self._token_read_at >= TOKEN_REREAD_S:
            try:
                with open(path) as file:
                    self._token = file.read().strip() or self._token
            except OSError:
                pass  # keep the last one: a rotation replaces the file, a read may fall between
            self._token_read_at = now
        return self._token


def _load_client_cert(context: ssl.SSLContext, creds: Credentials) -> None:
    """`load_cert_chain` reads files only: inline PEM goes through files made for the call."""
    written: list[str] = []
    try:

        def as_file(path: str | None, data: bytes | None) -> str | None:
            if data is None:
                return path
            fd, name = tempfile.mkstemp(prefix="kube-", suffix=".pem")
            written.append(name)
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            return name

        cert = as_file(creds.cert_file, creds.cert_data)
        key = as_file(creds.key_file, creds.key_data)
        assert cert is not None
        context.load_cert_chain(cert, key)
    finally:
        for name in written:
            os.unlink(name)
