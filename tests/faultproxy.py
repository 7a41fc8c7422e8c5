"""A TCP proxy on loopback in front of the real API server that can hold, drop or slow its traffic.

Tests only. It forwards bytes (TLS passes through untouched, so the client
still verifies the API server's certificate) and obeys one `mode`, switched
at any time:
  pass  forward at once;
  hold  keep every byte from going on (both ways) until the mode changes: an API server that
        stalls (connections open, requests sent, no answers);
  drop  close new and open connections at once: an API server that goes away;
  slow  forward, `delay_s` after each chunk.
Threads, not asyncio: the test's event loop must not be the thing that stalls.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

import yaml

MODES = ("pass", "hold", "drop", "slow")
_POLL_S = 0.02


class FaultProxy:
    def __init__(self, upstream_port: int, *, delay_s: float = 0.2) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.delay_s = delay_s
        self.mode = "pass"
        self.connections = 0
        self.held_chunks = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="faultproxy", daemon=True).start()

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
        self.mode = mode
        if mode == "drop":
            with self._lock:
                doomed = list(self._open)
            for sock in doomed:
                _close(sock)

    def kubeconfig(self, original: Path, target: Path) -> Path:
        """A copy of `original` whose server is this proxy (same CA, credentials, context)."""
        doc: dict[str, Any] = yaml.safe_load(original.read_text())
        for cluster in doc["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        target.write_text(yaml.safe_dump(doc))
        return target

    def close(self) -> None:
        self._closed = True
        _close(self._listener)
        with self._lock:
            doomed = list(self._open)
        for sock in doomed:
            _close(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.mode == "drop":
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._open.update((client, server))
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while self.mode == "hold" and not self._closed:
                    self.held_chunks += 1
                    time.sleep(_POLL_S)
                if self.mode == "drop" or self._closed:
                    break
                if self.mode == "slow":
                    time.sleep(self.delay_s)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                _close(sock)
                with self._lock:
                    self._open.discard(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
