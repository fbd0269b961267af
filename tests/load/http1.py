"""A small HTTP/1.1 keep-alive client on asyncio streams, for the load generators.

httpx costs the load generator roughly as much CPU per streamed event as the mock upstream
spends making it, and on a 2-core machine the generator competes with the system it measures.
This client does only what the benchmarks need: one host, keep-alive connections, request
bodies with Content-Length, responses with Content-Length or chunked transfer encoding, and
reads in large batches. Idle connections are dropped after ``idle_expiry_s`` (below uvicorn's
5 s keep-alive), so a request is never sent on a socket the server is about to close.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

READ_SIZE = 65536


class ProtocolError(Exception):
    """The server sent something this client does not understand, or closed early."""


@dataclass
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0
    reusable: bool = True

    def close(self) -> None:
        self.reusable = False
        self.writer.close()


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    _conn: Connection
    _left: int | None  # Content-Length still to read; None: chunked
    _done: bool = False
    _chunk_left: int = 0

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (dechunked), in reads of up to READ_SIZE bytes."""
        reader = self._conn.reader
        if self._left is not None:
            while self._left > 0:
                data = await reader.read(min(self._left, READ_SIZE))
                if not data:
                    raise ProtocolError("connection closed inside the body")
                self._left -= len(data)
                yield data
            self._done = True
            return
        while True:
            if self._chunk_left == 0:
                line = await reader.readuntil(b"\r\n")
                size = int(line.split(b";", 1)[0], 16)
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":
                        pass  # trailers
                    self._done = True
                    return
                self._chunk_left = size
            data = await reader.read(min(self._chunk_left, READ_SIZE))
            if not data:
                raise ProtocolError("connection closed inside a chunk")
            self._chunk_left -= len(data)
            if self._chunk_left == 0:
                await reader.readexactly(2)
            yield data

    async def read(self) -> bytes:
        return b"".join([part async for part in self.chunks()])


@dataclass
class Client:
    """Requests to one ``base_url`` (http://host:port[/prefix]) over pooled connections."""

    base_url: str
    max_connections: int = 256
    idle_expiry_s: float = 2.0
    _idle: list[Connection] = field(default_factory=list)
    _slots: asyncio.Semaphore | None = None
    opened: int = 0  # connections opened, for the record

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")

    async def _connection(self) -> Connection:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < self.idle_expiry_s and not conn.reader.at_eof():
                return conn
            conn.close()
        reader, writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        self.opened += 1
        return Connection(reader, writer)

    def _release(self, conn: Connection, clean: bool) -> None:
        if clean and conn.reusable:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()

    @asynccontextmanager
    async def stream(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> AsyncIterator[Response]:
        """Send a request; yields the response with its body still to read."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        async with self._slots:
            conn = await self._connection()
            clean = False
            try:
                response = await self._exchange(conn, method, path, body, headers or {})
                yield response
                clean = response._done
            finally:
                self._release(conn, clean)

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """A whole exchange: (status, headers, body)."""
        async with self.stream(method, path, body, headers) as r:
            return r.status, r.headers, await r.read()

    async def _exchange(
        self, conn: Connection, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> Response:
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines.append(f"content-length: {len(body)}")
        conn.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        try:
            head = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            raise ProtocolError("server closed the connection before answering") from e
        status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        parsed: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            parsed[name.strip().lower()] = value.strip()
        if parsed.get("connection", "").lower() == "close":
            conn.reusable = False
        chunked = "chunked" in parsed.get("transfer-encoding", "").lower()
        length = None if chunked else int(parsed.get("content-length", "0"))
        return Response(status, parsed, conn, length)

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()
