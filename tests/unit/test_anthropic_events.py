"""Anthropic Messages events decoded: every billed delta counted, usage merged from two events
with the cache added in, finish reasons mapped, malformed events turned into errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hardcap_core.events import FinishReason, OutputKind
from hardcap_core.providers.anthropic_events import MessageDecoder, completion


def feed(decoder: MessageDecoder, payload: Any) -> Any:
    return decoder.event(payload if isinstance(payload, str) else json.dumps(payload))


def delta(index: int, **body: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": body}


def test_every_delta_kind_is_counted_by_its_kind() -> None:
    d = MessageDecoder(4.0)
    feed(d, {"type": "content_block_start", "index": 0,
             "content_block": {"type": "thinking", "thinking": "", "signature": ""}})  # fmt: skip
    think = feed(d, delta(0, type="thinking_delta", thinking="Let me see"))
    sig = feed(d, delta(0, type="signature_delta", signature="A" * 400))
    feed(
        d,
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    )
    text = feed(d, delta(1, type="text_delta", text="Hello there, friend"))
    start = feed(d, {"type": "content_block_start", "index": 2, "content_block": {
        "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}})  # fmt: skip
    args = feed(d, delta(2, type="input_json_delta", partial_json='{"city": "Oslo"}'))
    cite = feed(d, delta(1, type="citations_delta", citation={"cited_text": "x" * 40}))
    assert [(o.kind, o.text) for o in think.output] == [(OutputKind.REASONING, "Let me see")]
    assert think.tokens == 3  # a multi-token delta, by its length
    (signature,) = sig.output
    assert (signature.kind, signature.text, signature.least) == (OutputKind.REASONING, "", 0)
    assert sig.tokens == 100  # counted by its length
    assert [(o.kind, o.tokens) for o in text.output] == [(OutputKind.CONTENT, 5)]
    assert [(o.kind, o.text, o.tool_call) for o in start.output] == [
        (OutputKind.TOOL_NAME, "get_weather", 0)
    ]
    assert [(o.kind, o.tool_call) for o in args.output] == [(OutputKind.TOOL_ARGUMENTS, 0)]
    assert cite.tokens > 10 and {o.kind for o in cite.output} == {OutputKind.OTHER}


def test_redacted_thinking_and_unknown_blocks_and_events_count_by_length() -> None:
    d = MessageDecoder(4.0)
    block = {"type": "redacted_thinking", "data": "Z" * 80}
    redacted = feed(d, {"type": "content_block_start", "index": 0, "content_block": block})
    assert redacted.tokens == 20 and redacted.output[0].kind is OutputKind.REASONING
    server_block: Any = {"type": "server_tool_use", "id": "s", "name": "web_search"}
    server_block["input"] = {"q": "x"}
    server = feed(d, {"type": "content_block_start", "index": 1, "content_block": server_block})
    assert server.tokens >= 2
    novel = feed(d, {"type": "brand_new_event", "payload": "y" * 30})
    assert novel.tokens > 0
    assert feed(d, {"type": "ping"}).tokens == 0
    assert feed(d, {"type": "content_block_stop", "index": 0}).tokens == 0


def test_usage_is_merged_with_the_cache_added_in() -> None:
    d = MessageDecoder(4.0)
    start = feed(d, {"type": "message_start", "message": {"id": "m", "content": [], "usage": {
        "input_tokens": 10, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20,
        "output_tokens": 1}}})  # fmt: skip
    assert start.usage is not None and start.usage.input_tokens == 130
    end = feed(d, {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                   "usage": {"output_tokens": 42}})  # fmt: skip
    usage = end.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens) == (130, 42)
    assert (usage.cached_input_tokens, usage.cache_write_input_tokens) == (100, 20)
    assert end.finish is FinishReason.STOP
    assert feed(d, {"type": "message_stop"}).done


@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("end_turn", FinishReason.STOP),
        ("stop_sequence", FinishReason.STOP),
        ("max_tokens", FinishReason.LENGTH),
        ("tool_use", FinishReason.TOOL_CALLS),
        ("refusal", FinishReason.CONTENT_FILTER),
        ("pause_turn", FinishReason.OTHER),
    ],
)
def test_stop_reasons_map_to_finish_reasons(reason: str, finish: FinishReason) -> None:
    event = feed(MessageDecoder(4.0), {"type": "message_delta", "delta": {"stop_reason": reason}})
    assert event.finish is finish


def test_malformed_and_error_events() -> None:
    d = MessageDecoder(4.0)
    assert feed(d, "not json {").error
    error = feed(
        d, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )
    assert error.error is not None and "Overloaded" in error.error
    array = feed(d, [{"type": "content_block_delta", "delta": {"text": "hello"}}])
    assert array.tokens > 0 and array.error is None
    odd = feed(d, delta(0, type="text_delta", text=["not", "text"]))
    assert odd.tokens > 0


def test_a_whole_message_counts_every_block() -> None:
    reply = completion(
        {
            "id": "msg", "type": "message", "role": "assistant", "model": "m",
            "content": [
                {"type": "thinking", "thinking": "Hmm, let me think.", "signature": "S" * 40},
                {"type": "text", "text": "It is sunny."},
                {"type": "tool_use", "id": "t", "name": "get_weather", "input": {"city": "Oslo"}},
            ],
            "stop_reason": "tool_use", "stop_sequence": None,
            "usage": {"input_tokens": 5, "cache_read_input_tokens": 7, "output_tokens": 30},
        },
        4.0,
    )  # fmt: skip
    kinds = [(o.kind, o.tool_call) for o in reply.output]
    assert kinds == [
        (OutputKind.REASONING, None), (OutputKind.REASONING, None), (OutputKind.CONTENT, None),
        (OutputKind.TOOL_NAME, 0), (OutputKind.TOOL_ARGUMENTS, 0),
    ]  # fmt: skip
    assert reply.output[-1].text == '{"city":"Oslo"}'
    assert reply.finish is FinishReason.TOOL_CALLS
    assert reply.usage is not None and reply.usage.input_tokens == 12
    assert reply.usage.cached_input_tokens == 7 and reply.tokens == sum(
        o.tokens for o in reply.output
    )
