"""The transport the gateway ships (``make_transport()``), against a hostile upstream.

Every case runs over real sockets on 127.0.0.1: :mod:`tests.hostile_upstream` writes exactly
the bytes each case needs. The contract (``hardcap_core/providers/transport.py``): a transport
raises only ConnectFailed, TimedOut, ConnectionLost and BadResponse; it never hands one
request another request's reply, never sends a POST twice, and holds bounded memory whatever
the upstream sends. Requests name themselves (``rid=<id>`` in the body) and the upstream's
replies name the request they answer, so a test sees whose reply arrived.

What a user would notice if each failed: one tenant reading another tenant's completion (and
being billed for it); a provider billing one request twice; a gateway that runs out of memory
or hangs on one bad upstream; a stream merged with the next request's reply.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import gzip
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from hardcap_core import sse
from hardcap_core.config import parse_config
from hardcap_core.errors import TooManyRequests, UpstreamFailed, UpstreamMalformed, UpstreamTimeout
from hardcap_core.events import Event
from hardcap_core.providers.http import make_transport, open_sse, send_json
from hardcap_core.providers.openai_compat import OpenAICompatible
from hardcap_core.providers.transport import (
    MAX_HEADER_FIELD_BYTES,
    MAX_HEADER_LINE_BYTES,
    MAX_HEADERS,
    MAX_INFORMATIONAL,
    MAX_REPLY_BYTES,
    BadResponse,
    ConnectFailed,
    ConnectionLost,
    Reply,
    TimedOut,
    Transport,
    TransportError,
    UpstreamRequest,
)
from hardcap_core.wire.openai_request import parse_chat_request
from tests.hostile_upstream import (
    CONTINUE,
    EARLY_HINTS,
    LAST_CHUNK,
    SSE_HEAD,
    Connection,
    ForwardProxy,
    HostileUpstream,
    Request,
    Script,
    answer,
    chunk,
    completion,
    gzip_bomb,
    head,
    keep_answering,
    per_connection,
    response,
    rid_of,
)

REPO = Path(__file__).resolve().parents[2]
PROXY_VARIABLES = [
    name
    for base in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
    for name in (base, base.upper())
]
SETTLE_S = 0.05  # for bytes written on 127.0.0.1 to reach the client's event loop


@pytest.fixture
async def transports(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Callable[[], Transport]]:
    """Makes transports as the gateway does (each closed after the test), in an environment
    without proxies unless the test sets one before making its transport."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    made: list[Transport] = []

    def make() -> Transport:
        made.append(make_transport())
        return made[-1]

    yield make
    for transport in made:
        await transport.aclose()


@pytest.fixture
async def transport(transports: Callable[[], Transport]) -> Transport:
    return transports()


def post(
    upstream: HostileUpstream | str, rid: str, *, timeout_s: float = 5.0, path: str = "/v1/chat"
) -> UpstreamRequest:
    base = upstream if isinstance(upstream, str) else upstream.url
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": f"rid={rid}"}]})
    return UpstreamRequest(
        base + path, {"content-type": "application/json"}, body.encode(), timeout_s
    )


def whose(reply: Reply) -> str | None:
    """Whose request ``reply`` answers (the id the upstream named in it)."""
    return rid_of(reply.body)


async def read_stream(transport: Transport, request: UpstreamRequest) -> Reply:
    """A whole reply read through ``stream()``, to its end."""
    async with transport.stream(request) as reply:
        body = b"".join([piece async for piece in reply.reads()])
    return Reply(reply.status, reply.headers, body)


async def fetch(transport: Transport, request: UpstreamRequest, read: str) -> Reply:
    """A whole reply, by ``send()`` or read through ``stream()``."""
    if read == "send":
        return await transport.send(request)
    return await read_stream(transport, request)


async def drain_sse(transport: Transport, request: UpstreamRequest) -> None:
    """Open an SSE stream as a provider does and read it to its end."""
    async with open_sse(transport, request, "r", any_event) as reads:
        async for _ in reads:
            pass


def elapsed_since(started: float) -> float:
    return asyncio.get_running_loop().time() - started


def now() -> float:
    return asyncio.get_running_loop().time()


async def attempt(request: Awaitable[Reply]) -> Reply | TransportError:
    """The reply, or the transport's error."""
    try:
        return await request
    except TransportError as e:
        return e


def no_event(data: str) -> Event:
    raise AssertionError(f"no event was expected: {data[:80]!r}")


def any_event(data: str) -> Event:
    return Event()


# -- 1xx replies and statuses ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "interim",
    [[CONTINUE], [EARLY_HINTS], [CONTINUE, EARLY_HINTS, EARLY_HINTS]],
    ids=["100", "103", "100-103-103"],
)
@pytest.mark.parametrize("read", ["send", "stream"])
async def test_1xx_replies_before_the_reply_are_skipped(
    transport: Transport, interim: list[bytes], read: str
) -> None:
    """A 100 or 103 is not the answer: taking it for one gives this request an empty reply and
    the next request on the connection this one's answer."""

    async def script(conn: Connection) -> None:
        while (request := await conn.read_request()) is not None:
            await conn.send(b"".join(interim))  # as soon as it knows, the reply later
            await asyncio.sleep(0.02)
            await conn.send(response(answer(request.rid), status="201 Created"))

    async with HostileUpstream(script) as upstream:
        for i in range(3):
            request = post(upstream, f"r{i}")
            got = await fetch(transport, request, read)
            assert (got.status, whose(got)) == (201, f"r{i}")
    assert len(upstream.requests) == 3


@pytest.mark.parametrize("read", ["send", "stream"])
async def test_1xx_replies_split_across_reads_are_skipped(transport: Transport, read: str) -> None:
    async def script(conn: Connection) -> None:
        request = await conn.read_request()
        assert request is not None
        for piece in (CONTINUE[:10], CONTINUE[10:] + EARLY_HINTS[:20], EARLY_HINTS[20:]):
            await conn.send(piece)
            await asyncio.sleep(0.02)
        await conn.send(response(answer(request.rid)))

    async with HostileUpstream(script) as upstream:
        request = post(upstream, "split")
        got = await fetch(transport, request, read)
    assert (got.status, whose(got)) == (200, "split")


@pytest.mark.parametrize("read", ["send", "stream"])
async def test_a_101_is_a_bad_response(transport: Transport, read: str) -> None:
    upgrade = head("upgrade: websocket", "connection: upgrade", status="101 Switching Protocols")
    async with HostileUpstream(keep_answering(lambda r: upgrade + b"reply to rid=x")) as upstream:
        with pytest.raises(BadResponse):
            await fetch(transport, post(upstream, "a"), read)


@pytest.mark.parametrize("status", ["999 Nine", "600 Six", "099 Low"])
@pytest.mark.parametrize("read", ["send", "stream"])
async def test_a_status_outside_100_to_599_is_a_bad_response(
    transport: Transport, status: str, read: str
) -> None:
    async with HostileUpstream(keep_answering(lambda r: response(b"{}", status=status))) as up:
        with pytest.raises(BadResponse):
            await fetch(transport, post(up, "a"), read)


@pytest.mark.parametrize("status", [299, 499, 599])
@pytest.mark.parametrize("read", ["send", "stream"])
async def test_an_unknown_status_in_range_is_a_reply_with_that_status(
    transport: Transport, status: int, read: str
) -> None:
    script = keep_answering(lambda r: response(answer(r.rid), status=f"{status} Unheard Of"))
    async with HostileUpstream(script) as upstream:
        request = post(upstream, "a")
        got = await fetch(transport, request, read)
    assert (got.status, whose(got)) == (status, "a")


# -- a reply is given only to the request it answers -----------------------------------------------

STRAYS = {
    # A whole reply that names another request: the next request on the connection would get it.
    "a-whole-reply": response(answer("stray")),
    "a-reply-cut-short": head("content-length: 100") + b"reply to rid=stray",
    "garbage": b"\x00\x01 not http at all \r\n\r\n",
}
# Not a stray: RFC 9112 (2.2) lets a client ignore empty lines before a status line, so a
# connection with a blank line after a reply may be reused; what matters is that no request
# gets a reply that is not its own (test_a_blank_line_after_a_reply_is_harmless).


@pytest.mark.parametrize("stray", list(STRAYS))
@pytest.mark.parametrize("when", ["same-write", "a-moment-later"])
async def test_bytes_after_a_complete_reply_never_reach_the_next_request(
    transport: Transport, stray: str, when: str
) -> None:
    """Any byte after a complete reply means the connection is never reused: the next request
    to the origin goes out on another and gets its own reply."""
    wrote = asyncio.Event()

    async def first(conn: Connection) -> None:
        request = await conn.read_request()
        assert request is not None
        if when == "same-write":
            await conn.send(response(answer(request.rid)) + STRAYS[stray])
        else:
            await conn.send(response(answer(request.rid)))
            await asyncio.sleep(0.05)
            await conn.send(STRAYS[stray])
        wrote.set()
        await keep_answering()(conn)  # a reused connection would hand out the stray bytes

    async with HostileUpstream(per_connection(first)) as upstream:
        got = await attempt(transport.send(post(upstream, "a")))
        # Its own reply; or refused, when what follows it came in the same read and is not HTTP.
        assert outcome(got) in ("a", "BadResponse")
        await wrote.wait()
        await asyncio.sleep(SETTLE_S)
        for rid in ("b", "c"):
            assert whose(await transport.send(post(upstream, rid))) == rid
    assert upstream.requests_on(0) == 1


async def test_a_blank_line_after_a_reply_is_harmless(transport: Transport) -> None:
    """A CRLF after a complete reply may let the connection be reused (it carries no reply);
    every request still gets its own."""

    async def first(conn: Connection) -> None:
        request = await conn.read_request()
        assert request is not None
        await conn.send(response(answer(request.rid)) + b"\r\n")
        await keep_answering()(conn)

    async with HostileUpstream(per_connection(first)) as upstream:
        for rid in ("a", "b", "c"):
            assert whose(await transport.send(post(upstream, rid))) == rid


@pytest.mark.parametrize("stray", ["a-whole-reply", "garbage"])
async def test_unsolicited_bytes_on_an_idle_pooled_connection_never_reach_the_next_request(
    transport: Transport, stray: str
) -> None:
    """The connection sat in the pool, its reply read to the end; then the upstream wrote."""
    idle = asyncio.Event()
    wrote = asyncio.Event()

    async def first(conn: Connection) -> None:
        request = await conn.read_request()
        assert request is not None
        await conn.send(response(answer(request.rid)))
        await idle.wait()
        await conn.send(STRAYS[stray])
        wrote.set()
        await keep_answering()(conn)

    async with HostileUpstream(per_connection(first)) as upstream:
        assert whose(await transport.send(post(upstream, "a"))) == "a"
        await asyncio.sleep(SETTLE_S)  # pooled and idle
        idle.set()
        await wrote.wait()
        await asyncio.sleep(SETTLE_S)
        for rid in ("b", "c"):
            assert whose(await transport.send(post(upstream, rid))) == rid
    assert upstream.requests_on(0) == 1


async def test_a_reply_written_before_the_request_never_reaches_a_later_request(
    transport: Transport,
) -> None:
    """The upstream answers on accept, before reading anything, then answers each request it
    reads. The first request cannot tell that answer from its own; no later request may get
    the first one's reply, or anyone's but its own."""
    answered = asyncio.Event()

    async def early(conn: Connection) -> None:
        await conn.send(response(answer("ghost")))
        request = await conn.read_request()
        assert request is not None
        await conn.send(response(answer(request.rid)))
        answered.set()
        await keep_answering()(conn)

    async with HostileUpstream(per_connection(early)) as upstream:
        first = await transport.send(post(upstream, "a"))
        assert whose(first) in ("ghost", "a")
        await answered.wait()
        await asyncio.sleep(SETTLE_S)
        for i in range(5):
            assert whose(await transport.send(post(upstream, f"b{i}"))) == f"b{i}"


async def test_a_stream_left_early_with_megabytes_unread_closes_its_connection(
    transport: Transport,
) -> None:
    """The caller leaves a stream after its first read while the upstream has more than 4 MiB
    queued: the connection is closed (the provider stops), and the next request to the origin
    gets its own reply promptly, not a timeout or the rest of the stream."""
    flooded: list[int] = []

    async def endless(conn: Connection) -> None:
        request = await conn.read_request()
        assert request is not None
        await conn.send(SSE_HEAD)
        flooded.append(await conn.flood(chunk(b"x" * 65536), 256 << 20))

    async with HostileUpstream(per_connection(endless)) as upstream:
        async with transport.stream(post(upstream, "a")) as reply:
            async with aclosing(reply.reads()) as reads:
                assert await anext(reads)
            await asyncio.sleep(0.2)  # the upstream fills every buffer on the way
        started = now()
        got = await transport.send(post(upstream, "b", timeout_s=3.0))
        assert whose(got) == "b"
        assert elapsed_since(started) < 3.0
        await asyncio.wait_for(upstream.connections[0].closed.wait(), 5)
    assert upstream.requests_on(0) == 1
    assert flooded and flooded[0] < 64 << 20  # the upstream stopped when the connection closed


@pytest.mark.parametrize(
    "size", [300 << 10, (1 << 20) + 1024, 5 << 20], ids=["300K", "1M+1K", "5M"]
)
@pytest.mark.parametrize("reads", [0, 1])
async def test_a_stream_left_with_its_whole_reply_unread_leaves_no_stalled_connection(
    transport: Transport, size: int, reads: int
) -> None:
    """The upstream wrote a whole reply at once and the caller left the stream after ``reads``
    reads, with most of it unread (the transport may have paused reading): the next request
    to the origin gets its own reply promptly, not a connection that reads nothing."""

    async def whole_reply_then_answer(conn: Connection) -> None:
        request = await conn.read_request()
        assert request is not None
        conn.write(response(b"x" * size))  # not drained: the client may stop reading
        await keep_answering()(conn)

    async with HostileUpstream(per_connection(whole_reply_then_answer)) as upstream:
        async with (
            transport.stream(post(upstream, "a")) as reply,
            aclosing(reply.reads()) as pieces,
        ):
            for _ in range(reads):
                assert await anext(pieces)
            await asyncio.sleep(0.2)  # all of it on its way, or in the client's buffers
        for rid in ("b", "c"):
            started = now()
            got = await attempt(transport.send(post(upstream, rid, timeout_s=3.0)))
            assert outcome(got) == rid
            assert elapsed_since(started) < 3.0


async def test_a_stream_read_to_its_end_reuses_its_connection(transport: Transport) -> None:
    step = asyncio.Event()

    async def script(conn: Connection) -> None:
        while (request := await conn.read_request()) is not None:
            await conn.send(head("transfer-encoding: chunked") + chunk(b"first"))
            await step.wait()  # the second piece is sent only once the first was read
            await conn.send(chunk(f"second {request.rid}".encode()) + LAST_CHUNK)

    async with HostileUpstream(script) as upstream:
        async with transport.stream(post(upstream, "a")) as reply:
            pieces = []
            async for piece in reply.reads():
                pieces.append(piece)
                step.set()
        assert pieces == [b"first", b"second a"]
        assert reply.status == 200
        assert (await transport.send(post(upstream, "b"))).body == b"firstsecond b"
    assert len(upstream.connections) == 1
    assert upstream.requests_on(0) == 2


Answerer = Callable[[Connection, Request, int], Awaitable[None]]


async def plain(conn: Connection, r: Request, n: int) -> None:
    await conn.send(response(answer(r.rid)))


async def late(conn: Connection, r: Request, n: int) -> None:
    await asyncio.sleep(0.001 * (n % 13))
    await conn.send(response(answer(r.rid)))


async def hints_first(conn: Connection, r: Request, n: int) -> None:
    await conn.send(CONTINUE + EARLY_HINTS)
    await asyncio.sleep(0.002)
    await conn.send(response(answer(r.rid)))


async def in_pieces(conn: Connection, r: Request, n: int) -> None:
    await conn.dribble(response(answer(r.rid)), 0.001, size=17)


async def then_close(conn: Connection, r: Request, n: int) -> None:
    await conn.send(response(answer(r.rid), "connection: close"))
    conn.writer.close()


async def a_stray_reply_after(conn: Connection, r: Request, n: int) -> None:
    await conn.send(response(answer(r.rid)) + response(answer(f"stray{n}")))


async def garbage_after(conn: Connection, r: Request, n: int) -> None:
    body = head("transfer-encoding: chunked") + chunk(answer(r.rid)) + LAST_CHUNK
    await conn.send(body + chunk(b"reply to rid=stray") + LAST_CHUNK)


# Ways a misbehaving upstream answers; the last two follow the reply with bytes nobody asked
# for, in the same write: that request may be refused, but the bytes must reach no one.
WAYS: list[Answerer] = [plain, late, hints_first, in_pieces, then_close, a_stray_reply_after,
                        garbage_after]  # fmt: skip
TRAILED = {a_stray_reply_after, garbage_after}


def outcome(got: Reply | TransportError | BaseException) -> str | None:
    """Whose reply arrived, or the name of the error instead."""
    return whose(got) if isinstance(got, Reply) else type(got).__name__


async def test_two_tenants_on_one_origin_each_get_exactly_their_own_reply(
    transport: Transport,
) -> None:
    """Two tenants' requests at once, over and over, on one pooled origin whose upstream
    answers out of the ordinary (late, with 1xx first, in pieces, closing, with stray replies
    and garbage after): each gets exactly its own reply, and only a request whose own reply
    was followed by stray bytes may be refused instead."""
    count = 0
    way: dict[str | None, Answerer] = {}

    async def script(conn: Connection) -> None:
        nonlocal count
        while (request := await conn.read_request()) is not None:
            count += 1
            way[request.rid] = WAYS[count % len(WAYS)]
            await way[request.rid](conn, request, count)
            if conn.writer.is_closing():
                return

    async with HostileUpstream(script) as upstream:
        for round_ in range(60):
            rids = [f"alpha-{round_}", f"beta-{round_}"]
            got = await asyncio.gather(
                transport.send(post(upstream, rids[0])),
                read_stream(transport, post(upstream, rids[1])),
                return_exceptions=True,
            )
            for rid, result in zip(rids, got, strict=True):
                allowed = {rid, "BadResponse"} if way.get(rid) in TRAILED else {rid}
                assert outcome(result) in allowed, (rid, way.get(rid), result)
    assert len(upstream.requests) == 120  # each request reached the upstream exactly once


# -- response headers are bounded ------------------------------------------------------------------


def big_headers(kind: str) -> bytes:
    if kind == "status-line":
        return head(status="200 " + "x" * (MAX_HEADER_LINE_BYTES + 10))
    if kind == "header-value":
        return head("x-big: " + "v" * (MAX_HEADER_FIELD_BYTES + 10))
    if kind == "header-name":
        return head("x-" + "n" * (MAX_HEADER_FIELD_BYTES + 10) + ": v")
    assert kind == "too-many"
    return head(*[f"x-h{i}: v" for i in range(MAX_HEADERS + 1)])


@pytest.mark.parametrize("kind", ["status-line", "header-value", "header-name", "too-many"])
@pytest.mark.parametrize("read", ["send", "stream"])
async def test_response_headers_past_the_limits_are_a_bad_response(
    transport: Transport, kind: str, read: str
) -> None:
    raw = big_headers(kind)
    script = keep_answering(lambda r: raw[:-4] + b"\r\ncontent-length: 2\r\n\r\n{}")
    async with HostileUpstream(script) as upstream:
        with pytest.raises(BadResponse):
            await fetch(transport, post(upstream, "a"), read)


async def test_response_headers_within_the_limits_are_read(transport: Transport) -> None:
    headers = [f"x-h{i}: {i}" for i in range(MAX_HEADERS - 10)]
    long = min(MAX_HEADER_LINE_BYTES, MAX_HEADER_FIELD_BYTES) // 2
    headers.append("x-long: " + "v" * long)
    script = keep_answering(lambda r: response(answer(r.rid), *headers, status="200 " + "o" * 2000))
    async with HostileUpstream(script) as upstream:
        got = await transport.send(post(upstream, "a"))
    assert whose(got) == "a"
    assert got.headers["x-h7"] == "7"
    assert len(got.headers["x-long"]) == long


ENDLESS_HEAD_LIMIT = 32 << 20  # what the upstream would send at most


def endless_head(kind: str) -> Script:
    async def script(conn: Connection) -> None:
        assert await conn.read_request() is not None
        if kind == "status-line":
            await conn.send(b"HTTP/1.1 200 ")
            await conn.flood(b"o" * 65536, ENDLESS_HEAD_LIMIT)
        elif kind == "header-line":
            await conn.send(b"HTTP/1.1 200 OK\r\nx-endless: ")
            await conn.flood(b"v" * 65536, ENDLESS_HEAD_LIMIT)
        else:
            await conn.send(b"HTTP/1.1 200 OK\r\n")
            lines = b"".join(f"x-h{i}: {'v' * 1000}\r\n".encode() for i in range(64))
            await conn.flood(lines, ENDLESS_HEAD_LIMIT)

    return script


@pytest.mark.parametrize("kind", ["status-line", "header-line", "header-lines"])
@pytest.mark.parametrize("read", ["send", "stream"])
async def test_endless_headers_are_a_bad_response_before_much_is_read(
    transport: Transport, kind: str, read: str
) -> None:
    """Refused at the limit, not when the upstream stops: the client stops reading and closes,
    so the upstream gets no further than the sockets' buffers hold."""
    async with HostileUpstream(endless_head(kind)) as upstream:
        with pytest.raises(BadResponse):
            await fetch(transport, post(upstream, "a", timeout_s=30), read)
        await asyncio.wait_for(upstream.connections[0].closed.wait(), 5)
    assert upstream.connections[0].written < 16 << 20


# -- bodies are bounded ----------------------------------------------------------------------------


async def test_an_endless_chunked_body_is_refused_by_send(transport: Transport) -> None:
    """A whole reply holds at most MAX_REPLY_BYTES: an endless body is a BadResponse (or, at
    the deadline, TimedOut), and the upstream is cut off near that size."""

    async def endless(conn: Connection) -> None:
        assert await conn.read_request() is not None
        await conn.send(head("transfer-encoding: chunked"))
        await conn.flood(chunk(b"x" * 65536), 3 * MAX_REPLY_BYTES)

    async with HostileUpstream(endless) as upstream:
        with pytest.raises((BadResponse, TimedOut)):
            await transport.send(post(upstream, "a", timeout_s=20))
        await asyncio.wait_for(upstream.connections[0].closed.wait(), 5)
    assert upstream.connections[0].written < MAX_REPLY_BYTES + (16 << 20)


async def test_an_endless_chunked_stream_keeps_coming_and_leaving_closes_it(
    transport: Transport,
) -> None:
    async def endless(conn: Connection) -> None:
        assert await conn.read_request() is not None
        await conn.send(SSE_HEAD)
        await conn.flood(chunk(b"data: x\n\n" * 1000), 1 << 30)

    async with HostileUpstream(per_connection(endless)) as upstream:
        received = 0
        async with (
            transport.stream(post(upstream, "a")) as reply,
            aclosing(reply.reads()) as reads,
        ):
            for _ in range(200):
                piece = await anext(reads)
                assert 0 < len(piece) <= 4 << 20
                received += len(piece)
        assert received >= 200
        assert await upstream.connections[0].until_client_closes(5)
        assert whose(await transport.send(post(upstream, "b"))) == "b"
    assert upstream.requests_on(0) == 1


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return gzip_bomb()


def bomb_script(bomb: bytes, *, framing: str) -> Script:
    async def script(conn: Connection) -> None:
        assert await conn.read_request() is not None
        if framing == "content-length":
            await conn.send(response(bomb, "content-encoding: gzip", "content-type: text/plain"))
        else:
            await conn.send(head("content-encoding: gzip", "transfer-encoding: chunked"))
            for i in range(0, len(bomb), 8192):
                await conn.send(chunk(bomb[i : i + 8192]))
            await conn.send(LAST_CHUNK)
        await conn.until_client_closes(10)

    return script


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_decompression_bomb_is_refused_by_send(
    transport: Transport, bomb: bytes, framing: str
) -> None:
    """510 KiB of gzip that inflates to 512 MiB: refused once past MAX_REPLY_BYTES."""
    assert len(bomb) < 600 << 10
    async with HostileUpstream(bomb_script(bomb, framing=framing)) as upstream:
        with pytest.raises(BadResponse):
            await transport.send(post(upstream, "a", timeout_s=20))


async def test_a_decompression_bomb_streams_in_bounded_reads(
    transport: Transport, bomb: bytes
) -> None:
    async with HostileUpstream(bomb_script(bomb, framing="chunked")) as upstream:
        received = 0
        async with (
            transport.stream(post(upstream, "a", timeout_s=20)) as reply,
            aclosing(reply.reads()) as reads,
        ):
            async for piece in reads:
                assert len(piece) <= 4 << 20
                received += len(piece)
                if received > 64 << 20:
                    break
        assert received > 64 << 20


BOMB_CHILD = """
import asyncio, json, resource, sys
from contextlib import aclosing
from hardcap_core.providers.http import make_transport
from hardcap_core.providers.transport import TransportError, UpstreamRequest
from tests.hostile_upstream import (
    HostileUpstream, LAST_CHUNK, chunk, gzip_bomb, head, keep_answering, response)

def rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

async def main() -> None:
    bomb = gzip_bomb()
    async def serve(conn):
        while (request := await conn.read_request()) is not None:
            if b"warm" in request.body:
                await conn.send(response(b"ok"))
                continue
            await conn.send(head("content-encoding: gzip", "transfer-encoding: chunked"))
            for i in range(0, len(bomb), 8192):
                await conn.send(chunk(bomb[i : i + 8192]))
            await conn.send(LAST_CHUNK)
    transport = make_transport()
    out = {}
    async with HostileUpstream(serve) as up:
        def post(rid):
            return UpstreamRequest(up.url + "/v1", {}, rid.encode(), 20.0)
        await transport.send(post("warm"))
        before = rss()
        try:
            reply = await transport.send(post("bomb"))
            out["send"] = len(reply.body)
        except TransportError as e:
            out["send"] = type(e).__name__
        received = 0
        async with transport.stream(post("bomb")) as reply:
            async with aclosing(reply.reads()) as reads:
                async for piece in reads:
                    received += len(piece)
                    if received > 256 << 20:
                        break
        out["streamed"] = received
        out["growth"] = rss() - before
    await transport.aclose()
    print(json.dumps(out))

asyncio.run(main())
"""


def test_a_decompression_bomb_keeps_memory_bounded() -> None:
    """Peak memory of a fresh process (ru_maxrss counts zlib's and the parser's own buffers,
    which tracemalloc does not see) while send refuses the bomb and a stream reads 256 MiB of
    it: it grows by less than 100 MiB."""
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARIABLES}
    done = subprocess.run(
        [sys.executable, "-c", BOMB_CHILD],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["send"] == "BadResponse"
    assert out["streamed"] > 256 << 20
    assert out["growth"] < 100 << 20, f"peak memory grew by {out['growth'] >> 20} MiB"


async def test_an_sse_line_with_no_end_is_an_upstream_error_on_the_provider_path(
    transport: Transport,
) -> None:
    """Through open_sse, as a provider reads a stream: an error the client can be given, with
    the line refused at the SSE cap rather than held until memory runs out."""

    async def endless_line(conn: Connection) -> None:
        assert await conn.read_request() is not None
        await conn.send(SSE_HEAD + chunk(b"data: {}\n\n" * 3) + chunk(b"data: "))
        await conn.flood(chunk(b"x" * 65536), 64 << 20)

    async with HostileUpstream(endless_line) as upstream:
        with pytest.raises(UpstreamMalformed):
            await drain_sse(transport, post(upstream, "a"))
        await asyncio.wait_for(upstream.connections[0].closed.wait(), 5)
    assert upstream.connections[0].written < sse.MAX_EVENT_BYTES + (16 << 20)


# -- timeouts --------------------------------------------------------------------------------------


def stall_after(raw: bytes) -> Script:
    async def script(conn: Connection) -> None:
        assert await conn.read_request() is not None
        await conn.send(raw)
        await conn.until_client_closes(30)

    return script


@pytest.mark.parametrize(
    "raw",
    [b"", head("content-length: 100") + b"partial", head("transfer-encoding: chunked")],
    ids=["before-the-head", "mid-body", "chunked-mid-body"],
)
async def test_a_stalled_reply_times_out_at_the_requests_timeout(
    transport: Transport, raw: bytes
) -> None:
    async with HostileUpstream(stall_after(raw)) as upstream:
        started = now()
        with pytest.raises(TimedOut):
            await transport.send(post(upstream, "a", timeout_s=0.5))
        assert 0.45 <= elapsed_since(started) < 0.5 + 1.5
        # For a client: 504 if nothing came; once a 200 began, the reply was generated (and is
        # billed): 502, charged (docs/design.md, "what each hostile reply gets").
        began = UpstreamMalformed if raw else UpstreamTimeout
        with pytest.raises(began):
            await send_json(transport, post(upstream, "a", timeout_s=0.3), "r")


async def test_a_stream_that_stalls_mid_body_times_out_at_the_requests_timeout(
    transport: Transport,
) -> None:
    stalled = head("transfer-encoding: chunked") + chunk(b"hi")
    async with (
        HostileUpstream(stall_after(stalled)) as upstream,
        transport.stream(post(upstream, "a", timeout_s=0.5)) as reply,
        aclosing(reply.reads()) as reads,
    ):
        assert await anext(reads) == b"hi"
        started = now()
        with pytest.raises(TimedOut):
            await anext(reads)
        assert 0.45 <= elapsed_since(started) < 0.5 + 1.5


@pytest.mark.parametrize("part", ["body", "whole-reply"])
async def test_a_whole_reply_dribbled_slowly_times_out_at_its_deadline(
    transport: Transport, part: str
) -> None:
    """One byte every 0.2 s never lets a per-read timeout fire; timeout_s is the deadline of
    the whole reply, so send() gives up at about timeout_s, not when the dribble ends."""
    body = b"x" * 200  # 40 s at this pace

    async def dribbling(conn: Connection) -> None:
        assert await conn.read_request() is not None
        if part == "body":
            await conn.send(head(f"content-length: {len(body)}"))
            await conn.dribble(body, 0.2)
        else:
            await conn.dribble(response(body), 0.2)

    async with HostileUpstream(dribbling) as upstream:
        started = now()
        with pytest.raises(TimedOut):
            await transport.send(post(upstream, "a", timeout_s=1.0))
        assert 0.95 <= elapsed_since(started) < 1.0 + 1.5


# -- connections that break ------------------------------------------------------------------------


def break_mid_body(raw: bytes, *, reset: bool) -> Script:
    async def script(conn: Connection) -> None:
        assert await conn.read_request() is not None
        await conn.send(raw)
        await asyncio.sleep(0.05)
        if reset:
            conn.reset()
        else:
            conn.writer.close()

    return script


MID_BODY = {
    "content-length": head("content-length: 100") + b"only this",
    "chunked": head("transfer-encoding: chunked") + chunk(b"only this"),
    "chunked-mid-chunk": head("transfer-encoding: chunked") + b"64\r\nonly this",
    "gzip": head("content-encoding: gzip", "transfer-encoding: chunked")
    + chunk(gzip.compress(b"x" * 1000)[:50]),
}


@pytest.mark.parametrize("body", list(MID_BODY))
@pytest.mark.parametrize("ending", ["reset", "eof"])
async def test_a_reply_cut_mid_body_is_connection_lost_not_a_short_body(
    transport: Transport, body: str, ending: str
) -> None:
    script = break_mid_body(MID_BODY[body], reset=ending == "reset")
    async with HostileUpstream(script) as upstream:
        with pytest.raises(ConnectionLost):
            await transport.send(post(upstream, "a"))
        with pytest.raises(UpstreamFailed):
            await send_json(transport, post(upstream, "b"), "r")


@pytest.mark.parametrize("ending", ["reset", "eof"])
async def test_a_stream_cut_mid_body_is_connection_lost(transport: Transport, ending: str) -> None:
    raw = SSE_HEAD + chunk(b"data: {}\n\n")
    async with (
        HostileUpstream(break_mid_body(raw, reset=ending == "reset")) as upstream,
        transport.stream(post(upstream, "a")) as reply,
        aclosing(reply.reads()) as reads,
    ):
        assert await anext(reads) == b"data: {}\n\n"
        with pytest.raises(ConnectionLost):
            await anext(reads)


@pytest.mark.parametrize("ending", ["close", "reset"])
async def test_a_post_the_upstream_read_and_dropped_is_not_sent_again(
    transport: Transport, ending: str
) -> None:
    """The upstream read the request and closed without a byte of reply: it may have started
    (and billed) it, so the request reaches it exactly once; ConnectionLost."""

    async def drop(conn: Connection) -> None:
        assert await conn.read_request() is not None
        await asyncio.sleep(0.02)
        if ending == "reset":
            conn.reset()

    async with HostileUpstream(drop) as upstream:
        with pytest.raises(ConnectionLost):
            await transport.send(post(upstream, "a"))
        assert len(upstream.requests) == 1
        with pytest.raises(UpstreamFailed):
            await send_json(transport, post(upstream, "b"), "r")
        assert len(upstream.requests) == 2


@pytest.mark.parametrize("read", ["send", "stream"])
async def test_a_post_read_and_dropped_on_a_pooled_connection_is_not_sent_again(
    transport: Transport, read: str
) -> None:
    """The first request is answered and its connection pooled; the second goes out on it and
    the upstream reads it and closes: no silent retry on a new connection."""

    async def answer_then_drop(conn: Connection) -> None:
        request = await conn.read_request()
        assert request is not None
        await conn.send(response(answer(request.rid)))
        assert await conn.read_request() is not None
        await asyncio.sleep(0.02)

    async with HostileUpstream(answer_then_drop) as upstream:
        assert whose(await transport.send(post(upstream, "a"))) == "a"
        with pytest.raises(ConnectionLost):
            await fetch(transport, post(upstream, "b"), read)
    assert [r.rid for r in upstream.requests] == ["a", "b"]
    assert len(upstream.connections) == 1


async def test_a_connection_the_upstream_closed_while_idle_is_replaced_not_failed(
    transport: Transport,
) -> None:
    """An upstream's keep-alive timeout closes a pooled connection; the next request goes out
    on a new one, and each request reaches the upstream exactly once."""

    async def answer_once(conn: Connection) -> None:
        request = await conn.read_request()
        assert request is not None
        await conn.send(response(answer(request.rid)))  # keep-alive, then closed anyway

    async with HostileUpstream(answer_once) as upstream:
        assert whose(await transport.send(post(upstream, "a"))) == "a"
        await asyncio.sleep(0.1)
        assert whose(await transport.send(post(upstream, "b"))) == "b"
    assert len(upstream.connections) == 2
    assert [r.rid for r in upstream.requests] == ["a", "b"]


async def test_no_listener_is_a_connect_failure(transport: Transport) -> None:
    async with HostileUpstream(keep_answering()) as upstream:
        url = upstream.url
    with pytest.raises(ConnectFailed):
        await transport.send(post(url, "a", timeout_s=1.0))
    with pytest.raises(ConnectFailed):
        await read_stream(transport, post(url, "a", timeout_s=1.0))
    with pytest.raises(UpstreamFailed):
        await send_json(transport, post(url, "a", timeout_s=1.0), "r")


async def test_an_unresolvable_host_is_a_connect_failure(transport: Transport) -> None:
    # .invalid never resolves (RFC 6761): a resolver answers at once that it does not exist.
    with pytest.raises(ConnectFailed):
        await transport.send(post("http://hardcap-upstream.invalid", "a", timeout_s=1.0))


async def test_bytes_that_are_not_http_are_a_bad_response(transport: Transport) -> None:
    async with HostileUpstream(stall_after(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")) as upstream:
        with pytest.raises(BadResponse):
            await transport.send(post(upstream, "a"))
        # No reply began: a 502 that charges nothing (UpstreamMalformed would charge the cap).
        with pytest.raises(UpstreamFailed) as refused:
            await send_json(transport, post(upstream, "a"), "r")
        assert refused.type is UpstreamFailed


# -- framing and encodings -------------------------------------------------------------------------


async def test_replies_on_one_kept_alive_connection_do_not_run_together(
    transport: Transport,
) -> None:
    async with HostileUpstream(keep_answering()) as upstream:
        bodies = [(await transport.send(post(upstream, f"r{i}"))).body for i in range(3)]
    assert bodies == [answer(f"r{i}") for i in range(3)]
    assert len(upstream.connections) == 1
    request = upstream.requests[0]
    assert request.request_line == "POST /v1/chat HTTP/1.1"
    assert request.header("host") == f"127.0.0.1:{upstream.port}"
    assert request.header("content-length") == str(len(request.body))
    assert request.header("content-type") == "application/json"
    # No Accept-Encoding would let the upstream pick any coding (a compressed SSE stream is
    # held back by the provider's compressor).
    assert request.header("accept-encoding") == "identity"
    assert rid_of(request.body) == "r0"


async def test_a_body_that_ends_with_the_connection_is_read_to_its_end(
    transport: Transport,
) -> None:
    async def until_close(conn: Connection) -> None:
        request = await conn.read_request()
        assert request is not None
        await conn.send(head("connection: close") + b"all of " + answer(request.rid))

    async with HostileUpstream(until_close) as upstream:
        assert (await transport.send(post(upstream, "a"))).body == b"all of reply to rid=a"
        assert (await read_stream(transport, post(upstream, "b"))).body == b"all of reply to rid=b"
    assert len(upstream.connections) == 2


async def test_chunk_extensions_and_trailers_are_framing_not_body(transport: Transport) -> None:
    def chunked(r: Request) -> bytes:
        return (
            head("transfer-encoding: chunked")
            + b"5;name=value\r\nreply\r\n"
            + chunk(b" to rid=" + (r.rid or "").encode())
            + b"0\r\nx-trailer: t\r\n\r\n"
        )

    async with HostileUpstream(keep_answering(chunked)) as upstream:
        assert whose(await transport.send(post(upstream, "a"))) == "a"
        assert whose(await transport.send(post(upstream, "b"))) == "b"
    assert len(upstream.connections) == 1


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
@pytest.mark.parametrize("read", ["send", "stream"])
async def test_a_compressed_reply_is_decoded(transport: Transport, coding: str, read: str) -> None:
    """Asked for identity, a provider may compress anyway: the body is decoded."""
    packed = {"gzip": gzip.compress, "deflate": zlib.compress}[coding]

    def compressed(r: Request) -> bytes:
        return response(packed(answer(r.rid) * 100), f"content-encoding: {coding}")

    async with HostileUpstream(keep_answering(compressed)) as upstream:
        request = post(upstream, "a")
        got = await fetch(transport, request, read)
    assert got.body == answer("a") * 100


@pytest.mark.parametrize(
    ("coding", "packed"),
    [
        ("x-gzip", gzip.compress(b"reply to rid=a", mtime=0)),  # gzip's old name (RFC 9110)
        ("compress", b"\x1f\x9d\x90reply"),  # LZW: nobody decodes it any more
        ("hardcap-unknown", b"\x00\x01\x02"),
    ],
    ids=["x-gzip", "compress", "unknown"],
)
@pytest.mark.parametrize("read", ["send", "stream"])
async def test_a_body_in_a_coding_the_transport_does_not_decode_is_never_passed_on_as_plain(
    transport: Transport, coding: str, packed: bytes, read: str
) -> None:
    """Decoded, or refused: never handed to the provider's parser still encoded (a compressed
    SSE stream read as text is a stream of garbage to count)."""
    encoded = response(packed, f"content-encoding: {coding}")
    async with HostileUpstream(keep_answering(lambda r: encoded)) as upstream:
        got = await attempt(fetch(transport, post(upstream, "a"), read))
    assert outcome(got) in ("a", "BadResponse")


async def test_a_corrupt_compressed_body_is_a_bad_response(transport: Transport) -> None:
    corrupt = response(b"\x1f\x8b\x08\x00" + b"\xff" * 40, "content-encoding: gzip")
    async with HostileUpstream(keep_answering(lambda r: corrupt)) as upstream:
        with pytest.raises(BadResponse):
            await transport.send(post(upstream, "a"))


async def test_an_encoding_the_gateway_cannot_decode_is_refused_not_parsed(
    transport: Transport,
) -> None:
    undecodable = response(b"\x1b\x03\x00", "content-encoding: br")
    async with HostileUpstream(keep_answering(lambda r: undecodable)) as upstream:
        with pytest.raises(UpstreamFailed, match="cannot read"):
            await send_json(transport, post(upstream, "a"), "r")


async def test_a_large_body_read_slowly_arrives_whole(transport: Transport) -> None:
    """Past its buffer the transport stops reading (TCP pushes back on the upstream) and
    resumes as the body is consumed: nothing is lost or reordered."""
    body = bytes(range(256)) * (6 * 4096)  # 6 MiB
    async with HostileUpstream(keep_answering(lambda r: response(body))) as upstream:
        got = bytearray()
        async with transport.stream(post(upstream, "a")) as reply:
            async for piece in reply.reads():
                got += piece
                await asyncio.sleep(0.001)
    assert bytes(got) == body


def completion_chunk(text: str, usage: dict[str, int] | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    data = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
    if usage is not None:
        data = {**data, "choices": [], "usage": usage}
    return sse.encode(data)


@pytest.mark.parametrize("piece", [7, 64, 100_000])
async def test_a_stream_compressed_anyway_is_decompressed_and_counted(
    transport: Transport, piece: int
) -> None:
    """A provider gzips the stream although the gateway asked for none: every delta is still
    counted, however the compressed bytes are split across reads."""
    stream = (
        completion_chunk("x" * 40)
        + completion_chunk("y" * 8)
        + completion_chunk("", {"prompt_tokens": 3, "completion_tokens": 12})
        + sse.encode(sse.DONE)
    )
    packed = gzip.compress(stream)

    async def script(conn: Connection) -> None:
        while await conn.read_request() is not None:
            await conn.send(
                head(
                    "content-type: text/event-stream",
                    "content-encoding: gzip",
                    "transfer-encoding: chunked",
                )
            )
            for i in range(0, len(packed), piece):
                await conn.send(chunk(packed[i : i + piece]))
            await conn.send(LAST_CHUNK)

    async with HostileUpstream(script) as upstream:
        config = parse_config({
            "upstreams": [{"name": "u", "base_url": upstream.url + "/v1"}],
            "routes": [{"name": "r", "upstream": "u", "model": "m"}],
            "tenants": [],
        })  # fmt: skip
        provider = OpenAICompatible(transport, chars_per_token=4.0)
        request = parse_chat_request(json.dumps(
            {"model": "r", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        ).encode())  # fmt: skip
        events: list[Event] = []
        async with provider.stream(config.routes["r"], request, 50) as reads:
            async for batch in reads:
                events += batch
    assert [e.tokens for e in events] == [10, 1, 0, 0]  # 8 characters stream as 1 token
    assert events[2].usage is not None and events[2].usage.output_tokens == 12
    assert events[-1].done


async def test_an_error_status_on_a_stream_is_the_providers_error(transport: Transport) -> None:
    slow_down = response(b'{"error": {"message": "slow down"}}', status="429 Too Many")
    async with HostileUpstream(keep_answering(lambda r: slow_down)) as upstream:
        with pytest.raises(TooManyRequests, match="slow down") as raised:
            async with open_sse(transport, post(upstream, "a"), "r", no_event):
                pass
    assert raised.value.status == 429


# -- cookies, slow heads, 1xx floods and redirects -------------------------------------------------


def on_localhost(upstream: HostileUpstream) -> str:
    """The upstream's URL by a DNS name: a cookie jar keeps no cookie of an IP address, and
    every real provider has a name."""
    return upstream.url.replace("127.0.0.1", "localhost")


@pytest.mark.parametrize("read", ["send", "stream"])
async def test_a_cookie_set_in_one_tenants_reply_never_reaches_another_tenants_request(
    transport: Transport, read: str
) -> None:
    """A ``Set-Cookie`` is a provider's (or a proxy's) to give a browser, not the gateway's
    to keep: sent with the next request it would tie one tenant's requests to another's
    (sessions, sticky routing, a load balancer's affinity)."""

    async def script(conn: Connection) -> None:
        while (request := await conn.read_request()) is not None:
            cookie = f"set-cookie: session={request.rid}; Path=/; Max-Age=3600"
            await conn.send(response(answer(request.rid), cookie))

    async with HostileUpstream(script) as upstream:
        base = on_localhost(upstream)
        for rid in ("alpha-1", "beta-1", "alpha-2", "beta-2"):
            got = await fetch(transport, post(base, rid), read)
            assert whose(got) == rid
    assert [r.header("cookie") for r in upstream.requests] == [None] * 4


def slow_head(kind: str) -> Script:
    """A head that never ends in time: a 103 every 0.1 s, or a status line a byte at a time
    (each byte restarts a per-read timeout), for 20 s, then the reply."""

    async def script(conn: Connection) -> None:
        request = await conn.read_request()
        assert request is not None
        if kind == "103-every-0.1s":
            for _ in range(200):
                await conn.send(EARLY_HINTS)
                await asyncio.sleep(0.1)
        else:
            await conn.dribble(b"HTTP/1.1 200 OK\r\nx-slow: " + b"y" * 200, 0.1)
        await conn.send(response(answer(request.rid)))

    return script


@pytest.mark.parametrize("kind", ["103-every-0.1s", "status-line-a-byte-at-a-time"])
async def test_a_streams_head_that_never_ends_times_out_at_the_head_deadline(
    transport: Transport, kind: str
) -> None:
    async with HostileUpstream(slow_head(kind)) as upstream:
        request = dataclasses.replace(post(upstream, "a", timeout_s=5.0), head_timeout_s=0.5)
        with pytest.raises(TimedOut):
            async with transport.stream(request):
                pass
        # Through the provider path: a 504, nothing began (nothing is charged).
        with pytest.raises(UpstreamTimeout):
            await drain_sse(transport, request)


async def test_a_head_within_its_deadline_is_read(transport: Transport) -> None:
    async def script(conn: Connection) -> None:
        while (request := await conn.read_request()) is not None:
            for _ in range(3):
                await conn.send(EARLY_HINTS)
                await asyncio.sleep(0.05)
            await conn.send(response(answer(request.rid)))

    async with HostileUpstream(script) as upstream:
        request = dataclasses.replace(post(upstream, "a"), head_timeout_s=2.0)
        got = await read_stream(transport, request)
    assert whose(got) == "a"


@pytest.mark.parametrize("interim", [CONTINUE, EARLY_HINTS], ids=["100", "103"])
@pytest.mark.parametrize("read", ["send", "stream"])
async def test_a_flood_of_1xx_replies_is_a_bad_response_before_much_is_read(
    transports: Callable[[], Transport], interim: bytes, read: str
) -> None:
    """Each 1xx is a parsed message aiohttp queues while the request waits: a flood of them
    held a request 15 s and grew the gateway by 145 MiB. Past MAX_INFORMATIONAL the reply is
    refused and the connection closed; the other tenant on the origin is served."""
    transport = transports()
    sent: list[int] = []

    async def flooding(conn: Connection) -> None:
        assert await conn.read_request() is not None
        sent.append(await conn.flood(interim * 512, limit=256 << 20))

    async with HostileUpstream(per_connection(flooding, then=keep_answering(
        lambda r: response(answer(r.rid))
    ))) as upstream:  # fmt: skip
        with pytest.raises(BadResponse, match="informational"):
            await fetch(transport, post(upstream, "alpha", timeout_s=30.0), read)
        got = await fetch(transport, post(upstream, "beta"), read)
    assert whose(got) == "beta"
    # Stopped reading after a few of the upstream's writes, far from its 256 MiB.
    assert sent and sent[0] < 16 << 20


@pytest.mark.parametrize("read", ["send", "stream"])
async def test_as_many_1xx_replies_as_allowed_are_skipped(transport: Transport, read: str) -> None:
    async def script(conn: Connection) -> None:
        while (request := await conn.read_request()) is not None:
            await conn.send(CONTINUE + EARLY_HINTS * (MAX_INFORMATIONAL - 1))
            await conn.send(response(answer(request.rid)))

    async with HostileUpstream(script) as upstream:
        for rid in ("alpha", "beta"):  # the count starts again with each reply
            got = await fetch(transport, post(upstream, rid), read)
            assert whose(got) == rid


REDIRECTS = {
    "302-with-a-completion": lambda r, there: response(
        completion(r.rid), f"location: {there}/v1/chat", status="302 Found"
    ),
    "307-without-a-body": lambda r, there: head(
        f"location: {there}/v1/chat", "content-length: 0", status="307 Temporary Redirect"
    ),
}


@pytest.mark.parametrize("way", list(REDIRECTS))
@pytest.mark.parametrize("read", ["send", "stream"])
async def test_a_redirect_is_not_followed_and_is_the_providers_failure(
    transport: Transport, way: str, read: str
) -> None:
    """A provider's API never redirects a POST; one followed would send the request, and its
    key, wherever the Location says. The transport hands back the 3xx as it came (nothing is
    followed); the provider path makes it a 502, like a 5xx: no reply, so nothing generated."""

    async def elsewhere_script(conn: Connection) -> None:
        while (request := await conn.read_request()) is not None:
            await conn.send(response(completion(request.rid)))

    async with HostileUpstream(elsewhere_script) as elsewhere:

        async def script(conn: Connection) -> None:
            while (request := await conn.read_request()) is not None:
                await conn.send(REDIRECTS[way](request, elsewhere.url))

        async with HostileUpstream(script) as upstream:
            got = await fetch(transport, post(upstream, "a"), read)
            assert got.status in (302, 307)
            provider_path = (
                send_json(transport, post(upstream, "b"), "r")
                if read == "send"
                else drain_sse(transport, post(upstream, "b"))
            )
            with pytest.raises(UpstreamFailed, match="answered 30"):
                await provider_path
    assert elsewhere.requests == []


# -- proxies from the environment ------------------------------------------------------------------


async def test_http_proxy_from_the_environment_is_used(
    transports: Callable[[], Transport], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with ForwardProxy() as proxy, HostileUpstream(keep_answering()) as upstream:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        transport = transports()
        assert whose(await transport.send(post(upstream, "a"))) == "a"
        assert whose(await read_stream(transport, post(upstream, "b"))) == "b"
    assert proxy.forwarded == [f"{upstream.url}/v1/chat"] * 2
    assert [r.rid for r in upstream.requests] == ["a", "b"]


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "localhost,127.0.0.1", "*"])
async def test_no_proxy_covering_the_host_bypasses_the_proxy(
    transports: Callable[[], Transport], monkeypatch: pytest.MonkeyPatch, no_proxy: str
) -> None:
    async with ForwardProxy() as proxy, HostileUpstream(keep_answering()) as upstream:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", no_proxy)
        transport = transports()
        assert whose(await transport.send(post(upstream, "a"))) == "a"
    assert proxy.relayed == 0
    assert len(upstream.requests) == 1


# -- TLS -------------------------------------------------------------------------------------------


def _certificates(tmp: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a certificate it signed for localhost / 127.0.0.1."""
    now_ = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hardcap test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now_ - datetime.timedelta(days=1))
        .not_valid_after(now_ + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now_ - datetime.timedelta(days=1))
        .not_valid_after(now_ + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    ca_file, cert_file, key_file = tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return ca_file, cert_file, key_file


@pytest.fixture
def tls_pair(tmp_path: Path) -> Iterator[tuple[ssl.SSLContext, ssl.SSLContext]]:
    """(the upstream's server context, a client context trusting only the throwaway CA)."""
    ca_file, cert_file, key_file = _certificates(tmp_path)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_file, key_file)
    yield server, ssl.create_default_context(cafile=str(ca_file))


async def test_tls_checks_the_certificate_and_reuses_the_connection(
    transport: Transport, tls_pair: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    from hardcap_core.providers.aiohttp_transport import AiohttpTransport

    server_tls, client_tls = tls_pair
    trusting = AiohttpTransport(tls=client_tls)
    try:
        async with HostileUpstream(keep_answering(), tls=server_tls) as upstream:
            got = [whose(await trusting.send(post(upstream, f"r{i}"))) for i in range(2)]
            assert got == ["r0", "r1"]
            assert len(upstream.connections) == 1
            # The gateway's own transport checks against the public CAs: not this one.
            with pytest.raises(ConnectFailed):
                await transport.send(post(upstream, "a"))
    finally:
        await trusting.aclose()


async def test_https_proxy_from_the_environment_tunnels_to_the_upstream(
    monkeypatch: pytest.MonkeyPatch, tls_pair: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    from hardcap_core.providers.aiohttp_transport import AiohttpTransport

    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    server_tls, client_tls = tls_pair
    async with (
        ForwardProxy() as proxy,
        HostileUpstream(keep_answering(), tls=server_tls) as upstream,
    ):
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        trusting = AiohttpTransport(tls=client_tls)
        try:
            assert whose(await trusting.send(post(upstream, "a"))) == "a"
            assert whose(await read_stream(trusting, post(upstream, "b"))) == "b"
        finally:
            await trusting.aclose()
    assert proxy.tunnels == [f"localhost:{upstream.port}"]
    assert [r.rid for r in upstream.requests] == ["a", "b"]
