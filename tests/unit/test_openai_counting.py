"""The OpenAI-compatible provider: every billed field of a chunk or reply is counted, odd chunks
never raise, and the body sent upstream carries the route's model and the gateway's cap.

The upstream is a :class:`~hardcap_core.providers.transport.CallbackTransport`: the transport
is what a provider is given, so this is the provider's own code path end to end. (How the real
transport frames and decodes bytes is tested in tests/functional/test_transport_conformance.py.)
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from hardcap_core import sse
from hardcap_core.chat import ChatRequest
from hardcap_core.config import Route, parse_config
from hardcap_core.errors import GatewayError, InvalidRequest, TooManyRequests, UpstreamFailed
from hardcap_core.events import Event, FinishReason, Output, OutputKind
from hardcap_core.providers.openai_compat import AUDIO_BYTES_PER_TOKEN, OpenAICompatible
from hardcap_core.providers.transport import CallbackTransport, UpstreamRequest
from hardcap_core.wire.openai_request import parse_chat_request

CPT = 4.0  # chars per token: a delta of up to 8 characters is one token
LONG = "x" * 40  # 10 tokens by length
PROVIDER = OpenAICompatible(CallbackTransport(lambda _: (500, {}, [])), chars_per_token=CPT)
Answer = tuple[int, dict[str, str], Sequence[bytes]]


def response(
    status: int,
    *,
    json_body: Any = None,
    content: bytes | Sequence[bytes] = b"",
    headers: dict[str, str] | None = None,
) -> Answer:
    """What the upstream answers: a status, headers and the body's pieces (one per read)."""
    if json_body is not None:
        content = json.dumps(json_body).encode()
    pieces = [content] if isinstance(content, bytes) else list(content)
    return status, headers or {}, pieces


def decode(chunk: dict[str, Any] | str) -> Event:
    """The event for one SSE data string (a chunk object, or a literal such as [DONE])."""
    return PROVIDER._event(chunk if isinstance(chunk, str) else json.dumps(chunk))


def delta_chunk(*deltas: Any, finish: Any = None) -> dict[str, Any]:
    """A chat.completion.chunk with one choice per delta."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "up-model",
        "choices": [
            {"index": i, "delta": d, "finish_reason": finish} for i, d in enumerate(deltas)
        ],
    }


def pieces(event: Event) -> list[tuple[OutputKind, str, int, int, int | None]]:
    return [(o.kind, o.text, o.tokens, o.choice, o.tool_call) for o in event.output]


# -- text fields -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "kind"),
    [
        ("content", OutputKind.CONTENT),
        ("reasoning", OutputKind.REASONING),
        ("reasoning_content", OutputKind.REASONING),
        ("thinking", OutputKind.REASONING),
        ("refusal", OutputKind.REFUSAL),
    ],
)
@pytest.mark.parametrize(
    ("text", "tokens"), [("Hi", 1), ("12345678", 1), ("123456789", 3), (LONG, 10)]
)
def test_each_billed_text_field_is_counted_with_its_kind(
    field: str, kind: OutputKind, text: str, tokens: int
) -> None:
    event = decode(delta_chunk({field: text}))
    assert pieces(event) == [(kind, text, tokens, 0, None)]
    assert event.tokens == tokens


def test_every_field_of_one_delta_is_counted() -> None:
    event = decode(
        delta_chunk({"reasoning_content": "hm", "content": "Hi", "refusal": "no", "thinking": LONG})
    )
    assert sorted(o.kind for o in event.output) == sorted(
        [OutputKind.CONTENT, OutputKind.REASONING, OutputKind.REASONING, OutputKind.REFUSAL]
    )
    assert event.tokens == 1 + 1 + 1 + 10


@pytest.mark.parametrize(
    "delta",
    [
        {"role": "assistant"},
        {"role": "assistant", "content": ""},
        {},
        {"content": None, "reasoning": None, "refusal": None, "audio": None},
        {"tool_calls": None, "function_call": None, "annotations": [], "x_new": {}},
        {"tool_calls": []},
        {"tool_calls": [{"index": 0, "function": {"name": "", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "id": "call_abc123", "type": "function"}]},
        {"function_call": {"arguments": ""}},
        {"audio": {"id": "audio_67153952b364819093d6a4aac6e0767a"}},
        {"audio": {"expires_at": 1729447778, "data": "", "transcript": ""}},
        {"role": "assistant", "token_id": 50256, "obfuscation": "Xq3kP9zr"},
        {"x_new": 0, "y_new": False, "z_new": None},
    ],
)
def test_deltas_without_billed_output_count_nothing(delta: dict[str, Any]) -> None:
    """Labels, ids, expiry, padding and empty values are the only fields that are free."""
    event = decode(delta_chunk(delta))
    assert event.output == [] and event.tokens == 0
    assert event.error is None and not event.done


# -- fields the decoder has no rule for ----------------------------------------------------------


@pytest.mark.parametrize(
    ("delta", "kind", "tokens"),
    [
        ({"x_new": "Hi"}, OutputKind.OTHER, 1),  # a short streamed piece: one token
        ({"x_new": LONG}, OutputKind.OTHER, 10),
        ({"x_new": {"text": LONG}}, OutputKind.OTHER, 13),  # '{"text":"x...x"}': 51 characters
        ({"x_new": 7}, OutputKind.OTHER, 1),
        ({"x_new": [1, 2]}, OutputKind.OTHER, 2),  # "[1,2]"
        # OpenRouter: reasoning as a list of parts next to (or instead of) `reasoning`.
        (
            {"reasoning_details": [{"type": "reasoning.text", "text": LONG}]},
            OutputKind.OTHER,
            20,  # [{"type":"reasoning.text","text":"x...x"}]: 77 characters
        ),
        # Mistral: content as a list of parts, not a string.
        ({"content": [{"type": "text", "text": LONG}]}, OutputKind.CONTENT, 17),  # 67 characters
        ({"refusal": {"a": 1}}, OutputKind.REFUSAL, 2),
        ({"reasoning_content": ["x"]}, OutputKind.REASONING, 2),
        ({"content": 5}, OutputKind.CONTENT, 1),
    ],
)
def test_a_field_without_a_rule_counts_by_its_length(
    delta: dict[str, Any], kind: OutputKind, tokens: int
) -> None:
    """A provider's new output field (or an old one in a new shape) must never be free: it is
    counted by its length, as text if it is a string, else as its compact JSON."""
    event = decode(delta_chunk(delta))
    assert [(o.kind, o.tokens) for o in event.output] == [(kind, tokens)]
    assert event.tokens == tokens


@pytest.mark.parametrize(
    ("delta", "tokens"),
    [
        # Gemini's thought signature rides on a tool call.
        ({"tool_calls": [{"index": 0, "extra_content": {"sig": LONG}}]}, 13),  # 50 characters
        ({"tool_calls": [{"index": 0, "function": {"arguments": "{}", "strict": LONG}}]}, 1 + 10),
        ({"function_call": {"name": "f", "x_new": LONG}}, 1 + 10),
        ({"audio": {"id": "audio_1", "x_new": LONG}}, 10),
    ],
)
def test_a_field_without_a_rule_inside_a_call_or_audio_counts_by_its_length(
    delta: dict[str, Any], tokens: int
) -> None:
    assert decode(delta_chunk(delta)).tokens == tokens


# -- audio ---------------------------------------------------------------------------------------


def b64(size: int) -> str:
    """Base64 of ``size`` bytes of (silent) audio."""
    return base64.b64encode(bytes(size)).decode()


@pytest.mark.parametrize(
    ("size", "tokens"),
    [
        (1, 1),  # any audio at all is at least a token
        (1_200, 1),
        (1_600, 1),  # AUDIO_BYTES_PER_TOKEN
        (1_601, 2),
        (4_800, 3),  # 100 ms of 24 kHz 16-bit mono PCM, which OpenAI bills as 2 tokens
        (48_000, 30),  # one second, which OpenAI bills as 20
    ],
)
def test_audio_data_counts_by_its_decoded_size(size: int, tokens: int) -> None:
    event = decode(delta_chunk({"audio": {"data": b64(size)}}))
    assert pieces(event) == [(OutputKind.OTHER, "", tokens, 0, None)]
    assert AUDIO_BYTES_PER_TOKEN == 1_600


@pytest.mark.parametrize("seconds", [0.05, 0.1, 1.0, 7.3, 60.0])
def test_audio_never_counts_less_than_openai_bills_for_it(seconds: float) -> None:
    """OpenAI bills assistant audio at 1 token per 50 ms and streams it as 24 kHz 16-bit mono
    PCM (48,000 bytes a second): the count must be at least that."""
    size = round(48_000 * seconds)
    billed = math.ceil(seconds / 0.05)
    assert decode(delta_chunk({"audio": {"data": b64(size)}})).tokens >= billed


def test_an_audio_stream_counts_its_transcript_as_text_and_its_data_by_size() -> None:
    # The shape OpenAI streams: the id with the first transcript piece, then transcript and
    # data pieces, then the expiry alone.
    deltas = [
        {"content": None, "audio": {"id": "audio_1", "transcript": "Hi"}},
        {"audio": {"transcript": LONG}},
        {"audio": {"data": b64(16_000)}},
        {"audio": {"transcript": " there", "data": b64(3_200)}},
        {"audio": {"expires_at": 1729447778}},
    ]
    assert [decode(delta_chunk(d)).tokens for d in deltas] == [1, 10, 10, 1 + 2, 0]
    transcript = decode(delta_chunk(deltas[0])).output[0]
    assert (transcript.kind, transcript.text) == (OutputKind.OTHER, "Hi")


def test_a_whole_audio_message_counts_its_audio_and_transcript() -> None:
    outputs = message_outputs(
        {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "audio": {
                "id": "audio_1",
                "data": b64(48_000 * 2),
                "expires_at": 1729447778,
                "transcript": LONG,
            },
        }
    )
    assert [(o.kind, o.tokens) for o in outputs] == [(OutputKind.OTHER, 60), (OutputKind.OTHER, 10)]


# -- tool calls ---------------------------------------------------------------------------------


def test_several_tool_calls_in_one_chunk_count_name_and_arguments_with_their_index() -> None:
    event = decode(
        delta_chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    },
                    {
                        "index": 1,
                        "function": {"name": "f", "arguments": '{"city": "Paris, France"}'},
                    },
                    {"index": 3, "function": {"arguments": "{}"}},
                ]
            }
        )
    )
    assert pieces(event) == [
        (OutputKind.TOOL_NAME, "get_weather", 3, 0, 0),
        (OutputKind.TOOL_NAME, "f", 1, 0, 1),
        (OutputKind.TOOL_ARGUMENTS, '{"city": "Paris, France"}', 7, 0, 1),
        (OutputKind.TOOL_ARGUMENTS, "{}", 1, 0, 3),
    ]
    assert event.tokens == 3 + 1 + 7 + 1


def test_a_tool_call_without_an_index_takes_its_position() -> None:
    event = decode(
        delta_chunk({"tool_calls": [{"function": {"name": "a"}}, {"function": {"name": "b"}}]})
    )
    assert [o.tool_call for o in event.output] == [0, 1]


def test_legacy_function_call_is_counted() -> None:
    event = decode(delta_chunk({"function_call": {"name": "lookup", "arguments": LONG}}))
    assert pieces(event) == [
        (OutputKind.TOOL_NAME, "lookup", 1, 0, None),
        (OutputKind.TOOL_ARGUMENTS, LONG, 10, 0, None),
    ]


def test_text_and_tool_calls_of_several_choices_are_all_counted() -> None:
    event = decode(
        delta_chunk(
            {"content": "Hi"},
            {"reasoning": LONG, "tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
            finish="stop",
        )
    )
    assert pieces(event) == [
        (OutputKind.CONTENT, "Hi", 1, 0, None),
        (OutputKind.REASONING, LONG, 10, 1, None),
        (OutputKind.TOOL_ARGUMENTS, "{}", 1, 1, 0),
    ]
    assert event.tokens == 12
    assert event.finish is FinishReason.STOP


# -- finish reasons -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "finish"),
    [
        ("stop", FinishReason.STOP),
        ("length", FinishReason.LENGTH),
        ("tool_calls", FinishReason.TOOL_CALLS),
        ("content_filter", FinishReason.CONTENT_FILTER),
        ("function_call", FinishReason.FUNCTION_CALL),
        ("eos_token", FinishReason.OTHER),  # a provider's own vocabulary
        ("end_turn", FinishReason.OTHER),
        (None, None),
        ("", None),
        (3, None),
    ],
)
def test_finish_reasons_map_to_openai_vocabulary(value: Any, finish: FinishReason | None) -> None:
    assert decode(delta_chunk({}, finish=value)).finish is finish


def test_the_finish_of_any_choice_is_kept() -> None:
    chunk = delta_chunk({"content": "a"}, {"content": "b"})
    chunk["choices"][1]["finish_reason"] = "length"
    assert decode(chunk).finish is FinishReason.LENGTH


# -- usage ---------------------------------------------------------------------------------------


def test_usage_with_nested_details_is_parsed_and_kept_raw() -> None:
    raw = {
        "prompt_tokens": 12,
        "completion_tokens": 340,
        "total_tokens": 352,
        "completion_tokens_details": {"reasoning_tokens": 300},
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    event = decode({**delta_chunk(), "choices": [], "usage": raw})
    assert event.usage is not None
    assert (event.usage.input_tokens, event.usage.output_tokens) == (12, 340)
    assert (event.usage.reasoning_tokens, event.usage.cached_input_tokens) == (300, 8)
    assert event.usage.raw == raw
    assert event.tokens == 0


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 5}, (5, None, None, None)),
        ({"prompt_tokens": True, "completion_tokens": False}, (None, None, None, None)),
        ({"prompt_tokens": 1.5, "completion_tokens": "7"}, (None, None, None, None)),
        (
            {
                "completion_tokens": 3,
                "completion_tokens_details": {"reasoning_tokens": True},
                "prompt_tokens_details": {"cached_tokens": None},
            },
            (None, 3, None, None),
        ),
        (
            {"completion_tokens_details": 5, "prompt_tokens_details": [1]},
            (None, None, None, None),
        ),
    ],
)
def test_usage_counts_must_be_integers(
    usage: dict[str, Any], expected: tuple[int | None, ...]
) -> None:
    parsed = decode({**delta_chunk(), "usage": usage}).usage
    assert parsed is not None
    got = (parsed.input_tokens, parsed.output_tokens, parsed.reasoning_tokens)
    assert (*got, parsed.cached_input_tokens) == expected


@pytest.mark.parametrize("usage", [None, {}, 5, "x", [1, 2]])
def test_no_usage_object_is_no_usage(usage: Any) -> None:
    assert decode({**delta_chunk({"content": "a"}), "usage": usage}).usage is None


# -- stream markers, errors and odd shapes -------------------------------------------------------


def test_done_marker_ends_the_stream() -> None:
    event = decode(sse.DONE)
    assert event.done and event.error is None and event.tokens == 0


@pytest.mark.parametrize("data", ["{not json", '{"choices": [', "", "data: {}"])
def test_malformed_json_is_an_error_event(data: str) -> None:
    event = decode(data)
    assert event.error is not None and "malformed" in event.error
    assert not event.done


@pytest.mark.parametrize(
    ("data", "tokens"),
    [
        ("[1, 2]", 2),
        ('"text"', 1),
        ("42", 1),
        ("null", 0),
        ("true", 1),
        # A chunk wrapped in an array: never free, though it is not forwarded.
        (json.dumps([delta_chunk({"content": LONG})]), 49),  # 193 characters
    ],
)
def test_json_that_is_not_an_object_counts_by_its_length(data: str, tokens: int) -> None:
    event = decode(data)
    assert (event.error, event.done, event.usage, event.raw) == (None, False, None, None)
    assert event.tokens == tokens


@pytest.mark.parametrize(
    ("error", "says"),
    [
        ({"message": "overloaded", "type": "server_error"}, "overloaded"),
        ("boom", "boom"),
        ({"code": 500}, "error"),
        (None, "error"),
    ],
)
def test_an_error_object_in_the_stream_is_an_error_event(error: Any, says: str) -> None:
    event = decode({"error": error})
    assert event.error is not None and says in event.error
    assert event.tokens == 0


@pytest.mark.parametrize(
    "chunk",
    [
        {"choices": [None]},
        {"choices": "x"},
        {"choices": None},
        {"choices": [None, 1, "x", []]},  # not choices: nothing in them is a delta
        {"choices": [{"delta": None}]},
        {"choices": [{"delta": {"tool_calls": [None, {"function": None}]}}]},
        {"choices": [], "usage": 5},
        {"usage": {"completion_tokens_details": "x"}},
        {},
    ],
)
def test_odd_chunk_shapes_do_not_raise_and_bill_nothing(chunk: dict[str, Any]) -> None:
    event = decode(chunk)
    assert event.error is None and event.tokens == 0 and event.output == []


@pytest.mark.parametrize(
    ("delta", "tokens"),
    [
        ("text", 1),
        ({"tool_calls": "x"}, 1),
        ({"tool_calls": [None, 1, {"function": None}]}, 1),
        ({"tool_calls": [{"index": "0", "function": "f"}]}, 1),
        ({"function_call": "x"}, 1),
        ({"audio": "x"}, 1),
        ({"audio": {"data": 12345}}, 2),
    ],
)
def test_a_malformed_delta_does_not_raise_and_counts_what_it_holds(delta: Any, tokens: int) -> None:
    event = decode({"choices": [{"delta": delta}]})
    assert event.error is None and event.tokens == tokens


def test_a_tool_call_with_a_non_integer_index_is_still_counted() -> None:
    event = decode(delta_chunk({"tool_calls": [{"index": "0", "function": {"name": "f"}}]}))
    assert pieces(event) == [(OutputKind.TOOL_NAME, "f", 1, 0, None)]


# -- whole replies -------------------------------------------------------------------------------


def message_outputs(message: Any) -> list[Output]:
    return PROVIDER._outputs(message, 0)


def test_a_whole_message_counts_every_billed_field() -> None:
    outputs = message_outputs(
        {
            "role": "assistant",
            "content": LONG,
            "reasoning_content": "why",
            "refusal": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": LONG}},
            ],
        }
    )
    assert [(o.kind, o.tokens, o.tool_call) for o in outputs] == [
        (OutputKind.CONTENT, 10, None),
        (OutputKind.REASONING, 1, None),
        (OutputKind.TOOL_NAME, 1, 0),
        (OutputKind.TOOL_ARGUMENTS, 1, 0),
        (OutputKind.TOOL_NAME, 1, 1),
        (OutputKind.TOOL_ARGUMENTS, 10, 1),
    ]


# -- through the HTTP client ---------------------------------------------------------------------


def route(**upstream: Any) -> Route:
    """The route `pub` to model `up-model` of upstream `up` (with ``upstream`` settings)."""
    config = parse_config(
        {
            "gateway": {"redis_url": "redis://localhost:1"},
            "upstreams": [
                {"name": "up", "base_url": "http://up.test/v1/", "timeout_seconds": 5, **upstream}
            ],
            "routes": [
                {
                    "name": "pub",
                    "upstream": "up",
                    "model": "up-model",
                    "price": {"input_per_million": 1.0, "output_per_million": 2.0},
                    "max_output_tokens": 1000,
                }
            ],
            "tenants": [],
        }
    )
    return config.routes["pub"]


def chat(**fields: Any) -> ChatRequest:
    body = {"model": "pub", "messages": [{"role": "user", "content": "hello"}], **fields}
    return parse_chat_request(json.dumps(body).encode())


class Upstream:
    """A transport that records what it was sent and answers with ``respond``."""

    def __init__(self, respond: Callable[[UpstreamRequest], Answer]) -> None:
        self.transport = CallbackTransport(respond)

    @property
    def requests(self) -> list[UpstreamRequest]:
        return self.transport.sent

    def provider(self) -> OpenAICompatible:
        return OpenAICompatible(self.transport, chars_per_token=CPT)

    @property
    def body(self) -> dict[str, Any]:
        (request,) = self.requests
        body: dict[str, Any] = json.loads(request.body)
        return body


def sse_stream(*chunks: dict[str, Any] | str) -> bytes:
    return b"".join(sse.encode(c) for c in chunks)


STREAM = sse_stream(
    delta_chunk({"role": "assistant"}),
    delta_chunk({"reasoning": "think"}),
    delta_chunk({"content": LONG}),
    delta_chunk({}, finish="stop"),
    {**delta_chunk(), "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 11}},
    sse.DONE,
)
REPLY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "up-model",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": LONG, "reasoning": "think"},
            "finish_reason": "length",
        }
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 11, "total_tokens": 20},
}


def answer_stream(_: UpstreamRequest) -> Answer:
    return response(200, headers={"content-type": "text/event-stream"}, content=STREAM)


def answer_reply(_: UpstreamRequest) -> Answer:
    return response(200, json_body=REPLY)


async def read_all(provider: OpenAICompatible, request: ChatRequest, cap: int = 50) -> list[Event]:
    async with provider.stream(route(), request, cap) as reads:
        return [event async for read in reads for event in read]


async def test_a_stream_is_decoded_into_counted_events() -> None:
    events = await read_all(Upstream(answer_stream).provider(), chat(stream=True))
    assert [e.tokens for e in events] == [0, 1, 10, 0, 0, 0]
    assert events[3].finish is FinishReason.STOP
    assert events[4].usage is not None and events[4].usage.output_tokens == 11
    assert events[-1].done


async def test_a_whole_reply_is_counted() -> None:
    completion = await Upstream(answer_reply).provider().complete(route(), chat(), 50)
    assert completion.tokens == 10 + 1  # "think" is one short token
    assert [o.kind for o in completion.output] == [OutputKind.CONTENT, OutputKind.REASONING]
    assert completion.finish is FinishReason.LENGTH
    assert completion.usage is not None and completion.usage.input_tokens == 9
    assert completion.raw == REPLY


async def test_a_whole_reply_counts_every_choice() -> None:
    reply = {
        **REPLY,
        "choices": [
            {"index": 0, "message": {"content": "a"}, "finish_reason": None},
            {"index": 1, "message": {"content": LONG}, "finish_reason": "stop"},
            None,
        ],
    }
    provider = Upstream(lambda _: response(200, json_body=reply)).provider()
    completion = await provider.complete(route(), chat(), 50)
    assert [(o.choice, o.tokens) for o in completion.output] == [(0, 1), (1, 10)]
    assert completion.finish is FinishReason.STOP


@pytest.mark.parametrize("content", [b"<html>oops</html>", b"[1, 2]", b'"text"'])
async def test_a_reply_that_is_not_a_json_object_fails_cleanly(content: bytes) -> None:
    provider = Upstream(lambda _: response(200, content=content)).provider()
    with pytest.raises(UpstreamFailed):
        await provider.complete(route(), chat(), 50)


@pytest.mark.parametrize(
    ("fields", "cap_field"),
    [
        ({}, "max_tokens"),
        ({"max_tokens": 300}, "max_tokens"),
        ({"max_completion_tokens": 300}, "max_completion_tokens"),
        ({"max_tokens": 200, "max_completion_tokens": 300}, "max_completion_tokens"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_the_body_sent_upstream_has_the_route_model_and_the_gateway_cap(
    fields: dict[str, Any], cap_field: str, stream: bool
) -> None:
    upstream = Upstream(answer_stream if stream else answer_reply)
    provider = upstream.provider()
    request = chat(stream=stream, **fields)
    if stream:
        await read_all(provider, request, cap=77)
    else:
        await provider.complete(route(), request, 77)
    body = upstream.body
    assert body["model"] == "up-model"
    assert body[cap_field] == 77
    other = {"max_tokens", "max_completion_tokens"} - {cap_field}
    assert other.isdisjoint(body)
    assert body["messages"] == request.messages
    assert str(upstream.requests[0].url) == "http://up.test/v1/chat/completions"


@pytest.mark.parametrize(
    ("options", "sent"),
    [
        (None, {"include_usage": True}),
        ({"include_usage": False}, {"include_usage": True}),
        ({"include_usage": True}, {"include_usage": True}),
        (
            {"include_usage": False, "continuous_usage_stats": True},
            {"include_usage": True, "continuous_usage_stats": True},
        ),
    ],
)
async def test_a_stream_always_asks_for_usage_and_keeps_other_stream_options(
    options: dict[str, Any] | None, sent: dict[str, Any]
) -> None:
    upstream = Upstream(answer_stream)
    fields = {} if options is None else {"stream_options": options}
    await read_all(upstream.provider(), chat(stream=True, **fields))
    assert upstream.body["stream_options"] == sent
    assert upstream.body["stream"] is True


async def test_a_stream_asks_for_no_compression_and_an_event_stream() -> None:
    upstream = Upstream(answer_stream)
    await read_all(upstream.provider(), chat(stream=True))
    headers = upstream.requests[0].headers
    assert headers["accept-encoding"] == "identity"
    assert headers["accept"] == "text/event-stream"


async def test_a_whole_reply_does_not_get_stream_options_added() -> None:
    upstream = Upstream(answer_reply)
    await upstream.provider().complete(route(), chat(), 50)
    assert "stream_options" not in upstream.body


@pytest.mark.parametrize("stream", [False, True])
async def test_fields_the_gateway_does_not_know_pass_through_unchanged(stream: bool) -> None:
    extra = {
        "temperature": 0.2,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": "auto",
        "response_format": {"type": "json_object"},
        "seed": 7,
        "user": "u-1",
        "logit_bias": {"50256": -100},
        "x_vendor": {"nested": [1, None, "two"]},
    }
    upstream = Upstream(answer_stream if stream else answer_reply)
    provider = upstream.provider()
    request = chat(stream=stream, **extra)
    if stream:
        await read_all(provider, request)
    else:
        await provider.complete(route(), request, 50)
    assert {k: upstream.body[k] for k in extra} == extra
    assert request.body["model"] == "pub"  # the client's request is not changed in place


async def test_the_upstream_key_is_sent_as_a_bearer_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UP_KEY", "sk-upstream")
    upstream = Upstream(answer_reply)
    await upstream.provider().complete(route(api_key_env="UP_KEY"), chat(), 50)
    assert upstream.requests[0].headers["authorization"] == "Bearer sk-upstream"


async def test_a_stream_split_anywhere_decodes_the_same() -> None:
    def answer(_: UpstreamRequest) -> Answer:
        return response(200, content=[STREAM[i : i + 1] for i in range(len(STREAM))])

    events = await read_all(Upstream(answer).provider(), chat(stream=True))
    assert [e.tokens for e in events] == [0, 1, 10, 0, 0, 0]


async def test_a_stream_without_a_final_blank_line_still_delivers_its_last_event() -> None:
    data = STREAM + b"data: " + json.dumps(delta_chunk({"content": LONG})).encode()

    def answer(_: UpstreamRequest) -> Answer:
        return response(200, content=data)

    events = await read_all(Upstream(answer).provider(), chat(stream=True))
    assert events[-1].tokens == 10


@pytest.mark.parametrize(
    ("status", "error"),
    [(400, InvalidRequest), (429, TooManyRequests), (500, UpstreamFailed), (401, UpstreamFailed)],
)
async def test_an_error_status_fails_the_stream_on_opening(
    status: int, error: type[GatewayError]
) -> None:
    def answer(_: UpstreamRequest) -> Answer:
        return response(status, json_body={"error": {"message": "nope"}})

    with pytest.raises(error):
        await read_all(Upstream(answer).provider(), chat(stream=True))
