"""What a Responses client receives: stream events built from normalized events, the closing
event on a finish and on a cut, a failure mid-stream, and whole replies. The official
``openai`` SDK's own pydantic types validate every event and reply (the SDK itself builds them
without validation, so the end-to-end tests alone would not catch a missing required field)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from hardcap_core.errors import InvalidRequest, UpstreamFailed
from hardcap_core.events import Completion, Event, FinishReason, Output, OutputKind, Usage
from hardcap_core.wire.base import Charged
from hardcap_core.wire.openai_responses import OpenAIResponses, ResponseEncoder
from hardcap_core.wire.openai_responses_request import parse_responses_request

WIRE = OpenAIResponses()
EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
CHARGED = Charged(20, 7, Usage(20, 7, reasoning_tokens=3, cached_input_tokens=4), 1234)


def sse(data: bytes) -> list[dict[str, Any]]:
    """The events in ``data``, each named by its type and valid by the SDK's types, numbered
    from 0 in order."""
    out = []
    for block in data.decode().split("\n\n"):
        if not block:
            continue
        name_line, data_line = block.split("\n")
        payload = json.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {payload['type']}"
        EVENT.validate_python(payload)
        out.append(payload)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def piece(kind: OutputKind, text: str, call: int | None = None) -> Event:
    return Event(output=[Output(kind, text, 1, 0, call)], tokens=1)


def encoder(**body: Any) -> ResponseEncoder:
    request = parse_responses_request(json.dumps({"model": "m", "input": "hi", **body}).encode())
    return WIRE.encoder(request, model="public", same_dialect=False)


def run(enc: ResponseEncoder, events: list[Event], *, cut: bool = False) -> list[dict[str, Any]]:
    data = b"".join(enc.event(e) or b"" for e in events)
    return sse(data + enc.close(for_length=cut, charged=CHARGED))


def test_reasoning_then_text_then_a_refusal_then_two_tool_calls() -> None:
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}]
    events = [
        piece(OutputKind.REASONING, "Think"), piece(OutputKind.REASONING, "ing."),
        piece(OutputKind.CONTENT, "Hel"), piece(OutputKind.CONTENT, "lo"),
        piece(OutputKind.REFUSAL, "No."),
        piece(OutputKind.TOOL_NAME, "f", 0), piece(OutputKind.TOOL_ARGUMENTS, '{"a":', 0),
        piece(OutputKind.TOOL_ARGUMENTS, "1}", 0),
        piece(OutputKind.TOOL_NAME, "f", 1), piece(OutputKind.TOOL_ARGUMENTS, "{}", 1),
        Event(finish=FinishReason.TOOL_CALLS),
    ]  # fmt: skip
    out = run(encoder(tools=tools, instructions="Be brief.", max_output_tokens=99), events)
    kinds = [e["type"] for e in out]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert (
        kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 4
    )
    assert kinds.count("response.content_part.added") == 2  # output_text, then refusal
    assert "response.refusal.delta" in kinds and "response.refusal.done" in kinds
    final = out[-1]
    assert final["type"] == "response.completed"
    response = Response.model_validate(final["response"])
    assert [item.type for item in response.output] == [
        "reasoning", "message", "function_call", "function_call"
    ]  # fmt: skip
    message = response.output[1]
    assert message.type == "message" and [c.type for c in message.content] == [
        "output_text", "refusal"
    ]  # fmt: skip
    assert response.output_text == "Hello"
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"a":1}'), ("f", "{}")]
    assert calls[0].call_id != calls[1].call_id
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "Thinking."
    assert response.instructions == "Be brief." and response.max_output_tokens == 99
    assert response.tools[0].type == "function"
    usage = response.usage
    assert usage is not None and (usage.input_tokens, usage.output_tokens) == (20, 7)
    assert usage.input_tokens_details.cached_tokens == 4
    assert usage.output_tokens_details.reasoning_tokens == 3
    assert usage.total_tokens == 27
    assert final["response"]["usage"]["hardcap"]["cost_usd"] == pytest.approx(1.234e-6)


def test_a_cut_ends_incomplete_with_every_open_item_closed_incomplete() -> None:
    enc = encoder()
    events = [piece(OutputKind.CONTENT, "Part"), piece(OutputKind.TOOL_NAME, "lookup", 0)]
    charged = Charged(20, 2, None, 99, estimate=True)
    data = b"".join(enc.event(e) or b"" for e in events)
    out = sse(data + enc.close(for_length=True, charged=charged))
    final = out[-1]
    assert final["type"] == "response.incomplete"
    response = Response.model_validate(final["response"])
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert [(item.type, item.status) for item in response.output] == [
        ("message", "completed"), ("function_call", "incomplete")
    ]  # fmt: skip
    assert response.output_text == "Part"
    assert response.usage is not None and response.usage.output_tokens == 2
    assert final["response"]["usage"]["hardcap"]["estimate"] is True


def test_the_providers_length_and_filter_end_incomplete() -> None:
    for finish, reason in ((FinishReason.LENGTH, "max_output_tokens"),
                           (FinishReason.CONTENT_FILTER, "content_filter")):  # fmt: skip
        out = run(encoder(), [piece(OutputKind.CONTENT, "x"), Event(finish=finish)])
        assert out[-1]["type"] == "response.incomplete"
        assert out[-1]["response"]["incomplete_details"] == {"reason": reason}


def test_an_empty_stream_still_opens_and_completes() -> None:
    out = run(encoder(), [Event(done=True)])
    assert [e["type"] for e in out] == [
        "response.created", "response.in_progress", "response.completed"
    ]  # fmt: skip


def test_a_failure_mid_stream_is_an_error_event_then_response_failed() -> None:
    enc = encoder()
    data = enc.event(piece(OutputKind.CONTENT, "so far")) or b""
    out = sse(data + enc.error(UpstreamFailed("The provider's stream broke.")))
    assert [e["type"] for e in out[-2:]] == ["error", "response.failed"]
    assert out[-2]["message"] == "The provider's stream broke."
    failed = Response.model_validate(out[-1]["response"])
    assert failed.status == "failed" and failed.error is not None
    assert failed.output_text == "so far"


def test_a_whole_reply_has_the_items_a_stream_would() -> None:
    completion = Completion(
        raw={"choices": [{"message": {"tool_calls": [{"id": "call_up", "function": {}}]}}]},
        output=[Output(OutputKind.CONTENT, "Hi", 1), Output(OutputKind.TOOL_NAME, "f", 1, 0, 0),
                Output(OutputKind.TOOL_ARGUMENTS, "{}", 1, 0, 0)],
        tokens=3, usage=Usage(20, 7), finish=FinishReason.LENGTH,
    )  # fmt: skip
    body = WIRE.reply(completion, model="public", same_dialect=False, charged=CHARGED)
    response = Response.model_validate(body)
    assert response.model == "public" and response.status == "incomplete"
    assert response.output_text == "Hi"
    call = response.output[1]
    assert call.type == "function_call" and call.call_id == "call_up"  # the upstream's id


def test_an_error_over_the_routes_cap_names_max_output_tokens() -> None:
    error = InvalidRequest(
        "'max_completion_tokens' is 5000; the most this model allows here is 1024.",
        param="max_completion_tokens",
    )
    body = WIRE.error_body(error)["error"]
    assert body["param"] == "max_output_tokens" and body["message"].startswith(
        "'max_output_tokens' is 5000"
    )
