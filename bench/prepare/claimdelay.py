"""A loopback HTTP proxy in front of the API server that holds back one claim's GET.

The "one blocked claim" case: both plugins talk to the API server through it, the same way,
and while `blocked` names a claim, the GET of that claim waits `delay_s` before it goes on,
so that claim's prepare is slow for a reason outside the plugin and the others' latency
shows whether the plugin let it hold them up. The proxy ends the plugins' TLS with a
certificate of its own CA (the request line must be readable: tests/faultproxy.py passes
TLS through and cannot see it; plain HTTP would not do, client-go sends no token over it)
and opens its own to the API server; the plugins' bearer token passes on unchanged.
Threads, not asyncio: the proxy must not share an event loop with what it measures.

It measures itself (`stats`): how long its TLS handshakes took on each side and how long the
API server took to answer each request it forwarded, so that a slow prepare can be told apart
from a slow proxy: when the plugin waited seconds and the proxy saw its request answered in
milliseconds (or never saw the request), the time went inside the plugin.
"""

from __future__ import annotations

import contextlib
import select
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devcluster import pki

# Accepted but not yet taken connections the listener queues: a burst of 64 fresh connections
# from one plugin fits with room to spare (the default, 128 at most, is also the kernel's cap).
LISTEN_BACKLOG = 512
# A TLS handshake (connect included) that takes longer has failed; the figure says so.
HANDSHAKE_TIMEOUT_S = 10.0
# How long a write waits for the socket before it tries again.
_WRITE_WAIT_S = 0.05


def _ms(seconds: float) -> float:
    return seconds * 1e3


def _p(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


@dataclass
class ProxyStats:
    """What the proxy saw since the last `reset`; every duration in seconds."""

    connections: int = 0
    open_now: int = 0
    open_max: int = 0
    failed_connections: list[str] = field(default_factory=list)
    handshakes: list[float] = field(default_factory=list)  # plugin side, then API-server side
    answers: list[float] = field(default_factory=list)  # request seen -> first answer byte back
    unanswered: int = 0  # requests whose connection closed before any answer came

    def summary(self) -> str:
        text = (
            f"{self.connections} connections (at most {self.open_max} open), "
            f"TLS handshakes p50 {_ms(_p(self.handshakes, 0.5)):.0f} ms / "
            f"max {_ms(max(self.handshakes, default=0)):.0f} ms, "
            f"{len(self.answers)} answers from the API server p50 {_ms(_p(self.answers, 0.5)):.1f} ms / "
            f"p99 {_ms(_p(self.answers, 0.99)):.1f} ms / max {_ms(max(self.answers, default=0)):.0f} ms "
            "(a held GET's wait not counted)"
        )
        if self.unanswered:
            text += f", {self.unanswered} requests never answered"
        if self.failed_connections:
            text += (
                f", {len(self.failed_connections)} connections failed (last: {self.failed_connections[-1]})"
            )
        return text


class ClaimDelayProxy:
    def __init__(self, upstream_port: int, ca_file: Path, pki_dir: Path, *, delay_s: float) -> None:
        self.delay_s = delay_s
        self.blocked: bytes | None = None
        self.delayed = 0
        self.stats = ProxyStats()
        self._stats_lock = threading.Lock()
        self._upstream_port = upstream_port
        self._tls = ssl.create_default_context(cafile=str(ca_file))
        pki_dir.mkdir(parents=True, exist_ok=True)
        self.ca = pki.self_signed_ca(pki_dir, "bench claim-delay proxy CA")
        serving = pki.serving_cert(self.ca, pki_dir, "proxy", "127.0.0.1", ("127.0.0.1",), ("localhost",))
        self._serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._serving.load_cert_chain(str(serving.cert), str(serving.key))
        # HTTP/1.1 only (no h2): one request at a time per connection, its request line readable.
        self._serving.set_alpn_protocols(["http/1.1"])
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=LISTEN_BACKLOG)
        self.port: int = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, name="claimdelay", daemon=True).start()

    def block(self, namespace: str | None, name: str | None = None) -> None:
        """Delay the GET of namespace/name from now on (None: delay nothing)."""
        if namespace is None or name is None:
            self.blocked = None
            return
        path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
        self.blocked = f"GET {path}".encode()

    def reset_stats(self) -> ProxyStats:
        """The figures so far; counting starts again (connections still open stay counted open)."""
        with self._stats_lock:
            done = self.stats
            self.stats = ProxyStats(open_now=done.open_now, open_max=done.open_now)
        return done

    def kubeconfig(self, original: Path, target: Path) -> Path:
        """A copy of `original` whose server is this proxy (its CA; same token)."""
        doc: dict[str, Any] = yaml.safe_load(original.read_text())
        for cluster in doc["clusters"]:
            cluster["cluster"] = {
                "server": f"https://127.0.0.1:{self.port}",
                "certificate-authority": str(self.ca.cert),
            }
        target.write_text(yaml.safe_dump(doc))
        return target

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        with self._stats_lock:
            self.stats.connections += 1
        started = time.perf_counter()
        side = "plugin"
        try:
            client.settimeout(HANDSHAKE_TIMEOUT_S)
            downstream = self._serving.wrap_socket(client, server_side=True)
            shaken = time.perf_counter()
            side = "API server"
            raw = socket.create_connection(("127.0.0.1", self._upstream_port), timeout=HANDSHAKE_TIMEOUT_S)
            upstream = self._tls.wrap_socket(raw, server_hostname="127.0.0.1")
        except OSError as err:
            with self._stats_lock:
                self.stats.failed_connections.append(f"TLS with the {side}: {err}")
            _close(client)
            return
        done = time.perf_counter()
        with self._stats_lock:
            self.stats.handshakes += [shaken - started, done - shaken]
            self.stats.open_now += 1
            self.stats.open_max = max(self.stats.open_max, self.stats.open_now)
        unanswered = 0
        try:
            unanswered = self._relay(downstream, upstream)
        finally:
            _close(downstream)
            _close(upstream)
            with self._stats_lock:
                self.stats.open_now -= 1
                self.stats.unanswered += unanswered

    def _relay(self, downstream: ssl.SSLSocket, upstream: ssl.SSLSocket) -> int:
        """Both directions of one connection in this one thread, until either side closes; the
        number of requests left unanswered.

        One thread, not one per direction: an SSL object must never be read in one thread while
        another writes it (OpenSSL does not allow it; under load a request written that way went
        missing, and the API server closed the connection after its 32 s header timeout).
        Non-blocking, so a read that only consumes a TLS record without data (a session ticket)
        never blocks the other direction.
        """
        sent: deque[float] = deque()  # when each forwarded request went on, oldest first
        peers = {downstream: upstream, upstream: downstream}
        for sock in peers:
            sock.setblocking(False)
        with selectors.DefaultSelector() as selector:
            for sock in peers:
                selector.register(sock, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    src = key.fileobj
                    assert isinstance(src, ssl.SSLSocket)
                    # Everything readable now, including what the SSL object already holds decrypted
                    # (select cannot see that).
                    while True:
                        try:
                            data = src.recv(65536)
                        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                            break
                        except OSError:
                            return len(sent)
                        if not data:
                            return len(sent)
                        if src is downstream:
                            self._request_chunk(data, sent)
                        elif sent:
                            # The first chunk after a request: its answer began (a body's later
                            # chunks find `sent` empty). A held GET's wait is not counted in it.
                            answered = time.perf_counter() - sent.popleft()
                            with self._stats_lock:
                                self.stats.answers.append(answered)
                        if not _send_all(peers[src], data):
                            return len(sent)

    def _request_chunk(self, data: bytes, sent: deque[float]) -> None:
        """Hold the blocked claim's GET; note when a request goes on (HTTP/1.1 without pipelining:
        a request line starts a chunk of the client's stream)."""
        blocked = self.blocked
        if blocked and data.startswith(blocked) and data[len(blocked) : len(blocked) + 1] in (b" ", b"?"):
            self.delayed += 1
            time.sleep(self.delay_s)
        if data[:1].isupper() and b" HTTP/1.1\r\n" in data[:8192]:
            sent.append(time.perf_counter())


def _send_all(sock: ssl.SSLSocket, data: bytes) -> bool:
    """Write all of `data` to a non-blocking socket, waiting while it cannot take more; False
    when the connection broke. A retried write passes the same bytes again, as OpenSSL asks."""
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view) :]
        except ssl.SSLWantReadError:  # TLS needs the peer's bytes first
            select.select([sock], [], [], _WRITE_WAIT_S)
        except (ssl.SSLWantWriteError, BlockingIOError):
            select.select([], [sock], [], _WRITE_WAIT_S)
        except OSError:
            return False
    return True


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
