"""GETs to one HTTPS server on the event loop: a pool of keep-alive HTTP/1.1 connections.

The prepare path's claim reads go out all at once (the kubelet sends up to 64 claims together).
A thread per request through the synchronous client costs ~0.4 ms of CPU per GET under the GIL
and a thread hop each way; here a request is a write and a read on a connection the loop already
holds, parsed by h11 (the HTTP/1.1 state machine httpx is built on), at about a quarter of that.

Connections are opened on demand up to `max_connections` (one per claim the kubelet may send at
once, so none waits for another's answer), kept while the server keeps them alive, and dropped on
any failure: a connection that broke midway, or whose answer was not read to the end, is never
handed out again. Every failure to get an answer is `HttpUnavailable`; the caller's deadline bounds
the whole request (connect, TLS, send, answer) through cancellation.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from asyncio import sslproto
from collections.abc import Iterable
from dataclasses import dataclass

import h11

# An answer larger than this is not a ResourceClaim (the API server caps objects at ~1.5 MiB).
MAX_BODY_BYTES = 16 << 20
READ_CHUNK = 64 << 10
# A TLS connection's receive buffer: one TLS record (16 KiB of data) and its framing, twice.
TLS_RECEIVE_BUFFER = 32 << 10


class HttpUnavailable(Exception):
    """No complete answer: connection refused or reset, TLS failure, a malformed or cut answer."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    reason: str
    body: bytes


class _LeanTls(sslproto.SSLProtocol):
    """asyncio's own TLS layer with a smaller receive buffer.

    asyncio gives each TLS connection a 256 KiB buffer (`SSLProtocol.max_size`), zeroed when the
    connection is made, so resident at once: over bench.prepare's latency runs the plugin kept
    7 to 64 connections (as many as a burst had GETs in flight together) and its RSS after them
    went from 69 to 86 MiB with the count, about 0.27 MiB a connection. Each read from the socket
    fills at most this buffer; a claim is a few KiB and a TLS record at most 16 KiB plus its
    framing, so 32 KiB takes any record in one read.
    """

    max_size = TLS_RECEIVE_BUFFER


class _StreamProtocol(asyncio.StreamReaderProtocol):
    """A stream's protocol that keeps the transport it is given, which is the TLS layer's side
    facing the stream: the writer writes through it."""

    transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        super().connection_made(transport)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.http = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_BODY_BYTES)

    def close(self) -> None:
        self.writer.close()

    async def get(self, request: h11.Request) -> Answer:
        self.writer.write(self.http.send(request) + self.http.send(h11.EndOfMessage()))
        await self.writer.drain()
        status, reason, chunks, size = 0, "", [], 0
        while True:
            event = self.http.next_event()
            if event is h11.NEED_DATA:
                data = await self.reader.read(READ_CHUNK)
                self.http.receive_data(data)  # b"": the server closed; h11 says if that was early
                continue
            if isinstance(event, h11.Response):
                status, reason = event.status_code, event.reason.decode("latin-1")
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > MAX_BODY_BYTES:
                    raise HttpUnavailable(f"answer larger than {MAX_BODY_BYTES} bytes")
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return Answer(status, reason, b"".join(chunks))
            elif isinstance(event, h11.ConnectionClosed):
                raise HttpUnavailable("the server closed the connection before answering")

    def reusable(self) -> bool:
        if self.http.our_state is not h11.DONE or self.http.their_state is not h11.DONE:
            return False
        self.http.start_next_cycle()
        return not self.writer.is_closing()


class GetPool:
    """Keep-alive connections to `host:port` over TLS (`ssl_context`; None: plain HTTP)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        server_hostname: str | None = None,
        max_connections: int,
    ) -> None:
        self.host = host
        self.port = port
        self._ssl = ssl_context
        self._server_hostname = server_hostname
        self._max_connections = max_connections
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._authority = host if ":" not in host else f"[{host}]"
        default_port = 443 if ssl_context is not None else 80
        if port != default_port:
            self._authority += f":{port}"
        self.opened = 0  # connections opened so far (the tests read it)

    async def get(self, target: str, headers: Iterable[tuple[str, str]]) -> Answer:
        """One GET of `target` (path and query). Raises `HttpUnavailable`; cancellation (the
        caller's deadline) drops the connection the request was on."""
        self._bind_loop()
        request = h11.Request(method="GET", target=target, headers=[("Host", self._authority), *headers])
        async with self._slots:
            connection = self._idle.pop() if self._idle else None
            try:
                if connection is not None:
                    try:
                        answer = await connection.get(request)
                    except (HttpUnavailable, OSError, h11.ProtocolError):
                        # A kept-alive connection the server closed meanwhile: once more on a new one.
                        connection.close()
                        connection = None
                if connection is None:
                    connection = await self._open()
                    answer = await connection.get(request)
            except BaseException as err:
                if connection is not None:
                    connection.close()
                if isinstance(err, (OSError, h11.ProtocolError)):
                    raise HttpUnavailable(_describe(err)) from err
                raise
            if connection.reusable():
                self._idle.append(connection)
            else:
                connection.close()
            return answer

    def _bind_loop(self) -> None:
        # Connections and the semaphore belong to one event loop; a pool used from another (tests
        # run one per case) starts afresh there.
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._idle = []
            self._slots = asyncio.Semaphore(self._max_connections)

    async def _open(self) -> _Connection:
        if self._ssl is None:
            reader, writer = await asyncio.open_connection(self.host, self.port, limit=READ_CHUNK)
        else:
            reader, writer = await self._open_tls(self._ssl)
        self.opened += 1
        return _Connection(reader, writer)

    async def _open_tls(self, context: ssl.SSLContext) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """What `asyncio.open_connection(ssl=...)` builds (TCP, asyncio's TLS layer, a stream on
        top), with the lean TLS layer in place of asyncio's default one."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=READ_CHUNK, loop=loop)
        stream = _StreamProtocol(reader, loop=loop)
        handshake = loop.create_future()
        # As open_connection does: the certificate is checked against the host unless told otherwise.
        tls = _LeanTls(loop, stream, context, handshake, server_hostname=self._server_hostname or self.host)
        transport, _ = await loop.create_connection(lambda: tls, self.host, self.port)
        try:
            await handshake
        except BaseException:
            transport.close()
            raise
        assert stream.transport is not None  # the TLS layer hands it over before the handshake ends
        return reader, asyncio.StreamWriter(stream.transport, stream, reader, loop)

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()


def _describe(err: BaseException) -> str:
    """The failure as a log line can say it: "Connection refused ([Errno 111] Connect call ...)"."""
    errno = getattr(err, "errno", None)
    if isinstance(errno, int) and not isinstance(err, ssl.SSLError):
        return f"{os.strerror(errno)} ({err})"
    return f"{type(err).__name__}: {err}"
