"""What the Bedrock provider counts and reports, through its public calls with the botocore
client swapped (``client_factory``): botocore's Stubber for Converse, and a client whose
ConverseStream yields given, already decoded events (botocore's own shapes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import botocore.session
import pytest
from botocore.exceptions import ClientError, EventStreamError
from botocore.stub import Stubber

from hardcap_core.chat import ChatRequest
from hardcap_core.config import Route, Upstream, parse_config
from hardcap_core.errors import TooManyRequests, UpstreamFailed
from hardcap_core.events import Event, FinishReason, OutputKind
from hardcap_core.providers.bedrock import BedrockConverse, bedrock_usage
from hardcap_core.wire.openai_request import parse_chat_request


def route() -> Route:
    data = {
        "gateway": {"redis_url": "redis://127.0.0.1:1"},
        "upstreams": [{"name": "br", "kind": "bedrock", "region": "us-east-1"}],
        "routes": [
            {
                "name": "r",
                "upstream": "br",
                "model": "m",
                "price": {"input_per_million": 1.0, "output_per_million": 1.0},
                "max_output_tokens": 999,
            }
        ],
    }
    return parse_config(data).routes["r"]


def chat(stream: bool = False) -> ChatRequest:
    body = {"model": "r", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return parse_chat_request(json.dumps(body).encode())


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[BedrockConverse, Stubber]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = botocore.session.get_session().create_client("bedrock-runtime", "us-east-1")
    with Stubber(client) as stubber:
        yield BedrockConverse(client_factory=lambda _: client), stubber
        stubber.assert_no_pending_responses()


class Stream:
    """What botocore's EventStream is to the provider: events to iterate, and close()."""

    def __init__(self, events: list[Any], error: Exception | None = None) -> None:
        self.events, self.error, self.closed = events, error, False

    def __iter__(self) -> Iterator[Any]:
        yield from self.events
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.closed = True


class StreamClient:
    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.params: dict[str, Any] = {}

    def converse_stream(self, **params: Any) -> dict[str, Any]:
        self.params = params
        return {"stream": self.stream}


async def streamed(stream: Stream) -> tuple[list[Event], StreamClient]:
    client = StreamClient(stream)
    provider = BedrockConverse(client_factory=lambda _: client)
    out: list[Event] = []
    async with provider.stream(route(), chat(True), 50) as reads:
        async for read in reads:
            out += read
    return out, client


def delta(index: int, **body: Any) -> dict[str, Any]:
    return {"contentBlockDelta": {"contentBlockIndex": index, "delta": body}}


async def test_whole_reply_counts_each_block_kind(stubbed: tuple[BedrockConverse, Stubber]) -> None:
    provider, stubber = stubbed
    reply = {
        "output": {
            "message": {
                "role": "assistant",
                "content": [
                    {
                        "reasoningContent": {
                            "reasoningText": {"text": "let me think", "signature": "s" * 80}
                        }
                    },
                    {"reasoningContent": {"redactedContent": b"\x00" * 40}},
                    {"text": "It is sunny."},
                    {
                        "toolUse": {
                            "toolUseId": "t1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        }
                    },
                ],
            }
        },
        "stopReason": "tool_use",
        "usage": {
            "inputTokens": 10,
            "outputTokens": 30,
            "totalTokens": 40,
            "cacheReadInputTokens": 5,
        },
        "metrics": {"latencyMs": 9},
    }
    stubber.add_response(
        "converse",
        reply,
        {
            "modelId": "m",
            "messages": [{"role": "user", "content": [{"text": "hi"}]}],
            "inferenceConfig": {"maxTokens": 20},
        },
    )
    done = await provider.complete(route(), chat(), 20)
    by_kind = {o.kind: o for o in done.output}
    assert by_kind[OutputKind.REASONING].text == "let me think"
    assert by_kind[OutputKind.CONTENT].text == "It is sunny."
    assert (by_kind[OutputKind.TOOL_NAME].text, by_kind[OutputKind.TOOL_NAME].tool_call) == (
        "get_weather",
        0,
    )
    assert json.loads(by_kind[OutputKind.TOOL_ARGUMENTS].text) == {"city": "Paris"}
    others = [o for o in done.output if o.kind is OutputKind.OTHER]
    assert [o.tokens for o in others] == [20, 10]  # signature (80 chars), redacted (40 bytes)
    assert all(o.text == "" for o in others)  # counted, never shown as the reply's text
    assert done.finish is FinishReason.TOOL_CALLS
    assert done.usage is not None and (done.usage.input_tokens, done.usage.cached_input_tokens) == (
        15,
        5,
    )
    assert "ResponseMetadata" not in done.raw


async def test_a_throttled_call_is_a_429(stubbed: tuple[BedrockConverse, Stubber]) -> None:
    provider, stubber = stubbed
    stubber.add_client_error("converse", "ThrottlingException", "Too many tokens", 429)
    with pytest.raises(TooManyRequests) as raised:
        await provider.complete(route(), chat(), 20)
    assert (
        raised.value.code == "upstream_rate_limited" and "Too many tokens" in raised.value.message
    )


async def test_stream_counts_every_delta_kind_and_numbers_tool_calls() -> None:
    events = [
        {"messageStart": {"role": "assistant"}},
        delta(0, reasoningContent={"text": "hmm, "}),
        delta(0, reasoningContent={"signature": "x" * 40}),
        delta(1, reasoningContent={"redactedContent": b"\x01" * 8}),
        delta(2, text="Hello"),
        delta(2, citation={"title": "doc", "location": {"documentChar": {"start": 1}}}),
        {
            "contentBlockStart": {
                "contentBlockIndex": 3,
                "start": {"toolUse": {"toolUseId": "a", "name": "first"}},
            }
        },
        delta(3, toolUse={"input": '{"a": 1}'}),
        {
            "contentBlockStart": {
                "contentBlockIndex": 5,
                "start": {"toolUse": {"toolUseId": "b", "name": "second"}},
            }
        },
        delta(5, toolUse={"input": "{}"}),
        {"somethingNew": {"payload": "a billed field nobody told us about"}},
        {"messageStop": {"stopReason": "max_tokens"}},
        {
            "metadata": {
                "usage": {"inputTokens": 3, "outputTokens": 9, "totalTokens": 12},
                "metrics": {"latencyMs": 1},
            }
        },
    ]
    got, _ = await streamed(Stream(events))
    outputs = [o for e in got for o in e.output]
    kinds = [o.kind for o in outputs]
    assert kinds.count(OutputKind.REASONING) == 1 and kinds.count(OutputKind.CONTENT) == 1
    # The signature, the redacted reasoning, the citation and the unknown event: by length.
    assert kinds.count(OutputKind.OTHER) == 4
    assert all(o.tokens > 0 and o.text == "" for o in outputs if o.kind is OutputKind.OTHER)
    calls = [(o.text, o.tool_call) for o in outputs if o.kind is OutputKind.TOOL_NAME]
    assert calls == [("first", 0), ("second", 1)]
    args = [(o.text, o.tool_call) for o in outputs if o.kind is OutputKind.TOOL_ARGUMENTS]
    assert args == [('{"a": 1}', 0), ("{}", 1)]
    assert [e.finish for e in got if e.finish] == [FinishReason.LENGTH]
    assert got[-1].done and got[-1].usage is not None and got[-1].usage.output_tokens == 9
    assert all(e.tokens == sum(o.tokens for o in e.output) for e in got)


async def test_an_exception_event_mid_stream_is_an_error_event_and_the_stream_is_closed() -> None:
    error = EventStreamError(
        {"Error": {"Code": "modelStreamErrorException", "Message": "boom"}}, "ConverseStream"
    )
    stream = Stream([{"messageStart": {"role": "assistant"}}, delta(0, text="hi")], error)
    got, _ = await streamed(stream)
    assert [e.error for e in got if e.error] == [
        "The provider failed mid-stream: modelStreamErrorException: boom"
    ]
    assert stream.closed


async def test_a_refused_stream_raises_on_entry() -> None:
    class Refusing:
        def converse_stream(self, **params: Any) -> Any:
            raise ClientError(
                {"Error": {"Code": "ServiceUnavailableException", "Message": "busy"},
                 "ResponseMetadata": {"HTTPStatusCode": 503}},
                "ConverseStream",
            )  # fmt: skip

    provider = BedrockConverse(client_factory=lambda _: Refusing())
    with pytest.raises(UpstreamFailed, match="answered 503"):
        async with provider.stream(route(), chat(True), 5):
            pass


def test_one_client_per_upstream_made_lazily() -> None:
    made: list[str] = []

    def factory(upstream: Upstream) -> object:
        made.append(upstream.name)
        return object()

    provider = BedrockConverse(client_factory=factory)
    assert made == []
    upstream = route().upstream
    assert provider.client(upstream) is provider.client(upstream)
    assert made == ["br"]


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"inputTokens": 10, "outputTokens": 2, "totalTokens": 12}, (10, 2, None, None)),
        (
            {
                "inputTokens": 10,
                "outputTokens": 2,
                "totalTokens": 42,
                "cacheReadInputTokens": 20,
                "cacheWriteInputTokens": 10,
            },
            (40, 2, 20, 10),
        ),
        ({}, None),
        ("nonsense", None),
    ],
)
def test_usage_adds_the_cache_to_the_input(usage: Any, expected: Any) -> None:
    got = bedrock_usage(usage)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert (
            got.input_tokens,
            got.output_tokens,
            got.cached_input_tokens,
            got.cache_write_input_tokens,
        ) == expected
