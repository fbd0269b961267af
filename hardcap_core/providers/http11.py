"""The gateway's HTTP/1.1 client: pooled keep-alive connections on asyncio, responses parsed by
httptools (the C parser uvicorn already ships with).

Why not httpx or aiohttp: a bare proxy on this VM moved 340-545 req/s over httpx 0.28, 1,798
over httpx's aiohttp transport and 3,370 over aiohttp, and importing aiohttp takes ~300 ms of a
cold start; what the gateway needs is one POST at a time per connection, a status, headers and
a body read as it arrives. The measurements are in bench/results/wrk-overhead.json.

What it does: HTTP/1.1 POST over TCP or TLS (the system's CA store, SNI, hostname checked);
bodies framed by Content-Length, chunked encoding or the connection's end; gzip and deflate
content encodings decoded (a provider may compress although asked not to); a connection
reused only after its reply was read to the end and both sides allow keep-alive. A request
on a reused connection that the upstream had closed while it sat idle — the connection ends
before a single byte of reply — is sent once more on a new connection: the upstream never saw
it. What it does not do: HTTP proxies (``HTTPS_PROXY``), HTTP/2, redirects, cookies.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import zlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

from hardcap_core.providers.transport import (
    CONNECT_TIMEOUT_S,
    BadResponse,
    ConnectFailed,
    ConnectionLost,
    Reply,
    StreamReply,
    TimedOut,
    TransportError,
    UpstreamRequest,
)

MAX_IDLE_PER_ORIGIN = 100
# Reading stops (TCP pushes back on the upstream) while this much decoded body waits unread.
HIGH_WATER = 1 << 20

Origin = tuple[str, str, int]  # scheme, host, port
DEFAULTS = {
    "user-agent": b"user-agent: hardcap\r\n",
    "accept-encoding": b"accept-encoding: identity\r\n",
}


class _Connection(asyncio.Protocol):
    """One connection and the reply in flight on it; httptools calls the ``on_*`` methods."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.used = False  # a reply was read on it before: it may have gone stale while idle
        self._waiter: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.header_list: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.keep_alive = False
        self.complete = False
        self.body: list[bytes] = []
        self.buffered = 0
        self.received_any = False
        self.error: TransportError | None = None
        self.paused = False

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(BadResponse(f"invalid HTTP from the upstream: {e}"))
            return
        if self.buffered > HIGH_WATER and self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._ended()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended()

    # -- httptools callbacks ----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_list.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        # Asked now: once the message is complete the parser has reset and always says no.
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        self.complete = True

    # -- for the transport ------------------------------------------------------------------

    def _ended(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.headers_done and not self.complete and self._framed_by_close():
            # No Content-Length, not chunked: the body ends with the connection.
            self.complete = True
        elif not self.complete and self.error is None:
            self.error = ConnectionLost("the upstream closed the connection before its reply ended")
        self._wake()

    def _framed_by_close(self) -> bool:
        names = {name.lower() for name, _ in self.header_list}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def _fail(self, error: TransportError) -> None:
        self.error = error
        self.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout_s: float) -> None:
        """Until more of the reply arrived, it ended, or ``timeout_s`` passed (TimedOut)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def take(self) -> bytes:
        """The body that arrived and was not read yet."""
        pieces, self.body, self.buffered = self.body, [], 0
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def reusable(self) -> bool:
        return self.complete and not self.closed and self.keep_alive

    def recycle(self) -> None:
        self.used = True
        self._reset()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.closed = True


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimedOut("the upstream sent nothing in time"))


class _Decoder:
    """Undoes a Content-Encoding; identity passes bytes through."""

    def __init__(self, encoding: str) -> None:
        self._z: Any = None
        if encoding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._z = zlib.decompressobj()
        elif encoding not in ("", "identity"):
            raise BadResponse(f"the upstream sent a body in the {encoding!r} encoding")

    def decode(self, data: bytes) -> bytes:
        if self._z is None or not data:
            return data
        try:
            out: bytes = self._z.decompress(data)
        except zlib.error as e:
            raise BadResponse(f"the upstream's compressed body is corrupt: {e}") from e
        return out


class _Exchange:
    """A request sent on a connection, and the reply as it is read (a :class:`StreamReply`)."""

    def __init__(self, conn: _Connection, timeout_s: float) -> None:
        self.conn = conn
        self.timeout_s = timeout_s
        self.status = 0
        self.headers: Mapping[str, str] = {}
        self._decoder = _Decoder("")

    async def start(self) -> None:
        conn = self.conn
        while not conn.headers_done:
            if conn.error is not None:
                raise conn.error
            await conn.wait(self.timeout_s)
        self.status = conn.status
        self.headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in conn.header_list
        }
        self._decoder = _Decoder(self.headers.get("content-encoding", "").strip().lower())

    async def reads(self) -> AsyncIterator[bytes]:
        conn = self.conn
        while True:
            if conn.body:
                piece = self._decoder.decode(conn.take())
                if piece:
                    yield piece
                continue
            if conn.complete:
                return
            if conn.error is not None:
                raise conn.error
            await conn.wait(self.timeout_s)

    async def aread(self) -> bytes:
        return b"".join([piece async for piece in self.reads()])


class Http11Transport:
    """Pooled HTTP/1.1 connections per origin (scheme, host, port)."""

    def __init__(
        self, *, connect_timeout_s: float = CONNECT_TIMEOUT_S, tls: ssl.SSLContext | None = None
    ) -> None:
        """``tls``: the context HTTPS connections are checked with (default: certifi's CAs,
        or the system's)."""
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[Origin, list[_Connection]] = {}
        self._targets: dict[str, tuple[Origin, bytes]] = {}
        self._tls = tls

    async def send(self, request: UpstreamRequest) -> Reply:
        async with self.stream(request) as reply:
            body = await reply.aread()
        return Reply(reply.status, reply.headers, body)

    @asynccontextmanager
    async def stream(self, request: UpstreamRequest) -> AsyncIterator[StreamReply]:
        exchange = await self._exchange(request)
        conn = exchange.conn
        try:
            yield exchange
        finally:
            if conn.reusable():
                self._release(conn)
            else:
                conn.close()

    async def _exchange(self, request: UpstreamRequest) -> _Exchange:
        origin, head = self._target(request.url)
        message = _message(head, origin, request)
        for _ in range(2):
            conn = await self._connection(origin)
            assert conn.transport is not None
            conn.transport.write(message)
            exchange = _Exchange(conn, request.timeout_s)
            try:
                await exchange.start()
            except ConnectionLost:
                conn.close()
                if conn.used and not conn.received_any:
                    continue  # closed while idle: the upstream never read this request
                raise
            except BaseException:
                conn.close()
                raise
            return exchange
        raise ConnectionLost("the upstream closed two connections before replying")

    def _target(self, url: str) -> tuple[Origin, bytes]:
        """The origin and request target of ``url``, parsed once per URL."""
        known = self._targets.get(url)
        if known is None:
            parts = urlsplit(url)
            scheme = parts.scheme.lower()
            if scheme not in ("http", "https") or not parts.hostname:
                raise ConnectFailed(f"not an http(s) URL: {url!r}")
            port = parts.port or (443 if scheme == "https" else 80)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            known = (scheme, parts.hostname, port), target.encode("ascii")
            if len(self._targets) < 1024:
                self._targets[url] = known
        return known

    async def _connection(self, origin: Origin) -> _Connection:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        tls = self._tls_context() if scheme == "https" else None
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(origin),
                    host,
                    port,
                    ssl=tls,
                    server_hostname=host if tls else None,
                )
        except TimeoutError as e:
            raise ConnectFailed(f"connecting to {host}:{port} timed out") from e
        except (OSError, ssl.SSLError) as e:
            raise ConnectFailed(f"could not connect to {host}:{port}: {e}") from e
        return conn

    def _release(self, conn: _Connection) -> None:
        conn.recycle()
        idle = self._idle.setdefault(conn.origin, [])
        if len(idle) < MAX_IDLE_PER_ORIGIN:
            idle.append(conn)
        else:
            conn.close()

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = default_tls()
        return self._tls

    def prepare(self) -> None:
        """Make the TLS context now (loading the CA bundle, ~30 ms) rather than at the first
        HTTPS connection: before a SnapStart snapshot, so every restored environment has it."""
        self._tls_context()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def default_tls() -> ssl.SSLContext:
    """What HTTPS upstreams are checked with: certifi's CAs, hostnames verified."""
    return ssl.create_default_context(cafile=_ca_file())


def _ca_file() -> str | None:
    """certifi's bundle where it is installed (the Lambda artifact carries it), else the
    system's store."""
    try:
        import certifi
    except ImportError:
        return None
    # The file beside the module: certifi.where() goes through importlib.resources, which
    # imports zipfile (~6 ms of a cold start) to find the same path.
    bundle = os.path.join(os.path.dirname(certifi.__file__), "cacert.pem")
    if os.path.isfile(bundle):
        return bundle
    where: str = certifi.where()
    return where


def _message(target: bytes, origin: Origin, request: UpstreamRequest) -> bytes:
    scheme, host, port = origin
    default = 443 if scheme == "https" else 80
    authority = host if port == default else f"{host}:{port}"
    lines = [b"POST ", target, b" HTTP/1.1\r\nhost: ", authority.encode("idna"), b"\r\n"]
    given = {name.lower() for name in request.headers}
    # No Accept-Encoding would let the upstream pick any coding; one it picks anyway is decoded.
    lines += [DEFAULTS[name] for name in DEFAULTS if name not in given]
    for name, value in request.headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} holds a line break")
        lines += [name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n"]
    lines += [b"content-length: ", str(len(request.body)).encode(), b"\r\n\r\n", request.body]
    return b"".join(lines)
