"""What an Anthropic client receives: SSE events built from normalized events or passed through
from an Anthropic upstream, the closing events on a finish and on a cut, whole replies, error
bodies and budget headers. The official ``anthropic`` SDK's types check every event and reply."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from hardcap_core.budgets import Budget, Dimension, Level, LevelKind, RateLimit, Window
from hardcap_core.errors import (
    AuthenticationFailed,
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ServiceUnavailable,
    TooManyRequests,
    UpstreamFailed,
    UpstreamTimeout,
)
from hardcap_core.events import Completion, Event, FinishReason, Output, OutputKind, Usage
from hardcap_core.ledger import BudgetState, RateState
from hardcap_core.wire.anthropic_messages import AnthropicMessages, MessageEncoder
from hardcap_core.wire.base import Charged

WIRE = AnthropicMessages()
EVENT = TypeAdapter(RawMessageStreamEvent)


def sse(data: bytes) -> list[dict[str, Any]]:
    """The events in ``data``, each checked: its ``event:`` name is its type, and the SDK
    can read it."""
    out = []
    for block in data.decode().split("\n\n"):
        if not block:
            continue
        name_line, data_line = block.split("\n")
        payload = json.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {payload['type']}"
        if payload["type"] not in ("error", "ping"):  # the SDK skips both before its types
            EVENT.validate_python(payload)
        out.append(payload)
    return out


def text(piece: str, kind: OutputKind = OutputKind.CONTENT) -> Event:
    return Event(output=[Output(kind, piece, 1)], tokens=1)


def openai_call(index: int, call_id: str | None, name: str = "", args: str = "") -> Event:
    """A tool-call delta as the OpenAI-compatible provider normalizes it, with its raw chunk."""
    call: dict[str, Any] = {"index": index, "function": {"name": name, "arguments": args}}
    if call_id:
        call["id"] = call_id
    raw = {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}
    output = []
    if name:
        output.append(Output(OutputKind.TOOL_NAME, name, 1, 0, index))
    if args:
        output.append(Output(OutputKind.TOOL_ARGUMENTS, args, 1, 0, index))
    return Event(raw=raw, output=output, tokens=len(output))


def run(encoder: MessageEncoder, evs: list[Event], *, cut: bool, charged: Charged) -> list[Any]:
    data = b"".join(encoder.event(e) or b"" for e in evs)
    return sse(data + encoder.close(for_length=cut, charged=charged))


def built(**kwargs: Any) -> MessageEncoder:
    return MessageEncoder("small", input_estimate=40, passthrough=False, **kwargs)


def test_blocks_from_normalized_events_thinking_text_then_tool_calls() -> None:
    evs = [
        text("hmm", OutputKind.REASONING),
        text(" ok", OutputKind.REASONING),
        text("Hello"),
        openai_call(0, "call_a", name="get_weather"),
        openai_call(0, None, args='{"city":'),
        openai_call(0, None, args='"Paris"}'),
        openai_call(1, "call_b", name="lookup", args="{}"),
        Event(finish=FinishReason.TOOL_CALLS),
    ]
    out = run(built(), evs, cut=False, charged=Charged(30, 9, Usage(30, 9)))
    kinds = [(e["type"], e.get("index")) for e in out]
    assert kinds == [
        ("message_start", None),
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("content_block_start", 3), ("content_block_delta", 3), ("content_block_stop", 3),
        ("message_delta", None), ("message_stop", None),
    ]  # fmt: skip
    assert out[0]["message"]["model"] == "small"
    assert out[0]["message"]["usage"]["input_tokens"] == 40  # the estimate admission held
    assert out[1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert out[2]["delta"] == {"type": "thinking_delta", "thinking": "hmm"}
    assert out[6]["delta"] == {"type": "text_delta", "text": "Hello"}
    tool = out[8]["content_block"]
    assert tool == {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {}}
    assert out[9]["delta"] == {"type": "input_json_delta", "partial_json": '{"city":'}
    assert out[12]["content_block"]["id"] == "call_b"
    end = out[-2]
    assert end["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert end["usage"]["output_tokens"] == 9 and end["usage"]["input_tokens"] == 30


@pytest.mark.parametrize(
    ("finish", "reason"),
    [
        (FinishReason.STOP, "end_turn"),
        (FinishReason.LENGTH, "max_tokens"),
        (FinishReason.CONTENT_FILTER, "refusal"),
        (FinishReason.OTHER, "end_turn"),
        (None, "end_turn"),
    ],
)
def test_stop_reasons(finish: FinishReason | None, reason: str) -> None:
    out = run(built(), [text("a"), Event(finish=finish)], cut=False, charged=Charged(1, 1, None))
    assert out[-2]["delta"]["stop_reason"] == reason


def test_a_cut_closes_the_open_block_and_says_max_tokens_with_the_charge() -> None:
    evs = [text("thinking", OutputKind.REASONING), openai_call(0, "call_a", name="f")]
    out = run(built(), evs, cut=True, charged=Charged(12, 60, None))
    kinds = [e["type"] for e in out]
    # The tool call was cut before its arguments: its block still starts and stops.
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 2
    assert out[-2]["delta"]["stop_reason"] == "max_tokens"
    assert out[-2]["usage"]["output_tokens"] == 60 and out[-2]["usage"]["input_tokens"] == 12
    assert kinds[-1] == "message_stop"


def test_a_stream_that_ends_before_any_event_still_opens_and_closes_the_message() -> None:
    out = sse(built().close(for_length=True, charged=Charged(5, 0, None)))
    assert [e["type"] for e in out] == ["message_start", "message_delta", "message_stop"]


def test_empty_events_send_nothing_and_audio_bytes_are_not_text() -> None:
    encoder = built()
    assert encoder.event(Event()) is not None  # the first one opens the message
    assert encoder.event(Event()) is None
    audio = Event(output=[Output(OutputKind.OTHER, "", 8)], tokens=8)
    assert encoder.event(audio) is None


def test_usage_reports_cache_reads_and_writes_beside_the_uncached_input() -> None:
    usage = Usage(1000, 10, cached_input_tokens=600, cache_write_input_tokens=300)
    charged = Charged(1000, 10, usage, cost_nusd=2_500_000)
    out = run(built(), [text("x")], cut=False, charged=charged)
    assert out[-2]["usage"] == {
        "input_tokens": 100,
        "cache_read_input_tokens": 600,
        "cache_creation_input_tokens": 300,
        "output_tokens": 10,
        # the extension field: the charge in the gateway's terms, cost included
        "hardcap": {"cost_usd": 0.0025, "input_tokens": 1000, "output_tokens": 10,
                    "estimate": False},
    }  # fmt: skip


def anthropic_raw() -> list[Event]:
    """An Anthropic upstream's events as its provider yields them (raw = the event JSON)."""
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_up", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 21, "output_tokens": 1},
        },
    }  # fmt: skip
    block = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    delta = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "Hi"},
    }
    return [
        Event(raw=start),
        Event(raw={"type": "ping"}),
        Event(raw=block),
        Event(raw=delta, output=[Output(OutputKind.CONTENT, "Hi", 1)], tokens=1),
    ]  # fmt: skip


def test_passthrough_renames_the_model_and_sends_message_delta_with_the_charge() -> None:
    encoder = MessageEncoder("small", input_estimate=40, passthrough=True)
    stop = {"type": "content_block_stop", "index": 0}
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "stop_sequence", "stop_sequence": "END"},
        "usage": {"output_tokens": 7, "server_tool_use": None},
    }
    evs = [*anthropic_raw(), Event(raw=stop), Event(raw=delta, finish=FinishReason.STOP)]
    out = run(encoder, evs, cut=False, charged=Charged(21, 7, Usage(21, 7)))
    assert [e["type"] for e in out] == [
        "message_start", "ping", "content_block_start", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert out[0]["message"]["model"] == "small" and out[0]["message"]["id"] == "msg_up"
    assert out[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert out[-2]["usage"]["output_tokens"] == 7 and out[-2]["usage"]["input_tokens"] == 21


def test_passthrough_cut_stops_open_blocks_and_says_max_tokens() -> None:
    encoder = MessageEncoder("small", input_estimate=40, passthrough=True)
    out = run(encoder, anthropic_raw(), cut=True, charged=Charged(21, 3, None))
    assert [e["type"] for e in out][-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert out[-3]["index"] == 0
    assert out[-2]["delta"]["stop_reason"] == "max_tokens"
    assert out[-2]["usage"]["output_tokens"] == 3


def test_reply_built_from_an_openai_completion_is_an_sdk_message() -> None:
    raw = {"choices": [{"message": {"tool_calls": [{"id": "call_z", "function": {"name": "f"}}]}}]}
    output = [
        Output(OutputKind.CONTENT, "Let me check.", 3),
        Output(OutputKind.REASONING, "User wants f.", 4),
        Output(OutputKind.TOOL_NAME, "f", 1, 0, 0),
        Output(OutputKind.TOOL_ARGUMENTS, '{"q": 1}', 3, 0, 0),
    ]
    completion = Completion(raw, output, 11, Usage(20, 11), FinishReason.TOOL_CALLS)
    body = WIRE.reply(completion, model="small", same_dialect=False, charged=Charged(20, 11, None))
    message = Message.model_validate(body)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    tool = message.content[2]
    assert tool.type == "tool_use" and tool.id == "call_z" and tool.input == {"q": 1}
    assert message.stop_reason == "tool_use" and message.model == "small"
    assert message.usage.input_tokens == 20 and message.usage.output_tokens == 11


def test_reply_with_arguments_cut_short_has_an_empty_input() -> None:
    output = [Output(OutputKind.TOOL_NAME, "f", 1), Output(OutputKind.TOOL_ARGUMENTS, '{"q', 1)]
    completion = Completion({}, output, 2, None, FinishReason.LENGTH)
    body = WIRE.reply(completion, model="small", same_dialect=False, charged=Charged(5, 2, None))
    message = Message.model_validate(body)
    assert message.stop_reason == "max_tokens"
    tool = message.content[0]
    assert tool.type == "tool_use" and tool.input == {} and tool.id.startswith("toolu_")


def test_same_dialect_reply_keeps_the_providers_body_with_the_charged_usage() -> None:
    raw = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 100},
    }  # fmt: skip
    usage = Usage(105, 2, cached_input_tokens=100, raw=raw["usage"])  # type: ignore[arg-type]
    completion = Completion(raw, [Output(OutputKind.CONTENT, "hi", 2)], 2, usage, None)
    body = WIRE.reply(completion, model="small", same_dialect=True, charged=Charged(105, 2, usage))
    message = Message.model_validate(body)
    assert message.model == "small" and message.id == "msg_1"
    assert message.usage.input_tokens == 5 and message.usage.cache_read_input_tokens == 100


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (InvalidRequest("bad"), "invalid_request_error"),
        (AuthenticationFailed("who"), "authentication_error"),
        (PermissionDenied("no"), "permission_error"),
        (NotFound("none"), "not_found_error"),
        (MethodNotAllowed("GET"), "invalid_request_error"),
        (PayloadTooLarge("big"), "request_too_large"),
        (TooManyRequests("slow", code="budget_exceeded"), "rate_limit_error"),
        (UpstreamFailed("down"), "api_error"),
        (ServiceUnavailable("cache"), "overloaded_error"),
        (UpstreamTimeout("late"), "timeout_error"),
        (GatewayError("bug"), "api_error"),
    ],
)
def test_error_bodies_in_anthropics_shape(error: GatewayError, kind: str) -> None:
    body = WIRE.error_body(error)
    assert body["type"] == "error"
    assert body["error"]["type"] == kind and body["error"]["message"] == error.message
    event = sse(built().error(error))
    assert event == [body]


def test_budget_headers_add_anthropics_ratelimit_headers() -> None:
    tenant = Level(LevelKind.TENANT, "t")
    budget = Budget(tenant, Dimension.TOTAL_TOKENS, 1000, Window.parse("day"))
    rate = RateState(RateLimit(tenant, requests_per_minute=60), 59, 1000, None, None)
    now = 1_700_000_000_000
    headers = WIRE.budget_headers([BudgetState(budget, 400, 3_600_000)], [rate], now)
    assert headers["x-token-budget-remaining"] == "400"  # the OpenAI-style set, unchanged
    assert headers["x-ratelimit-remaining-requests"] == "59"
    assert headers["anthropic-ratelimit-tokens-limit"] == "1000"
    assert headers["anthropic-ratelimit-tokens-remaining"] == "400"
    assert headers["anthropic-ratelimit-tokens-reset"] == "2023-11-14T23:13:20Z"
    assert headers["anthropic-ratelimit-requests-remaining"] == "59"
    assert headers["anthropic-ratelimit-requests-reset"] == "2023-11-14T22:13:21Z"
