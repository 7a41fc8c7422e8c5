"""The claim GETs' pool against real HTTP and HTTPS servers on loopback: a burst goes out at once
on connections that are kept, with the shared client's credentials (a refreshed token at once),
TLS as the client sets it up (the server's CA, a client certificate), and a kept-alive
connection the server closed is retried once; a set-up it does not cover stays on threads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from devcluster import pki
from dracommon.kubeapi import KubeApi
from dracommon.kubeapi.credentials import Credentials
from dracommon.kubeapi.rest import RestClient
from draplugin.kubelet.dra import DEFAULT_MAX_CONCURRENT_CLAIMS
from draplugin.prepare.api import ApiDeadlineExceeded, KubeClaimReader, claim_path
from draplugin.prepare.claimpool import claim_pool
from draplugin.prepare.wiring import claim_reader

TOKEN = "claim-reader-token"

BURST = DEFAULT_MAX_CONCURRENT_CLAIMS


@dataclass
class Server:
    """Answers every GET with a claim named after the path's last segment. `barrier`: each answer
    waits until that many requests are in the server at once. `close_after`: each connection is
    closed after that many answers, without saying so (as a server's idle timeout does)."""

    barrier: threading.Barrier | None = None
    close_after: int = 0
    port: int = 0
    connections: set[tuple[str, int]] = field(default_factory=set)
    headers: list[dict[str, str]] = field(default_factory=list)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            answered = 0

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.connections.add(self.client_address)
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                if server.barrier is not None:
                    server.barrier.wait()
                name = self.path.rsplit("/", 1)[-1]
                data = json.dumps({"metadata": {"name": name}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                self.answered += 1
                if server.close_after and self.answered >= server.close_after:
                    self.close_connection = True

        return Handler


class Listener(ThreadingHTTPServer):
    request_queue_size = 4 * BURST  # a burst connects at once; socketserver's default backlog is 5
    daemon_threads = True


@contextlib.contextmanager
def serving(server: Server, tls: ssl.SSLContext | None = None) -> Iterator[Server]:
    httpd = Listener(("127.0.0.1", 0), server.handler())
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    httpd.shutdown()
    httpd.server_close()


def configuration(port: int, scheme: str = "http") -> k8s.Configuration:
    conf = k8s.Configuration(host=f"{scheme}://127.0.0.1:{port}")
    conf.api_key = {"BearerToken": TOKEN}
    conf.api_key_prefix = {"BearerToken": "Bearer"}
    return conf


def production_reader(conf: k8s.Configuration) -> KubeClaimReader:
    return claim_reader(KubeApi(k8s.ApiClient(conf)))


async def read_burst(reader: KubeClaimReader, prefix: str) -> list[str]:
    deadline = time.monotonic() + 20
    docs = await asyncio.gather(*(reader.get_claim("ns", f"{prefix}{i}", deadline) for i in range(BURST)))
    return [doc["metadata"]["name"] for doc in docs if doc is not None]


@pytest.fixture
def barrier_server() -> Iterator[Server]:
    with serving(Server(barrier=threading.Barrier(BURST, timeout=10))) as server:
        yield server


async def test_a_burst_goes_out_at_once_and_its_connections_are_kept(barrier_server: Server) -> None:
    reader = production_reader(configuration(barrier_server.port))
    try:
        assert await read_burst(reader, "a") == [f"a{i}" for i in range(BURST)]
        assert await read_burst(reader, "b") == [f"b{i}" for i in range(BURST)]
    finally:
        reader.close()
    assert barrier_server.barrier is not None and not barrier_server.barrier.broken
    # One connection per claim of a burst, kept for the next burst.
    assert len(barrier_server.connections) == BURST


async def test_each_request_carries_the_clients_headers_and_a_token_read_then() -> None:
    with serving(Server()) as server:
        conf = configuration(server.port)
        tokens = iter(["first", "second"])

        def refresh(c: k8s.Configuration) -> None:  # what the in-cluster loader's hook does
            c.api_key["BearerToken"] = next(tokens)

        conf.refresh_api_key_hook = refresh  # type: ignore[assignment]
        client = k8s.ApiClient(conf)
        reader = claim_reader(KubeApi(client))
        try:
            for name in ("one", "two"):
                assert await reader.get_claim("ns", name, time.monotonic() + 5) == {
                    "metadata": {"name": name}
                }
        finally:
            reader.close()
        assert [h["authorization"] for h in server.headers] == ["Bearer first", "Bearer second"]
        assert {h["accept"] for h in server.headers} == {"application/json"}
        assert {h["user-agent"] for h in server.headers} == {client.user_agent}


async def test_a_kept_connection_the_server_closed_is_retried_on_a_new_one() -> None:
    with serving(Server(close_after=1)) as server:
        pool = claim_pool(production_reader(configuration(server.port))._api)
        assert pool is not None
        try:
            # Straight to the pool: the reader's own retries (with backoff) would hide a failure.
            answers = [await pool.get(f"/claims/{name}") for name in ("one", "two", "three")]
        finally:
            pool.close()
        assert [(a.status, json.loads(a.body)) for a in answers] == [
            (200, {"metadata": {"name": name}}) for name in ("one", "two", "three")
        ]
        assert len(server.connections) == 3 and pool.pool.opened == 3


async def test_tls_with_the_clients_ca_and_client_certificate(tmp_path: Path) -> None:
    ca = pki.self_signed_ca(tmp_path, "test-ca")
    server_cert = pki.serving_cert(ca, tmp_path, "server", "apiserver", ("127.0.0.1",), ())
    client_cert = pki.client_cert(ca, tmp_path, "plugin", "system:node:a", ("system:nodes",))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca.cert))
    tls.load_cert_chain(str(server_cert.cert), str(server_cert.key))
    tls.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no connection
    with serving(Server(), tls) as server:
        conf = configuration(server.port, "https")
        conf.ssl_ca_cert = str(ca.cert)
        conf.cert_file, conf.key_file = str(client_cert.cert), str(client_cert.key)
        reader = production_reader(conf)
        try:
            assert await reader.get_claim("ns", "c", time.monotonic() + 5) == {"metadata": {"name": "c"}}
        finally:
            reader.close()

        (tmp_path / "other").mkdir()
        other_ca = pki.self_signed_ca(tmp_path / "other", "other-ca")
        conf = configuration(server.port, "https")
        conf.ssl_ca_cert = str(other_ca.cert)  # not the server's CA: the certificate is refused
        conf.cert_file, conf.key_file = str(client_cert.cert), str(client_cert.key)
        reader = production_reader(conf)
        reader._backoff_s = 0.05
        try:
            with pytest.raises(ApiDeadlineExceeded, match="CERTIFICATE_VERIFY_FAILED"):
                await reader.get_claim("ns", "c", time.monotonic() + 0.5)
        finally:
            reader.close()


def test_a_client_through_a_proxy_or_with_another_hostname_check_stays_on_threads() -> None:
    for setting, value in (("proxy", "http://127.0.0.1:3128"), ("assert_hostname", "apiserver")):
        conf = configuration(1)
        setattr(conf, setting, value)
        assert claim_pool(claim_reader(KubeApi(k8s.ApiClient(conf)))._api) is None
    assert claim_pool(claim_reader(KubeApi(k8s.ApiClient(configuration(1))))._api) is not None


def test_the_server_path_prefix_is_kept() -> None:
    conf = configuration(1)
    conf.host = "https://apiserver.example:6443/k8s/"
    pool = claim_pool(claim_reader(KubeApi(k8s.ApiClient(conf)))._api)
    assert pool is not None and pool.pool.host == "apiserver.example" and pool.pool.port == 6443
    assert (
        pool._prefix + claim_path("ns", "c") == "/k8s/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"
    )


# --- the plugin's own client (dracommon.kubeapi.rest.RestClient), as load_api_client builds it ---------


def rest_reader(credentials: Credentials) -> KubeClaimReader:
    return claim_reader(KubeApi(RestClient(credentials)))


async def test_over_the_plugins_own_client_a_burst_goes_out_at_once(barrier_server: Server) -> None:
    reader = rest_reader(Credentials(server=f"http://127.0.0.1:{barrier_server.port}", token=TOKEN))
    assert reader._pool is not None  # the pool, not the client's threads
    try:
        assert await read_burst(reader, "a") == [f"a{i}" for i in range(BURST)]
        assert await read_burst(reader, "b") == [f"b{i}" for i in range(BURST)]
    finally:
        reader.close()
    assert barrier_server.barrier is not None and not barrier_server.barrier.broken
    assert len(barrier_server.connections) == BURST
    assert {h["authorization"] for h in barrier_server.headers} == {f"Bearer {TOKEN}"}


async def test_over_the_plugins_own_client_the_token_file_and_tls(tmp_path: Path) -> None:
    """A service account's shape: the token from its file, the server's CA; and a client
    certificate, as a kubeconfig may name one."""
    ca = pki.self_signed_ca(tmp_path, "test-ca")
    server_cert = pki.serving_cert(ca, tmp_path, "server", "apiserver", ("127.0.0.1",), ())
    client_cert = pki.client_cert(ca, tmp_path, "plugin", "system:node:a", ("system:nodes",))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca.cert))
    tls.load_cert_chain(str(server_cert.cert), str(server_cert.key))
    tls.verify_mode = ssl.CERT_REQUIRED
    token_file = tmp_path / "token"
    token_file.write_text("service-account-token\n")
    with serving(Server(), tls) as server:
        reader = rest_reader(
            Credentials(
                server=f"https://127.0.0.1:{server.port}",
                ca_file=str(ca.cert),
                token_file=str(token_file),
                cert_file=str(client_cert.cert),
                key_file=str(client_cert.key),
            )
        )
        try:
            assert await reader.get_claim("ns", "c", time.monotonic() + 5) == {"metadata": {"name": "c"}}
        finally:
            reader.close()
        assert [h["authorization"] for h in server.headers] == ["Bearer service-account-token"]


async def test_a_burst_over_tls_keeps_its_connections_without_a_large_buffer_each(tmp_path: Path) -> None:
    """asyncio's default TLS layer gives each connection a 256 KiB receive buffer, resident from the
    start: a burst's kept connections were 0.27 MiB each of the plugin's RSS. The pool's own layer
    keeps a smaller one, and the burst still goes out at once over TLS."""
    burst = 16
    ca = pki.self_signed_ca(tmp_path, "test-ca")
    server_cert = pki.serving_cert(ca, tmp_path, "server", "apiserver", ("127.0.0.1",), ())
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(str(server_cert.cert), str(server_cert.key))
    with serving(Server(barrier=threading.Barrier(burst, timeout=10)), tls) as server:
        reader = rest_reader(
            Credentials(server=f"https://127.0.0.1:{server.port}", ca_file=str(ca.cert), token=TOKEN)
        )
        pool = reader._pool
        assert pool is not None
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            answers = await asyncio.gather(*(pool.get(f"/claims/c{i}") for i in range(burst)))
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
            reader.close()
        assert [json.loads(a.body)["metadata"]["name"] for a in answers] == [f"c{i}" for i in range(burst)]
        assert pool.pool.opened == burst and len(server.connections) == burst
        # Python memory still held per kept connection: the TLS layer's buffer (32 KiB now, 256 KiB
        # before), its object, the stream's and h11's state.
    assert held / burst < 96 << 10, f"{held / burst / 1024:.0f} KiB per kept connection"
