"""bench/prepare/claimdelay.py carries a burst of concurrent fresh connections without losing or
garbling a request, holds only the blocked claim's GET, and counts what it forwarded.

Against a small TLS HTTP/1.1 server of the test's own (no API server): the proxy's job is bytes
and TLS, both sides of which are real here.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench.prepare.claimdelay import ClaimDelayProxy
from devcluster import pki

THREADS = 64
# Fresh connections per thread, two requests on each: a connection's first moments (TLS 1.3 session
# tickets arriving while the first request goes out) are where a proxy that reads and writes one
# SSL object from two threads garbled records.
CONNECTIONS_EACH = 8
REQUESTS_EACH = 2
# Only a bound for a request the proxy lost (the test then fails instead of hanging); an
# answered request takes milliseconds.
LOST_AFTER_S = 60.0
CLAIM = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/{}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server

    def do_GET(self) -> None:
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # quiet: no line per request
        pass


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[ClaimDelayProxy]:
    ca = pki.self_signed_ca(tmp_path, "upstream CA")
    cert = pki.serving_cert(ca, tmp_path, "upstream", "127.0.0.1", ("127.0.0.1",), ())
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert.cert), str(cert.key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    claimdelay = ClaimDelayProxy(server.server_address[1], ca.cert, tmp_path / "proxy", delay_s=0.2)
    try:
        yield claimdelay
    finally:
        claimdelay.close()
        server.shutdown()
        server.server_close()


def _client(proxy: ClaimDelayProxy) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=str(proxy.ca.cert))
    return http.client.HTTPSConnection("127.0.0.1", proxy.port, context=context, timeout=LOST_AFTER_S)


def _get(connection: http.client.HTTPSConnection, path: str) -> str:
    connection.request("GET", path)
    answer = connection.getresponse()
    doc = json.loads(answer.read())
    assert answer.status == 200
    return str(doc["path"])


def test_a_burst_of_fresh_connections_gets_every_answer(proxy: ClaimDelayProxy) -> None:
    def one_thread(t: int) -> list[str]:
        answers = []
        for c in range(CONNECTIONS_EACH):
            connection = _client(proxy)
            try:
                answers += [_get(connection, CLAIM.format(f"t{t}-c{c}-r{r}")) for r in range(REQUESTS_EACH)]
            finally:
                connection.close()
        return answers

    with ThreadPoolExecutor(THREADS) as pool:
        answered = list(pool.map(one_thread, range(THREADS)))

    expected = [
        [CLAIM.format(f"t{t}-c{c}-r{r}") for c in range(CONNECTIONS_EACH) for r in range(REQUESTS_EACH)]
        for t in range(THREADS)
    ]
    assert answered == expected, "every request answered, each with its own answer"
    stats = proxy.reset_stats()
    assert not stats.failed_connections
    assert stats.connections == THREADS * CONNECTIONS_EACH
    assert len(stats.answers) == THREADS * CONNECTIONS_EACH * REQUESTS_EACH
    assert stats.unanswered == 0


def test_only_the_blocked_claims_get_is_held(proxy: ClaimDelayProxy) -> None:
    connection = _client(proxy)
    try:
        proxy.block("ns", "victim")
        assert _get(connection, CLAIM.format("victim-2")) == CLAIM.format("victim-2"), "a longer name"
        assert proxy.delayed == 0
        assert _get(connection, CLAIM.format("victim") + "?x=1") == CLAIM.format("victim") + "?x=1"
        assert proxy.delayed == 1
        proxy.block(None)
        assert _get(connection, CLAIM.format("victim")) == CLAIM.format("victim")
        assert proxy.delayed == 1
    finally:
        connection.close()
    summary = proxy.reset_stats().summary()
    assert "1 connections" in summary and "3 answers" in summary, summary
