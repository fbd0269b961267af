"""Real providers' streams, byte for byte (tests/fixtures/providers/README.md: from their
documentation, or their SDKs' recordings of the live API), replayed through each provider module
and through the relay and the meter on a real ledger: what comes out is what the provider sent,
however the reads cut the bytes, and every ending (complete, cut at the cap, cut off without a
finish, failed mid-stream, the client gone) is charged at least the lower bound of what streamed
and at least what the provider had reported; a complete stream, its final report.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route as HttpRoute

from hardcap_core.budgets import Dimension
from hardcap_core.config import Route, parse_config
from hardcap_core.errors import GatewayError
from hardcap_core.events import Event, FinishReason, OutputKind, Read
from hardcap_core.gateway.meter import Meter, MeterSettings
from hardcap_core.gateway.relay import Relay
from hardcap_core.ledger import FREE, Admitted, Ledger
from hardcap_core.ledger.estimators import MaxTokensEstimator
from hardcap_core.local.bedrock_fake import CREDENTIALS_ENV
from hardcap_core.local.bedrock_frames import EVENT_STREAM, event_frame, exception_frame
from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.servers import ThreadServer
from hardcap_core.local.valkey import free_port
from hardcap_core.outcome import Outcome
from hardcap_core.providers.anthropic import AnthropicMessages
from hardcap_core.providers.bedrock import BedrockConverse
from hardcap_core.providers.openai_compat import OpenAICompatible
from hardcap_core.providers.transport import CallbackTransport, ConnectionLost, UpstreamRequest
from hardcap_core.wire.openai_chat import OpenAIChat
from hardcap_core.wire.openai_request import parse_chat_request
from tests.conftest import TENANT, scope
from tests.stack import Mock

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "providers"
# Below every input the fixtures report, so a charge that believed the reported input shows.
INPUT_ESTIMATE = 10
REQUEST = parse_chat_request(json.dumps({
    "model": "r", "messages": [{"role": "user", "content": "hi"}], "stream": True,
    "stream_options": {"include_usage": True}, "user": "alpha",
}).encode())  # fmt: skip
# OpenAI's reasoning guide: 75 input, 1,186 output of which 1,024 reasoning (README.md).
REASONING_USAGE = {"prompt_tokens": 75, "completion_tokens": 1186, "total_tokens": 1261,
                   "completion_tokens_details": {"reasoning_tokens": 1024}}  # fmt: skip


def wire(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def sse_events(raw: bytes) -> list[bytes]:
    """The stream's events, each with the blank line that ends it."""
    return [part + b"\n\n" for part in raw.split(b"\n\n") if part.strip()]


def bedrock_events(name: str = "bedrock_converse_stream.json") -> list[bytes]:
    """The fixture's events as AWS event-stream frames, one frame each."""
    events: list[dict[str, Any]] = json.loads(wire(name))
    return [event_frame(kind, body) for event in events for kind, body in event.items()]


def split(raw: bytes, size: int | None) -> list[bytes]:
    """The bytes in reads of ``size`` (None: one read; 0: each read ends between the two line
    ends of an SSE event's blank line, an awkward place for a parser)."""
    if size is None:
        return [raw]
    if size == 0:
        cuts = [i + 1 for i in range(len(raw)) if raw[i : i + 2] == b"\n\n"]
        return [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True) if a < b]
    return [raw[i : i + size] for i in range(0, len(raw), size)]


SPLITS = [None, 0, 1, 7, 64]


def routes(bedrock_url: str = "http://127.0.0.1:1") -> dict[str, Route]:
    price = {"input_per_million": 1, "output_per_million": 1}
    config = parse_config({
        "gateway": {"redis_url": "redis://127.0.0.1:1"},
        "upstreams": [
            {"name": "oa", "kind": "openai", "base_url": "https://api.test/v1"},
            {"name": "an", "kind": "anthropic", "base_url": "https://api.test/v1"},
            {"name": "br", "kind": "bedrock", "base_url": bedrock_url, "timeout_seconds": 5},
        ],
        "routes": [{"name": name, "upstream": name, "model": "m", "price": price}
                   for name in ("oa", "an", "br")],
    })  # fmt: skip
    return dict(config.routes)


class DroppingTransport(CallbackTransport):
    """Sends ``pieces``, then the connection is reset: a provider that dies mid-stream."""

    def __init__(self, pieces: Sequence[bytes]) -> None:
        super().__init__(lambda _: (200, {}, pieces))
        self.pieces, self.status, self.headers = list(pieces), 200, {}

    @asynccontextmanager
    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Any]:
        self.sent.append(request)
        yield self  # the reply: this object's status, headers, reads() and aread()

    async def reads(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece
        raise ConnectionLost("connection reset by peer")

    async def aread(self) -> bytes:
        return b""


Opener = Callable[[Sequence[bytes]], AbstractAsyncContextManager[AsyncIterator[Read]]]


def sse_opener(kind: str, *, dropped: bool = False) -> Opener:
    """Open a stream of ``kind`` ("oa", "an") whose body is the given reads."""
    route = routes()[kind]

    def opened(pieces: Sequence[bytes]) -> AbstractAsyncContextManager[AsyncIterator[Read]]:
        body = list(pieces)
        http = DroppingTransport(body) if dropped else CallbackTransport(lambda _: (200, {}, body))
        provider = OpenAICompatible(http) if kind == "oa" else AnthropicMessages(http)
        return provider.stream(route, REQUEST, 1000)

    return opened


@pytest.fixture(scope="module")
def bedrock() -> Iterator[Opener]:
    """Open a Bedrock stream whose body is the given reads of frames, served over HTTP by a
    stand-in; botocore (signing, decoding the frames) and the provider are the real ones."""
    served: list[bytes] = []

    async def converse_stream(request: Request) -> Response:
        await request.body()
        return StreamingResponse(iter(list(served)), media_type=EVENT_STREAM)  # a write a piece

    app = Starlette(routes=[HttpRoute("/model/{model_id:path}/converse-stream",
                                      converse_stream, methods=["POST"])])  # fmt: skip
    provider = BedrockConverse()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CREDENTIALS_ENV.items():
            patch.setenv(name, value)
        server = ThreadServer(app, free_port()).start()
        route = routes(server.url)["br"]

        def opened(pieces: Sequence[bytes]) -> AbstractAsyncContextManager[AsyncIterator[Read]]:
            served[:] = pieces
            return provider.stream(route, REQUEST, 1000)

        yield opened
        server.stop()


async def decode(opened: Opener, pieces: Sequence[bytes]) -> list[Event]:
    out: list[Event] = []
    async with opened(pieces) as reads:
        async for read in reads:
            out += read
    return out


class Seen:
    """What a client would be shown, and what was counted, from a provider's events."""

    def __init__(self, events: Sequence[Event]) -> None:
        self.text = {kind: "" for kind in OutputKind}
        self.tools: dict[int | None, list[str]] = {}
        self.hidden: list[tuple[OutputKind, int, int]] = []  # billed pieces with no text
        for event in events:
            for o in event.output:
                if o.kind in (OutputKind.TOOL_NAME, OutputKind.TOOL_ARGUMENTS):
                    self.tools.setdefault(o.tool_call, ["", ""])[
                        o.kind is OutputKind.TOOL_ARGUMENTS] += o.text  # fmt: skip
                elif o.text:
                    self.text[o.kind] += o.text
                else:
                    self.hidden.append((o.kind, o.tokens, o.least))
        self.least = sum(o.least for e in events for o in e.output)
        self.finishes = [e.finish for e in events if e.finish is not None]
        reports = [e.usage for e in events if e.usage is not None]
        self.usage = reports[-1] if reports else None
        self.errors = [e.error for e in events if e.error is not None]
        self.done = any(e.done for e in events)

    def calls(self) -> dict[int | None, tuple[str, Any]]:
        return {i: (name, json.loads(args)) for i, (name, args) in self.tools.items()}

    def counts(self) -> tuple[int | None, int | None]:
        return (self.usage.input_tokens, self.usage.output_tokens) if self.usage else (None, None)


# -- decoded by each provider module, whatever the reads -------------------------------------------


@pytest.mark.parametrize("size", SPLITS)
async def test_openai_text_tool_calls_and_refusal(size: int | None) -> None:
    opened = sse_opener("oa")
    text = Seen(await decode(opened, split(wire("openai_content.sse"), size)))
    assert text.text[OutputKind.CONTENT] == (
        "I'm unable to provide real-time weather updates. To get the current weather in San"
        " Francisco, I recommend checking a reliable weather website or a weather app."
    )
    assert text.finishes == [FinishReason.STOP] and text.done
    assert text.counts() == (14, 30) and text.usage and text.usage.reasoning_tokens == 0
    assert text.least == 30  # one piece a token: OpenAI streams a token per chunk
    tools = Seen(await decode(opened, split(wire("openai_tool_calls.sse"), size)))
    assert tools.calls() == {
        0: ("GetWeatherArgs", {"city": "Edinburgh", "country": "GB", "units": "c"}),
        1: ("get_stock_price", {"ticker": "AAPL", "exchange": "NASDAQ"}),
    }
    assert tools.finishes == [FinishReason.TOOL_CALLS] and tools.counts() == (149, 60)
    refusal = Seen(await decode(opened, split(wire("openai_refusal.sse"), size)))
    assert refusal.text[OutputKind.REFUSAL] == "I'm sorry, I can't assist with that request."
    assert refusal.text[OutputKind.CONTENT] == "" and refusal.counts() == (79, 11)
    assert refusal.least <= 11
    # An o-series model streams the same chunks; its reasoning shows only in the final usage.
    usage = json.dumps({"usage": REASONING_USAGE}).encode()[1:-1]
    reasoning = re.sub(rb'"usage":\{[^}]*\{[^}]*\}\}', usage, wire("openai_content.sse"))
    think = Seen(await decode(opened, split(reasoning, size)))
    assert think.text[OutputKind.REASONING] == "" and not think.hidden
    assert think.counts() == (75, 1186) and think.usage and think.usage.reasoning_tokens == 1024


@pytest.mark.parametrize("size", SPLITS)
async def test_anthropic_text_tool_use_thinking_and_redacted_thinking(size: int | None) -> None:
    opened = sse_opener("an")
    basic_events = await decode(opened, split(wire("anthropic_basic.sse"), size))
    basic = Seen(basic_events)
    assert basic.text[OutputKind.CONTENT] == "Hello!" and basic.done
    assert basic.finishes == [FinishReason.STOP]
    # message_start's running count (1), then message_delta's cumulative one (15).
    reports = [(e.usage.input_tokens, e.usage.output_tokens) for e in basic_events if e.usage]
    assert reports == [(25, 1), (25, 15)]
    tool = Seen(await decode(opened, split(wire("anthropic_tool_use.sse"), size)))
    assert tool.text[OutputKind.CONTENT] == "Okay, let's check the weather for San Francisco, CA:"
    assert tool.calls() == {0: ("get_weather", {"location": "San Francisco, CA",
                                                "unit": "fahrenheit"})}  # fmt: skip
    assert tool.finishes == [FinishReason.TOOL_CALLS] and tool.counts() == (472, 89)
    think = Seen(await decode(opened, split(wire("anthropic_thinking.sse"), size)))
    assert think.text[OutputKind.REASONING] == (
        "Let me solve this step by step:\n\n1. First break down 27 * 453\n2. 453 = 400 + 50 + 3"
        "\n3. 27 * 400 = 10,800\n4. 27 * 50 = 1,350\n5. 27 * 3 = 81\n6. 10,800 + 1,350 + 81"
        " = 12,231")  # fmt: skip
    assert think.text[OutputKind.CONTENT] == "27 * 453 = 12,231"
    ((kind, tokens, least),) = think.hidden  # the signature: billed by length, no lower bound
    assert kind is OutputKind.REASONING and tokens > 0 and least == 0
    assert think.finishes == [FinishReason.STOP] and think.usage is None and think.done
    redacted = Seen(await decode(opened, split(wire("anthropic_redacted_thinking.sse"), size)))
    ((kind, tokens, least),) = redacted.hidden
    assert kind is OutputKind.REASONING and tokens >= 38 and least == 0  # 155 characters
    assert redacted.text[OutputKind.REASONING] == ""
    assert redacted.text[OutputKind.CONTENT] == "27 * 453 = 12,231"
    overloaded = [
        *sse_events(wire("anthropic_basic.sse"))[:4],
        wire("anthropic_overloaded_error.sse"),
    ]
    failed = Seen(await decode(opened, split(b"".join(overloaded), size)))
    assert failed.text[OutputKind.CONTENT] == "Hello" and not failed.done and not failed.finishes
    assert len(failed.errors) == 1 and "Overloaded" in failed.errors[0]


@pytest.mark.parametrize("size", [None, 5, 64])
async def test_bedrock_reasoning_redacted_text_and_tool_use(
    bedrock: Opener, size: int | None
) -> None:
    seen = Seen(await decode(bedrock, split(b"".join(bedrock_events()), size)))
    assert seen.text[OutputKind.REASONING] == (
        "The user wants the most popular song on the radio station WZPZ. The top_song tool"
        " takes a call sign.")  # fmt: skip
    shown = "To find the most popular song on WZPZ, I'll use the top_song tool."
    assert seen.text[OutputKind.CONTENT] == shown
    assert seen.calls() == {0: ("top_song", {"sign": "WZPZ"})}
    signature, secret = seen.hidden  # both billed by length, shown to nobody
    assert signature[0] is OutputKind.OTHER and signature[1] > 0 and signature[2] == 0
    assert secret[0] is OutputKind.OTHER and secret[1] > 0
    assert seen.finishes == [FinishReason.TOOL_CALLS] and seen.done
    assert seen.counts() == (446, 118) and seen.least <= 118
    half = bedrock_events()[:8]
    failed = Seen(await decode(bedrock, [*half, exception_frame("modelStreamErrorException", "x")]))
    assert len(failed.errors) == 1 and not failed.done


# -- charged, however the stream ends --------------------------------------------------------------


@asynccontextmanager
async def recorded(
    opened: AbstractAsyncContextManager[AsyncIterator[Read]], log: list[Event]
) -> AsyncIterator[AsyncIterator[Read]]:
    """``opened``, noting every event the relay reads: what the provider had said."""

    async def reads(inner: AsyncIterator[Read]) -> AsyncGenerator[Read, None]:
        async for read in inner:
            log.extend(read)
            yield read

    async with opened as inner:
        outer = reads(inner)
        try:
            yield outer
        finally:
            await outer.aclose()


async def relay(
    client: Any, opened: AbstractAsyncContextManager[AsyncIterator[Read]], *,
    same_dialect: bool, cap: int | None = None, leave_after: int | None = None,
) -> tuple[Relay, list[Event]]:  # fmt: skip
    """Stream through the relay on a fresh hold (the client leaves after ``leave_after`` pieces)."""
    ledger = Ledger(client)
    s = scope((TENANT, Dimension.INPUT_TOKENS, 100_000, "day"),
              (TENANT, Dimension.OUTPUT_TOKENS, 100_000, "day"), levels=(TENANT,))  # fmt: skip
    admitted = await ledger.admit(s, input_tokens=INPUT_ESTIMATE, output_estimate=2_000)
    assert isinstance(admitted, Admitted)
    meter = Meter(
        ledger, s, admitted.reservation, MeterSettings(), input_estimate=INPUT_ESTIMATE,
        estimator=MaxTokensEstimator(), route="r", prices=FREE, cap=cap, clock=lambda: 1000.0,
    )  # fmt: skip
    log: list[Event] = []
    encoder = OpenAIChat().encoder(REQUEST, model="r", same_dialect=same_dialect)
    r = Relay(recorded(opened, log), meter, encoder)
    # A failure before anything went out is the request's error status: the stream has ended.
    with contextlib.suppress(GatewayError):
        await r.open()
    chunks = r.chunks()
    sent = 0
    async for _ in chunks:
        sent += 1
        if sent == leave_after:
            await chunks.aclose()
            await r.end(Outcome.CLIENT_GONE)
            break
    rows = {row.budget.dimension: row for row in (await ledger.usage(s)).rows}
    assert rows[Dimension.OUTPUT_TOKENS].used == meter.charged_output
    assert rows[Dimension.INPUT_TOKENS].used == meter.charged_input
    assert all(row.reserved == 0 for row in rows.values())
    return r, log


def check_charge(r: Relay, log: list[Event], outcome: Outcome) -> None:
    """Charged at least what streamed (one token a piece) and what the provider reported."""
    assert r.outcome is outcome
    seen = Seen(log)
    charged_in, charged_out = r.meter.charged_input, r.meter.charged_output
    assert charged_out >= seen.least
    reported_in, reported_out = seen.counts()
    assert charged_out >= (reported_out or 0)
    assert charged_in >= (reported_in or INPUT_ESTIMATE)
    if outcome is Outcome.COMPLETED and seen.usage is not None and seen.finishes:
        assert (charged_in, charged_out) == seen.counts()  # the final report is the bill


WIRES = {  # fixture: its provider
    "openai_content.sse": "oa", "openai_tool_calls.sse": "oa", "openai_refusal.sse": "oa",
    "anthropic_basic.sse": "an", "anthropic_tool_use.sse": "an", "anthropic_thinking.sse": "an",
    "anthropic_redacted_thinking.sse": "an", "bedrock_converse_stream.json": "br",
}  # fmt: skip
ENDINGS = {
    "complete": Outcome.COMPLETED, "complete_one_read": Outcome.COMPLETED,
    "cut": Outcome.TRUNCATED, "cut_one_read": Outcome.TRUNCATED,
    "incomplete": Outcome.INCOMPLETE, "error": Outcome.UPSTREAM_ERROR, "gone": Outcome.CLIENT_GONE,
}  # fmt: skip


@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("name", list(WIRES))
async def test_every_ending_is_charged_what_streamed_and_what_was_reported(
    standalone_client: Any, request: pytest.FixtureRequest, name: str, ending: str
) -> None:
    kind = WIRES[name]
    events = bedrock_events(name) if kind == "br" else sse_events(wire(name))
    half = events[: len(events) // 2]  # no finish reason yet in any of them
    opener: Opener
    if kind == "br":
        opener = request.getfixturevalue("bedrock")
        failure = [exception_frame("modelStreamErrorException", "The model stream failed.")]
    else:  # OpenAI documents no error event mid-stream: its connection drops instead
        opener = sse_opener(kind, dropped=ending == "error" and kind == "oa")
        failure = [wire("anthropic_overloaded_error.sse")] if kind == "an" else []
    pieces = {"incomplete": half, "error": [*half, *failure]}.get(ending, events)
    if ending.endswith("one_read"):
        pieces = [b"".join(events)]
    # The client leaves after the first piece with output (OpenAI's role chunk goes out alone).
    gone = (2 if kind == "oa" else 1) if ending == "gone" else None
    r, log = await relay(
        standalone_client, opener(pieces), same_dialect=kind == "oa",
        cap=0 if ending.startswith("cut") else None, leave_after=gone,
    )  # fmt: skip
    check_charge(r, log, ENDINGS[ending])


@pytest.mark.parametrize("ending", ["eof", "stop_without_delta"])
async def test_message_starts_output_tokens_1_is_a_floor_not_the_bill(
    standalone_client: Any, ending: str
) -> None:
    """The regression: message_start says output_tokens 1, text streams, and the stream ends
    with no message_delta: by EOF (incomplete), or by message_stop alone (complete, with no
    final report). Both were charged 1 output token, whatever had streamed."""
    events = sse_events(wire("anthropic_basic.sse"))
    if ending == "eof":
        events = [*events[:3], *[events[3]] * 50]  # message_start .. ping, then 50 "Hello"s
    else:
        events = [e for e in events if b"message_delta" not in e]
    r, log = await relay(standalone_client, sse_opener("an")(events), same_dialect=False)
    assert r.outcome is (Outcome.INCOMPLETE if ending == "eof" else Outcome.COMPLETED)
    seen = Seen(log)
    assert seen.counts() == (25, 1) and seen.least == (50 if ending == "eof" else 2)
    assert r.meter.charged_output >= seen.least and r.meter.charged_input == 25


# -- through the mock, which sends Anthropic's real message_start ----------------------------------


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0, seed=4))
    yield m
    m.stop()


@pytest.mark.parametrize(("directives", "outcome"), [
    ("[mock:tokens=40]", Outcome.COMPLETED),
    ("[mock:tokens=40] [mock:eof_after=25]", Outcome.INCOMPLETE),
    ("[mock:thinking=10] [mock:tokens=30] [mock:eof_after=20]", Outcome.INCOMPLETE),
])  # fmt: skip
async def test_the_mocks_anthropic_stream_is_charged_at_least_its_ground_truth(
    standalone_client: Any, mock: Mock, directives: str, outcome: Outcome
) -> None:
    mock.reset()
    body = {"model": "mock-small", "max_tokens": 200, "stream": True,
            "messages": [{"role": "user", "content": f"hi {directives}"}],
            "metadata": {"user_id": "fx"}}  # fmt: skip
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    raw = mock.http.post("/v1/messages", json=body, headers=headers).content
    start = json.loads(sse_events(raw)[0].split(b"data: ", 1)[1])
    assert start["message"]["usage"]["output_tokens"] == 1  # as Anthropic sends it
    truth = mock.truth("fx")
    r, log = await relay(standalone_client, sse_opener("an")(sse_events(raw)), same_dialect=False)
    check_charge(r, log, outcome)
    assert r.meter.charged_input == truth["prompt_tokens"]
    if outcome is Outcome.COMPLETED:
        assert r.meter.charged_output == truth["completion_tokens"]
    else:
        assert r.meter.charged_output >= truth["completion_tokens"] > 1
