"""The gateway's HTTP/1.1 client against real sockets: a scripted asyncio server writes exactly
the bytes each case needs (framings, encodings, misbehaviour), and TLS runs with a throwaway CA.

What a user would notice if each failed: a reply cut short or merged with the next, a stream
that arrives all at once instead of as it is generated, a compressed stream counted as
garbage, a request sent twice to a provider that bills it, a stalled provider holding the
request forever, or a certificate not checked.
"""

from __future__ import annotations

import asyncio
import datetime
import gzip
import ipaddress
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
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
from hardcap_core.providers.http import open_sse, send_json
from hardcap_core.providers.http11 import Http11Transport
from hardcap_core.providers.openai_compat import OpenAICompatible
from hardcap_core.providers.transport import (
    BadResponse,
    ConnectFailed,
    ConnectionLost,
    TimedOut,
    UpstreamRequest,
)
from hardcap_core.wire.openai_request import parse_chat_request

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A TCP server on 127.0.0.1 running ``handler`` per connection; counts connections and
    keeps every request it read."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []  # head, body
        self.url = ""

    async def read_request(self, reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        self.requests.append((head, body))
        return head, body

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def serving(
    make: Callable[[Server], Handler], tls: ssl.SSLContext | None = None
) -> AsyncIterator[Server]:
    server = Server(lambda r, w: asyncio.sleep(0))
    server.handler = make(server)
    listener = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=tls)
    port = listener.sockets[0].getsockname()[1]
    server.url = f"{'https' if tls else 'http'}://{'localhost' if tls else '127.0.0.1'}:{port}"
    try:
        yield server
    finally:
        listener.close()


def post(
    server: Server, timeout_s: float = 5.0, path: str = "/v1/chat/completions"
) -> UpstreamRequest:
    return UpstreamRequest(server.url + path, {"content-type": "application/json"}, b'{"a":1}',
                           timeout_s)  # fmt: skip


def reply(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", f"content-length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def keep_answering(response: bytes) -> Callable[[Server], Handler]:
    """A server that answers every request on a connection with ``response``."""

    def make(server: Server) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await server.read_request(reader):
                writer.write(response)
                await writer.drain()

        return handle

    return make


def answer_once(raw: bytes, *, then_wait_s: float = 0.0) -> Callable[[Server], Handler]:
    """A server that reads one request, writes ``raw`` (maybe nothing), waits, and closes."""

    def make(server: Server) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            if raw:
                writer.write(raw)
                await writer.drain()
            await asyncio.sleep(then_wait_s)

        return handle

    return make


async def test_replies_on_one_kept_alive_connection_do_not_run_together() -> None:
    client = Http11Transport()
    async with serving(keep_answering(reply(b'{"n": 1}'))) as server:
        bodies = [(await client.send(post(server))).body for _ in range(3)]
    await client.aclose()
    assert bodies == [b'{"n": 1}'] * 3
    assert server.connections == 1
    head, body = server.requests[0]
    assert body == b'{"a":1}'
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    lines = head.lower().split(b"\r\n")
    assert f"host: 127.0.0.1:{server.url.rsplit(':', 1)[1]}".encode() in lines
    assert b"content-length: 7" in lines
    assert b"accept-encoding: identity" in lines
    assert b"content-type: application/json" in lines


async def test_a_chunked_stream_arrives_as_the_upstream_sends_it() -> None:
    step = asyncio.Event()

    def make(server: Server) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await writer.drain()
            await step.wait()  # the second piece is sent only once the first was read
            writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
            await writer.drain()
            await server.read_request(reader)

        return handle

    client = Http11Transport()
    async with serving(make) as server, client.stream(post(server)) as response:
        pieces = []
        async for piece in response.reads():
            pieces.append(piece)
            step.set()
    assert pieces == [b"first", b"second"]
    assert response.status == 200
    assert len(client._idle[("http", "127.0.0.1", int(server.url.rsplit(":", 1)[1]))]) == 1


async def test_a_body_that_ends_with_the_connection_is_read_to_its_end() -> None:
    client = Http11Transport()
    until_close = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it"
    async with serving(answer_once(until_close)) as server:
        assert (await client.send(post(server))).body == b"all of it"
    assert client._idle == {} or all(not v for v in client._idle.values())


async def test_a_connection_the_upstream_closed_while_idle_is_replaced_not_failed() -> None:
    """An upstream's keep-alive timeout closes a pooled connection; the next request goes out
    once more on a new one (the upstream never read it), and only once."""

    client = Http11Transport()
    # Each connection answers one request and is closed by the upstream.
    async with serving(answer_once(reply(b"ok"))) as server:
        assert (await client.send(post(server))).body == b"ok"
        await asyncio.sleep(0.05)
        assert (await client.send(post(server))).body == b"ok"
    assert server.connections == 2
    assert len(server.requests) == 2  # each request reached the upstream exactly once


async def test_a_fresh_connection_closed_before_any_reply_fails_without_a_resend() -> None:
    """The upstream read the request and died: it may have started (and billed) it, so the
    request is not sent again on its own; the gateway's failover decides."""

    client = Http11Transport()
    async with serving(answer_once(b"")) as server:
        with pytest.raises(ConnectionLost):
            await client.send(post(server))
        with pytest.raises(UpstreamFailed):
            await send_json(client, post(server), "r")
    assert len(server.requests) == 2


async def test_a_reply_cut_mid_body_is_an_error_not_a_short_body() -> None:
    client = Http11Transport()
    cut = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this"
    async with serving(answer_once(cut)) as server:
        with pytest.raises(ConnectionLost):
            await client.send(post(server))


async def test_a_stalled_upstream_times_out_at_the_requests_timeout() -> None:
    client = Http11Transport()
    stalled = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n"
    async with serving(answer_once(stalled, then_wait_s=5)) as server:
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with client.stream(post(server, timeout_s=0.3)) as response:
            reads = response.reads()
            assert await anext(reads) == b"hi"
            with pytest.raises(TimedOut):
                await anext(reads)
        assert 0.25 < loop.time() - started < 2.0
        with pytest.raises(UpstreamTimeout):
            await send_json(client, post(server, timeout_s=0.2), "r")


async def test_no_listener_is_a_connect_failure() -> None:
    client = Http11Transport()
    async with serving(keep_answering(reply(b""))) as server:
        url = server.url
    with pytest.raises(ConnectFailed):
        await client.send(UpstreamRequest(url, {}, b"", 1.0))
    with pytest.raises(UpstreamFailed):
        await send_json(client, UpstreamRequest(url, {}, b"", 1.0), "r")


async def test_bytes_that_are_not_http_are_a_bad_response() -> None:
    client = Http11Transport()
    async with serving(answer_once(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", then_wait_s=1)) as server:
        with pytest.raises(BadResponse):
            await client.send(post(server))
        with pytest.raises(UpstreamMalformed):
            await send_json(client, post(server), "r")


async def test_an_encoding_the_gateway_cannot_decode_is_refused_not_parsed() -> None:
    client = Http11Transport()
    async with serving(keep_answering(reply(b"\x1b\x03\x00", "content-encoding: br"))) as server:
        with pytest.raises(UpstreamMalformed):
            await send_json(client, post(server), "r")


async def test_a_large_body_read_slowly_arrives_whole() -> None:
    """Past the high-water mark the client stops reading (TCP pushes back on the upstream),
    and resumes as the body is consumed: nothing is lost or reordered."""
    body = bytes(range(256)) * (6 * 4096)  # 6 MiB

    client = Http11Transport()
    answering = keep_answering(reply(body))
    async with serving(answering) as server, client.stream(post(server)) as response:
        got = bytearray()
        async for piece in response.reads():
            got += piece
            await asyncio.sleep(0.001)
    assert bytes(got) == body


def chunk(text: str, usage: dict[str, int] | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    data = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
    if usage is not None:
        data = {**data, "choices": [], "usage": usage}
    return sse.encode(data)


@pytest.mark.parametrize("piece", [7, 64, 100_000])
async def test_a_stream_compressed_anyway_is_decompressed_and_counted(piece: int) -> None:
    """A provider gzips the stream although the gateway asked for none: every delta is still
    counted, however the compressed bytes are split across reads."""
    stream = (
        chunk("x" * 40) + chunk("y" * 8) + chunk("", {"prompt_tokens": 3, "completion_tokens": 12})
    )
    stream += sse.encode(sse.DONE)
    packed = gzip.compress(stream)

    def make(server: Server) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            head = "content-type: text/event-stream\r\ncontent-encoding: gzip\r\n"
            writer.write(f"HTTP/1.1 200 OK\r\n{head}transfer-encoding: chunked\r\n\r\n".encode())
            for i in range(0, len(packed), piece):
                part = packed[i : i + piece]
                writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            await server.read_request(reader)

        return handle

    client = Http11Transport()
    async with serving(make) as server:
        config = parse_config({
            "upstreams": [{"name": "u", "base_url": server.url + "/v1"}],
            "routes": [{"name": "r", "upstream": "u", "model": "m"}],
            "tenants": [],
        })  # fmt: skip
        provider = OpenAICompatible(client, chars_per_token=4.0)
        request = parse_chat_request(json.dumps(
            {"model": "r", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        ).encode())  # fmt: skip
        events = []
        async with provider.stream(config.routes["r"], request, 50) as reads:
            async for batch in reads:
                events += batch
    assert [e.tokens for e in events] == [10, 1, 0, 0]  # 8 characters stream as 1 token
    assert events[2].usage is not None and events[2].usage.output_tokens == 12
    assert events[-1].done


async def test_an_error_status_on_a_stream_is_the_providers_error() -> None:
    client = Http11Transport()
    slow_down = reply(b'{"error": {"message": "slow down"}}', status="429 Too Many")
    async with serving(keep_answering(slow_down)) as server:
        with pytest.raises(TooManyRequests, match="slow down") as raised:
            async with open_sse(client, post(server), "r", lambda data: sse_event(data)):
                pass
    assert raised.value.status == 429


def sse_event(data: str) -> Event:
    raise AssertionError(f"an error reply has no events to decode: {data!r}")


# -- TLS ----------------------------------------------------------------------------------------


def _certificates(tmp: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a certificate it signed for localhost / 127.0.0.1."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hardcap test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
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
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
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


async def test_tls_checks_the_certificate_and_reuses_the_connection(tmp_path: Path) -> None:
    ca_file, cert_file, key_file = _certificates(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert_file, key_file)
    trusting = Http11Transport(tls=ssl.create_default_context(cafile=str(ca_file)))
    default = Http11Transport()  # the system's CAs: the throwaway CA is not among them
    async with serving(keep_answering(reply(b"secret")), tls=server_tls) as server:
        assert [(await trusting.send(post(server))).body for _ in range(2)] == [b"secret"] * 2
        assert server.connections == 1
        with pytest.raises(ConnectFailed):
            await default.send(post(server))
    await trusting.aclose()
