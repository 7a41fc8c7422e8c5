"""Why the API server could not be used, as one word an operator can act on (pure).

`ApiError` has status 0 when no answer came; what happened underneath is in
its cause chain (urllib3's `MaxRetryError` holding the last attempt's error,
that one the socket's or ssl's). `error_class` names the case:

- `connection-refused`: nothing listens at the address (wrong port, API server down);
- `name-resolution`: the host name does not resolve;
- `tls-certificate`: the server's certificate is not one the CA in our
  credentials signed, or is not for that host name;
- `tls`: any other TLS failure (not a TLS server at all, a protocol mismatch);
- `connect-timeout` and `timeout`: no connection, or no answer, in time;
- `connection-reset`: the connection was closed midway (a proxy, a restart);
- `transport`: another failure without an answer;

and for answers: `unauthorized` (401: the token is not accepted), `forbidden`
(403: RBAC or admission), `throttled` (429), `server-error` (5xx), else
`http-<code>`.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Iterator

from dracommon.kubeapi import ApiError

_HTTP_CLASSES = {401: "unauthorized", 403: "forbidden", 429: "throttled"}


def error_class(err: ApiError) -> str:
    """The case `err` is (see the module notes)."""
    if err.status:
        if err.status in _HTTP_CLASSES:
            return _HTTP_CLASSES[err.status]
        return "server-error" if err.status >= 500 else f"http-{err.status}"
    from urllib3 import exceptions as u3

    causes = list(_causes(err))
    order: list[tuple[tuple[type[BaseException], ...], str]] = [
        ((u3.NameResolutionError, socket.gaierror), "name-resolution"),
        ((ssl.SSLCertVerificationError,), "tls-certificate"),
        ((u3.SSLError, ssl.SSLError), "tls"),
        ((ConnectionRefusedError,), "connection-refused"),
        ((u3.ConnectTimeoutError,), "connect-timeout"),
        ((u3.ReadTimeoutError, TimeoutError, socket.timeout), "timeout"),
        (
            (u3.ProtocolError, ConnectionResetError, http.client.RemoteDisconnected, BrokenPipeError),
            "connection-reset",
        ),
    ]
    for types, name in order:
        if any(isinstance(cause, types) for cause in causes):
            return name
    return "transport"


def unreachable(err: ApiError) -> bool:
    """No answer came from the API server (as opposed to an answer that refused the call)."""
    return err.status == 0


def _causes(err: BaseException) -> Iterator[BaseException]:
    """`err` and everything it was caused by: `__cause__`, `__context__`, and urllib3's `reason`
    (where `MaxRetryError` keeps the last attempt's error)."""
    seen: set[int] = set()
    pending: list[BaseException] = [err]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for nxt in (getattr(current, "reason", None), current.__cause__, current.__context__):
            if isinstance(nxt, BaseException):
                pending.append(nxt)
