"""The Bedrock provider against the local fake, over real HTTP: botocore signs, the fake checks
the signature and encodes AWS's event-stream frames, botocore decodes them; what the provider
counts and reports is compared with what the fake billed."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from botocore.eventstream import EventStreamBuffer

from hardcap_core.chat import ChatRequest
from hardcap_core.config import Route, parse_config
from hardcap_core.errors import InvalidRequest, TooManyRequests, UpstreamFailed, UpstreamTimeout
from hardcap_core.events import Event, FinishReason, OutputKind
from hardcap_core.local.bedrock_fake import CREDENTIALS_ENV, FakeSettings, create_bedrock_fake_app
from hardcap_core.local.bedrock_frames import event_frame, exception_frame
from hardcap_core.local.servers import ThreadServer
from hardcap_core.local.valkey import free_port
from hardcap_core.providers.bedrock import BedrockConverse
from hardcap_core.wire.openai_request import parse_chat_request
from tests.stack import Mock

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def fake() -> Iterator[Mock]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CREDENTIALS_ENV.items():
            patch.setenv(name, value)
        server = ThreadServer(
            create_bedrock_fake_app(FakeSettings(pace_ms=0.2, seed=2)), free_port()
        )
        server.start()
        truth = Mock(url=server.url)
        yield truth
        truth.stop()
        server.stop()


@pytest.fixture
def provider(fake: Mock) -> Iterator[BedrockConverse]:
    fake.reset()
    yield BedrockConverse()


def route(url: str, model: str = "fake.reason-v1:0", timeout: float = 5) -> Route:
    upstream = {"name": "br", "kind": "bedrock", "base_url": url, "timeout_seconds": timeout}
    price = {"input_per_million": 1.0, "output_per_million": 1.0}
    r = {"name": "r", "upstream": "br", "model": model, "price": price, "max_output_tokens": 999}
    data = {"gateway": {"redis_url": "redis://127.0.0.1:1"}, "upstreams": [upstream], "routes": [r]}
    return parse_config(data).routes["r"]


def chat(text: str, *, stream: bool = False, **extra: Any) -> ChatRequest:
    body = {"model": "r", "messages": [{"role": "user", "content": text}], "stream": stream}
    return parse_chat_request(json.dumps({**body, "user": "t1", **extra}).encode())


async def events(
    provider: BedrockConverse, r: Route, request: ChatRequest, cap: int
) -> list[Event]:
    out: list[Event] = []
    async with provider.stream(r, request, cap) as reads:
        async for read in reads:
            out += read
    return out


def test_frames_decode_with_botocore_whatever_the_reads() -> None:
    data = event_frame("contentBlockDelta", {"delta": {"text": "héllo"}, "contentBlockIndex": 0})
    data += exception_frame("throttlingException", "slow down")
    for size in (1, 7, 64, len(data)):
        buffer = EventStreamBuffer()
        messages = []
        for i in range(0, len(data), size):
            buffer.add_data(data[i : i + size])
            messages += list(buffer)
        assert [m.headers[":message-type"] for m in messages] == ["event", "exception"]
        assert json.loads(messages[0].payload)["delta"]["text"] == "héllo"


def test_an_unsigned_or_wrongly_signed_call_is_refused(fake: Mock) -> None:
    body = {"messages": [{"role": "user", "content": [{"text": "hi"}]}]}
    r = httpx.post(f"{fake.url}/model/fake.model-v1:0/converse", json=body)
    assert r.status_code == 403 and "SigV4" in r.json()["message"]
    import botocore.session

    client = botocore.session.get_session().create_client(
        "bedrock-runtime", region_name="us-east-1", endpoint_url=fake.url,
        aws_access_key_id="AKIDWRONG", aws_secret_access_key="wrong",
    )  # fmt: skip
    with pytest.raises(client.exceptions.ClientError, match="InvalidSignature"):
        client.converse(modelId="m", messages=body["messages"])


async def test_whole_reply_counts_reasoning_and_reports_what_was_billed(
    fake: Mock, provider: BedrockConverse
) -> None:
    r = route(fake.url)
    done = await provider.complete(r, chat("hi [mock:tokens=20] [mock:thinking=10]"), 100)
    kinds = {o.kind for o in done.output}
    assert {OutputKind.REASONING, OutputKind.CONTENT, OutputKind.OTHER} <= kinds
    truth = fake.truth("t1")
    assert done.usage is not None and done.finish is FinishReason.STOP
    assert done.usage.output_tokens == truth["completion_tokens"] == 30
    assert done.usage.input_tokens == truth["prompt_tokens"]


async def test_cache_reads_and_writes_are_part_of_the_input(
    fake: Mock, provider: BedrockConverse
) -> None:
    text = "hello there " * 30 + "[mock:cache_read=40] [mock:cache_write=20] [mock:tokens=3]"
    done = await provider.complete(route(fake.url, "fake.model-v1:0"), chat(text), 50)
    usage = done.usage
    assert usage is not None and usage.raw is not None
    assert usage.raw["inputTokens"] == fake.truth("t1")["prompt_tokens"] - 60
    assert usage.input_tokens == fake.truth("t1")["prompt_tokens"]
    assert (usage.cached_input_tokens, usage.cache_write_input_tokens) == (40, 20)


async def test_stream_counts_every_delta_and_ends_with_the_billed_usage(
    fake: Mock, provider: BedrockConverse
) -> None:
    got = await events(
        provider, route(fake.url), chat("x [mock:tokens=30] [mock:thinking=20]", stream=True), 200
    )
    outputs = [o for e in got for o in e.output]
    assert sum(o.kind is OutputKind.REASONING for o in outputs) == 20
    assert sum(o.kind is OutputKind.CONTENT for o in outputs) == 30
    (signature,) = [o for o in outputs if o.kind is OutputKind.OTHER]
    assert signature.text == "" and signature.tokens > 0 and signature.least == 0
    assert [e.finish for e in got if e.finish] == [FinishReason.STOP]
    assert got[-1].done and got[-1].usage is not None
    truth = fake.truth("t1")
    assert got[-1].usage.output_tokens == truth["completion_tokens"] == 50
    assert truth["completed"] == 1


async def test_stream_tool_call_and_the_output_cap(fake: Mock, provider: BedrockConverse) -> None:
    request = chat("weather in Paris? [mock:tokens=10]", stream=True, tools=TOOLS)
    got = await events(provider, route(fake.url, "fake.model-v1:0"), request, 100)
    outputs = [o for e in got for o in e.output]
    names = [o for o in outputs if o.kind is OutputKind.TOOL_NAME]
    args = "".join(o.text for o in outputs if o.kind is OutputKind.TOOL_ARGUMENTS)
    assert [(n.text, n.tool_call) for n in names] == [("get_weather", 0)]
    assert list(json.loads(args)) == ["city"]
    assert [e.finish for e in got if e.finish] == [FinishReason.TOOL_CALLS]
    capped = await events(provider, route(fake.url), chat("x [mock:tokens=90]", stream=True), 7)
    assert [e.finish for e in capped if e.finish] == [FinishReason.LENGTH]
    assert capped[-1].usage is not None and capped[-1].usage.output_tokens == 7


@pytest.mark.parametrize(
    ("directive", "message"),
    [("stream_error=5", "modelStreamErrorException"), ("bad_crc=3", "malformed")],
)
async def test_a_failure_inside_the_stream_is_an_error_event(
    fake: Mock, provider: BedrockConverse, directive: str, message: str
) -> None:
    got = await events(
        provider, route(fake.url), chat(f"x [mock:tokens=20] [mock:{directive}]", stream=True), 99
    )
    errors = [e.error for e in got if e.error]
    assert len(errors) == 1 and message in errors[0]
    assert not any(e.done for e in got)


async def test_a_dropped_connection_raises_and_a_clean_stop_is_not_done(
    fake: Mock, provider: BedrockConverse
) -> None:
    with pytest.raises(UpstreamFailed, match="mid-stream"):
        await events(
            provider,
            route(fake.url),
            chat("x [mock:tokens=20] [mock:die_after=4]", stream=True),
            99,
        )
    got = await events(
        provider, route(fake.url), chat("x [mock:tokens=20] [mock:eof_after=4]", stream=True), 99
    )
    assert not any(e.done or e.finish for e in got)


async def test_leaving_a_stream_drops_the_connection_at_once(
    fake: Mock, provider: BedrockConverse
) -> None:
    """The worker waits for a slow model's next token; leaving must not wait for it."""
    request = chat("x [mock:tokens=50] [mock:pace_ms=3000]", stream=True)
    async with provider.stream(route(fake.url, "fake.model-v1:0"), request, 99) as reads:
        first = await anext(aiter(reads))
        assert first
        started = time.monotonic()
    assert time.monotonic() - started < 1.0
    truth = fake.truth("t1")
    assert truth["aborted"] == 1 and truth["in_flight"] == 0


async def test_a_cancelled_reader_closes_the_stream(fake: Mock, provider: BedrockConverse) -> None:
    request = chat("x [mock:tokens=500] [mock:pace_ms=20]", stream=True)
    read = asyncio.Event()

    async def read_all() -> None:
        async with provider.stream(route(fake.url, "fake.model-v1:0"), request, 999) as reads:
            n = 0
            async for _ in reads:
                n += 1
                if n == 5:  # past messageStart and the block's start: tokens are flowing
                    read.set()

    task = asyncio.create_task(read_all())
    # Cancelled once output flows (its fifth read): the first call of a provider also creates
    # its client, which took more than a fixed second on a loaded machine (no token yet).
    await asyncio.wait_for(read.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    truth = fake.truth("t1")
    assert truth["aborted"] == 1 and 0 < truth["completion_tokens"] < 100


@pytest.mark.parametrize(
    ("status", "error", "code"),
    [
        (429, TooManyRequests, "upstream_rate_limited"),
        (503, UpstreamFailed, "upstream_error"),
        (500, UpstreamFailed, "upstream_error"),
        (400, InvalidRequest, "invalid_request"),
        (403, UpstreamFailed, "upstream_error"),
        (408, UpstreamTimeout, "upstream_timeout"),
    ],
)
async def test_bedrock_errors_become_the_gateway_errors_of_any_provider(
    fake: Mock, provider: BedrockConverse, status: int, error: type[Exception], code: str
) -> None:
    r = route(fake.url, "fake.model-v1:0")
    for stream in (False, True):
        request = chat(f"x [mock:status={status}]", stream=stream)
        call = events(provider, r, request, 10) if stream else provider.complete(r, request, 10)
        with pytest.raises(error) as raised:
            await call
        assert getattr(raised.value, "code", None) == code
        if status == 403:
            assert "BedrockModelArns" in str(raised.value)
    assert fake.truth("t1")["errors"] == 2  # one call each: the client does not retry


async def test_a_hung_or_absent_bedrock_is_a_timeout_or_unreachable(
    fake: Mock, provider: BedrockConverse
) -> None:
    with pytest.raises(UpstreamTimeout):
        await provider.complete(route(fake.url, timeout=0.5), chat("x [mock:hang=1]"), 10)
    with pytest.raises(UpstreamTimeout):
        await events(
            provider, route(fake.url, timeout=0.5), chat("x [mock:hang=1]", stream=True), 10
        )
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UpstreamFailed, match="could not be reached"):
        await provider.complete(route(closed), chat("x"), 10)
