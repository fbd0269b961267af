"""A scripted hostile HTTP/1.1 upstream, and a tiny forward proxy, on 127.0.0.1.

Each accepted connection runs the test's *script* (``async def script(conn: Connection)``),
which decides byte by byte what the upstream does: read the request or not, answer, send 1xx
replies, stray bytes, endless headers or bodies, pause, close, or reset (RST, SO_LINGER 0).
The server counts the requests it read, per connection and in total, and a request's id is
taken from its body (``rid=<id>`` anywhere in it), so a reply can name whose request it answers
and a test can tell whose reply arrived.

Async tests use :class:`HostileUpstream` as an async context manager on their own loop; sync
tests (the gateway end to end, driven by the official SDK) run it on a loop of its own in a
thread with :func:`in_thread`. What a script raises, other than the peer going away, fails
the test when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import ssl
import struct
import threading
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

RID = re.compile(rb"rid=([A-Za-z0-9_.-]+)")
MAX_HEAD_BYTES = 64 << 10  # a request head larger than this is not one a client sends
PEER_GONE = (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, EOFError)


def rid_of(data: bytes) -> str | None:
    """The request id named in ``data`` (``rid=<id>``), if any."""
    found = RID.search(data)
    return found.group(1).decode() if found else None


@dataclass
class Request:
    """One request as the upstream read it."""

    head: bytes
    body: bytes
    connection: int  # the index of the connection it came on

    @property
    def request_line(self) -> str:
        return self.head.split(b"\r\n", 1)[0].decode("latin-1")

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode()
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == wanted:
                return value.strip().decode("latin-1")
        return None

    @property
    def rid(self) -> str | None:
        return rid_of(self.body)

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """One accepted connection, as its script sees it."""

    def __init__(
        self,
        server: HostileUpstream,
        index: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.server = server
        self.index = index
        self.reader = reader
        self.writer = writer
        self.requests: list[Request] = []
        self.written = 0  # bytes the script wrote
        self.closed = asyncio.Event()  # the script is done and the connection closed

    async def read_request(self) -> Request | None:
        """The next request on this connection, or None if the client closed it. Bodies are
        framed by Content-Length (what the transports under test send)."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError as e:
            raise AssertionError("a request head larger than 64 KiB") from e
        except PEER_GONE:
            return None
        request = Request(head, b"", self.index)
        length = int(request.header("content-length") or 0)
        try:
            request.body = await self.reader.readexactly(length)
        except PEER_GONE:
            return None
        self.requests.append(request)
        self.server.requests.append(request)
        return request

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self.writer.write(data)

    async def send(self, data: bytes) -> None:
        """Write ``data`` and wait until the socket took it (TCP pushes back on a client that
        does not read)."""
        self.write(data)
        await self.writer.drain()

    async def dribble(self, data: bytes, every_s: float, size: int = 1) -> None:
        """``data`` in pieces of ``size`` bytes, one every ``every_s`` seconds."""
        for i in range(0, len(data), size):
            await self.send(data[i : i + size])
            await asyncio.sleep(every_s)

    async def flood(self, piece: bytes, limit: int) -> int:
        """Write ``piece`` again and again until the client stops reading and goes away, or
        ``limit`` bytes went out; how many bytes went out."""
        sent = 0
        with contextlib.suppress(*PEER_GONE):
            while sent < limit:
                await self.send(piece)
                sent += len(piece)
        return sent

    async def until_client_closes(self, timeout_s: float) -> bool:
        """Whether the client closed the connection within ``timeout_s`` (what it sends
        meanwhile is read and dropped)."""
        try:
            async with asyncio.timeout(timeout_s):
                while await self.reader.read(1 << 16):
                    pass
        except TimeoutError:
            return False
        except PEER_GONE:
            pass
        return True

    def reset(self) -> None:
        """Close with an RST instead of a FIN: SO_LINGER with a zero timeout, then close."""
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


Script = Callable[[Connection], Awaitable[None]]


class HostileUpstream:
    """The server: ``async with HostileUpstream(script) as upstream`` (``upstream.url``)."""

    def __init__(self, script: Script, *, tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.tls = tls
        self.url = ""
        self.port = 0
        self.connections: list[Connection] = []
        self.requests: list[Request] = []  # every request read, on any connection, in order
        self.errors: list[BaseException] = []  # what scripts raised, other than the peer gone
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # the scripts running
        self._handlers: set[asyncio.Task[Any]] = set()  # asyncio's tasks, one per connection

    def requests_on(self, index: int) -> int:
        """How many requests connection ``index`` carried."""
        return len(self.connections[index].requests)

    async def __aenter__(self) -> HostileUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        host = "localhost" if self.tls else "127.0.0.1"
        self.url = f"{'https' if self.tls else 'http'}://{host}:{self.port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        if self.errors and exc[0] is None:
            raise AssertionError(f"the upstream's script failed: {self.errors!r}") from (
                self.errors[0]
            )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in self.connections:
            conn.writer.transport.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        conn = Connection(self, len(self.connections), reader, writer)
        self.connections.append(conn)
        # The script runs as a task of its own, which stop() cancels: asyncio's server logs a
        # cancelled connection handler as an error.
        task = asyncio.create_task(self._run(conn))
        self._tasks.add(task)
        try:
            await asyncio.wait([task])
        finally:
            self._tasks.discard(task)
            self._handlers.discard(handler)
            writer.transport.close()
            conn.closed.set()

    async def _run(self, conn: Connection) -> None:
        try:
            await self.script(conn)
        except PEER_GONE:
            pass
        except Exception as e:
            self.errors.append(e)


@contextlib.contextmanager
def in_thread(upstream: HostileUpstream) -> Iterator[HostileUpstream]:
    """Run ``upstream`` on an event loop of its own in a thread, for synchronous tests."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="hostile-upstream", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(upstream.__aenter__(), loop).result(10)
        try:
            yield upstream
        finally:
            asyncio.run_coroutine_threadsafe(upstream.stop(), loop).result(10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
    if upstream.errors:
        raise AssertionError(f"the upstream's script failed: {upstream.errors!r}")


# -- what an upstream writes -----------------------------------------------------------------------


def head(*headers: str, status: str = "200 OK") -> bytes:
    """A status line and headers, with the blank line that ends them."""
    return ("\r\n".join([f"HTTP/1.1 {status}", *headers]) + "\r\n\r\n").encode("latin-1")


def response(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    """A whole reply framed by Content-Length."""
    return head(f"content-length: {len(body)}", *headers, status=status) + body


def chunk(data: bytes) -> bytes:
    """One piece of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n"


def answer(rid: str | None) -> bytes:
    """The body of a reply that names the request it answers."""
    return f"reply to rid={rid}".encode()


def completion(rid: str | None, *, prompt: int = 5, output: int = 7) -> bytes:
    """An OpenAI chat completion that names the request it answers, with its usage."""
    return json.dumps({
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion",
        "created": 1718000000,
        "model": "hostile",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": f"reply to rid={rid}"},
            "finish_reason": "stop",
        }],
        "usage": {"prompt_tokens": prompt, "completion_tokens": output,
                  "total_tokens": prompt + output},
    }).encode()  # fmt: skip


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return f"data: {text}\n\n".encode()


def delta(text: str, finish: str | None = None) -> bytes:
    """One streamed chat completion chunk."""
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    return sse({
        "id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1718000000,
        "model": "hostile", "choices": [choice],
    })  # fmt: skip


def stream_end(*, prompt: int, output: int) -> bytes:
    """The finish, the usage report and [DONE] of a streamed chat completion."""
    usage = {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}
    report = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1718000000,
              "model": "hostile", "choices": [], "usage": usage}  # fmt: skip
    return delta("", "stop") + sse(report) + sse("[DONE]")


SSE_HEAD = head("content-type: text/event-stream", "transfer-encoding: chunked")


def gzip_bomb(inflated: int = 512 << 20, block: int = 4 << 20) -> bytes:
    """A gzip body of about 1/1000 of ``inflated`` bytes of zeros (510 KiB for 512 MiB).

    Built from identical deflate blocks, each ended by a full flush (byte-aligned, the window
    reset), so it takes a fraction of a second instead of compressing it all."""
    zeros = bytes(block)
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    middle = z.compress(zeros) + z.flush(zlib.Z_FULL_FLUSH)
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    last = z.compress(zeros) + z.flush(zlib.Z_FINISH)
    count = inflated // block
    crc = 0
    for _ in range(count):
        crc = zlib.crc32(zeros, crc)
    gzip_header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = struct.pack("<II", crc, inflated & 0xFFFFFFFF)
    return gzip_header + middle * (count - 1) + last + trailer


# -- scripts many tests share ----------------------------------------------------------------------


def keep_answering(
    reply: Callable[[Request], bytes] = lambda r: response(answer(r.rid)),
) -> Script:
    """Answer every request on a connection with ``reply(request)``, as long as it stays open."""

    async def script(conn: Connection) -> None:
        while (request := await conn.read_request()) is not None:
            await conn.send(reply(request))

    return script


def per_connection(*scripts: Script, then: Script | None = None) -> Script:
    """The first connection runs ``scripts[0]``, the second ``scripts[1]``, ...; later ones
    ``then`` (default: answer every request with its id)."""
    rest = then or keep_answering()

    async def script(conn: Connection) -> None:
        await (scripts[conn.index] if conn.index < len(scripts) else rest)(conn)

    return script


# -- a forward proxy -------------------------------------------------------------------------------


@dataclass
class ForwardProxy:
    """An HTTP forward proxy: ``CONNECT host:port`` tunnels (HTTPS) and absolute-form requests
    (plain HTTP), each relayed to its target. It counts what it relayed."""

    tunnels: list[str] = field(default_factory=list)  # CONNECT targets, one per tunnel
    forwarded: list[str] = field(default_factory=list)  # absolute URLs of requests relayed
    url: str = ""
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    @property
    def relayed(self) -> int:
        return len(self.tunnels) + len(self.forwarded)

    async def __aenter__(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        # With every connection aborted the relays end by themselves (asyncio's server logs a
        # cancelled connection handler as an error): cancelled only if they do not.
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=2)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            first = await reader.readuntil(b"\r\n\r\n")
            method, target, _ = first.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
                up_reader, upstream = await asyncio.open_connection(host, int(port))
                self._writers.append(upstream)
                self.tunnels.append(target)
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
                await _pipe_both(reader, writer, up_reader, upstream)
                return
            parts = urlsplit(target)
            assert parts.hostname is not None, target
            up_reader, upstream = await asyncio.open_connection(parts.hostname, parts.port or 80)
            self._writers.append(upstream)
            back = asyncio.create_task(_pipe(up_reader, writer))
            try:
                request: bytes | None = first
                while request is not None:
                    await self._forward(request, reader, upstream)
                    request = await _next_head(reader)
            finally:
                back.cancel()
                await asyncio.gather(back, return_exceptions=True)
        except (*PEER_GONE, OSError):
            pass
        finally:
            if upstream is not None:
                upstream.transport.close()
            writer.transport.close()
            self._tasks.discard(task)

    async def _forward(
        self, request: bytes, reader: asyncio.StreamReader, upstream: asyncio.StreamWriter
    ) -> None:
        """One absolute-form request, rewritten to origin form and sent on with its body."""
        line, rest = request.split(b"\r\n", 1)
        method, target, version = line.decode("latin-1").split(" ", 2)
        self.forwarded.append(target)
        parts = urlsplit(target)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        length = 0
        for header in rest.split(b"\r\n"):
            name, _, value = header.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await reader.readexactly(length)
        upstream.write(f"{method} {path} {version}\r\n".encode("latin-1") + rest + body)
        await upstream.drain()


async def _next_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except PEER_GONE:
        return None


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(*PEER_GONE, OSError):
        while data := await source.read(1 << 16):
            sink.write(data)
            await sink.drain()
    sink.transport.close()


async def _pipe_both(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    upstream: asyncio.StreamWriter,
) -> None:
    await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
