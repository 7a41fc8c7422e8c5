"""A loopback HTTP proxy in front of the API server that holds back one claim's GET.

The "one blocked claim" case: both plugins talk to the API server through it, the same way,
and while `blocked` names a claim, the GET of that claim waits `delay_s` before it goes on,
so that claim's prepare is slow for a reason outside the plugin and the others' latency
shows whether the plugin let it hold them up. The proxy ends the plugins' TLS with a
certificate of its own CA (the request line must be readable: tests/faultproxy.py passes
TLS through and cannot see it; plain HTTP would not do, client-go sends no token over it)
and opens its own to the API server; the plugins' bearer token passes on unchanged.
Threads, not asyncio: the proxy must not share an event loop with what it measures.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from devcluster import pki


class ClaimDelayProxy:
    def __init__(self, upstream_port: int, ca_file: Path, pki_dir: Path, *, delay_s: float) -> None:
        self.delay_s = delay_s
        self.blocked: bytes | None = None
        self.delayed = 0
        self._upstream_port = upstream_port
        self._tls = ssl.create_default_context(cafile=str(ca_file))
        pki_dir.mkdir(parents=True, exist_ok=True)
        self.ca = pki.self_signed_ca(pki_dir, "bench claim-delay proxy CA")
        serving = pki.serving_cert(self.ca, pki_dir, "proxy", "127.0.0.1", ("127.0.0.1",), ("localhost",))
        self._serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._serving.load_cert_chain(str(serving.cert), str(serving.key))
        # HTTP/1.1 only (no h2): one request at a time per connection, its request line readable.
        self._serving.set_alpn_protocols(["http/1.1"])
        self._listener = socket.create_server(("127.0.0.1", 0))
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
        try:
            downstream = self._serving.wrap_socket(client, server_side=True)
            raw = socket.create_connection(("127.0.0.1", self._upstream_port), timeout=5)
            upstream = self._tls.wrap_socket(raw, server_hostname="127.0.0.1")
        except OSError:
            _close(client)
            return
        upstream.settimeout(None)
        threading.Thread(target=self._pump, args=(upstream, downstream, False), daemon=True).start()
        self._pump(downstream, upstream, True)

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while data := src.recv(65536):
                # HTTP/1.1 without pipelining: a request line starts a chunk of the client's stream.
                blocked = self.blocked
                if (
                    requests
                    and blocked
                    and data.startswith(blocked)
                    and data[len(blocked) : len(blocked) + 1] in (b" ", b"?")
                ):
                    self.delayed += 1
                    time.sleep(self.delay_s)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src)
            _close(dst)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
