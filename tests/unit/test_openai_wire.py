"""What an OpenAI client receives: chunks passed through or built from normalized events, the
closing chunks ([finish "length"], [usage], [DONE]), whole replies and error bodies.

The bytes are read back with the gateway's SSE parser, and the official ``openai`` SDK types
check that each chunk is one an OpenAI client can read.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hardcap_core.errors import (
    GatewayError,
    InvalidRequest,
    TooManyRequests,
    UpstreamFailed,
    UpstreamTimeout,
)
from hardcap_core.events import Completion, Event, FinishReason, Output, OutputKind, Usage
from hardcap_core.sse import DONE, SSEParser
from hardcap_core.wire.base import Charged
from hardcap_core.wire.openai_chat import ChunkEncoder, OpenAIChat
from hardcap_core.wire.openai_request import parse_chat_request

ANY_ID = "call_<fresh>"
FIRST = {"id": ANY_ID, "type": "function"}  # what a call's first chunk adds

PUBLIC = "small"  # the route name the client asked for
UPSTREAM = "vendor-model-2025-01-01"  # what the provider calls it
NOTHING = Charged(0, 0, None)


def events(data: bytes) -> list[Any]:
    """The SSE events in ``data``: JSON objects, or the literal [DONE]."""
    parser = SSEParser()
    out = [*parser.feed(data), *parser.flush()]
    return [d if d == DONE else json.loads(d) for d in out]


def one(data: bytes | None) -> dict[str, Any]:
    assert data is not None
    (event,) = events(data)
    assert isinstance(event, dict)
    return event


def chunk(**fields: Any) -> dict[str, Any]:
    """A provider's chat.completion.chunk (content "Hi" unless ``choices`` is given)."""
    return {
        "id": "chatcmpl-up-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": UPSTREAM,
        "system_fingerprint": "fp_1",
        "choices": [
            {"index": 0, "delta": {"content": "Hi"}, "logprobs": None, "finish_reason": None}
        ],
        **fields,
    }


def passthrough(*, include_usage: bool = False) -> ChunkEncoder:
    return ChunkEncoder(PUBLIC, include_usage=include_usage, passthrough=True)


def built(*, include_usage: bool = False) -> ChunkEncoder:
    return ChunkEncoder(PUBLIC, include_usage=include_usage, passthrough=False)


def valid_chunk(data: dict[str, Any]) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate(data)


USAGE = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}


# -- passthrough (an OpenAI-compatible provider) ------------------------------------------------


def test_a_passed_through_chunk_gets_the_public_model_and_keeps_everything_else() -> None:
    raw = chunk(x_vendor={"kept": [1, None]})
    expected = {**raw, "model": PUBLIC}
    sent = one(passthrough().event(Event(raw=json.loads(json.dumps(raw)))))
    assert sent == expected
    assert valid_chunk(sent).choices[0].delta.content == "Hi"


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_usage_only_chunk_is_held_back(include_usage: bool) -> None:
    encoder = passthrough(include_usage=include_usage)
    assert encoder.event(Event(raw=chunk(choices=[], usage=USAGE))) is None
    assert encoder.event(Event(raw=chunk(choices=[]))) is None
    assert encoder.event(Event(raw=None)) is None


@pytest.mark.parametrize("include_usage", [False, True])
def test_usage_on_a_chunk_with_choices_goes_out_only_once_settled(include_usage: bool) -> None:
    """Some providers put usage on the last chunk with choices; the client that asked for it
    gets it once, in the closing usage chunk, not twice."""
    encoder = passthrough(include_usage=include_usage)
    sent = one(encoder.event(Event(raw=chunk(usage=USAGE))))
    assert "usage" not in sent
    assert sent["choices"][0]["delta"] == {"content": "Hi"}
    closing = events(encoder.close(for_length=False, charged=Charged(9, 3, Usage(9, 3, raw=USAGE))))
    assert [without_extension(e["usage"]) for e in closing[:-1]] == [USAGE] * include_usage


def test_the_closing_chunk_has_the_providers_id_and_created() -> None:
    # Every chunk of one OpenAI stream carries the same id and created; the closing chunk too.
    encoder = passthrough()
    encoder.event(Event(raw=chunk(choices=[], usage=USAGE, id="chatcmpl-other", created=1)))
    for _ in range(3):
        encoder.event(Event(raw=chunk(id="chatcmpl-abc", created=222)))
    closing = events(encoder.close(for_length=True, charged=NOTHING))[0]
    assert (closing["id"], closing["created"], closing["model"]) == ("chatcmpl-abc", 222, PUBLIC)


def test_ids_that_are_not_the_right_type_are_not_remembered() -> None:
    encoder = passthrough()
    encoder.event(Event(raw=chunk(id=7, created="later")))
    closing = events(encoder.close(for_length=True, charged=NOTHING))[0]
    assert isinstance(closing["id"], str) and isinstance(closing["created"], int)
    valid_chunk(closing)


# -- the end of a stream ---------------------------------------------------------------------


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("cut", [False, True])
def test_close_sends_length_then_usage_then_done(cut: bool, include_usage: bool) -> None:
    for encoder in (passthrough(include_usage=include_usage), built(include_usage=include_usage)):
        sent = events(encoder.close(for_length=cut, charged=Charged(7, 5, None)))
        assert sent[-1] == DONE
        shapes = [
            "length" if e["choices"] else "usage"
            for e in sent[:-1]
            if valid_chunk(e) and e["object"] == "chat.completion.chunk"
        ]
        assert shapes == ["length"] * cut + ["usage"] * include_usage
        if cut:
            assert sent[0]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "length"}]
            assert sent[0]["model"] == PUBLIC
        if include_usage:
            assert sent[-2]["usage"] == {
                "prompt_tokens": 7,
                "completion_tokens": 5,
                "total_tokens": 12,
                "hardcap": {"cost_usd": 0.0, "input_tokens": 7, "output_tokens": 5,
                            "estimate": False},
            }  # fmt: skip


def close_usage(charged: Charged) -> dict[str, Any]:
    sent = events(passthrough(include_usage=True).close(for_length=False, charged=charged))
    assert sent[-1] == DONE
    valid_chunk(sent[-2])
    usage: dict[str, Any] = sent[-2]["usage"]
    assert usage["hardcap"] == charged.extension()
    return without_extension(usage)


def without_extension(usage: dict[str, Any]) -> dict[str, Any]:
    """The usage object as OpenAI defines it: without Hardcap's `hardcap` extension field."""
    return {k: v for k, v in usage.items() if k != "hardcap"}


def test_the_usage_chunk_carries_the_cost_the_ledger_charged() -> None:
    charged = Charged(40, 17, None, cost_nusd=123_456, estimate=True)
    for encoder in (passthrough(include_usage=True), built(include_usage=True)):
        usage = events(encoder.close(for_length=True, charged=charged))[-2]["usage"]
        assert usage["hardcap"] == {
            "cost_usd": 0.000123456, "input_tokens": 40, "output_tokens": 17, "estimate": True
        }  # fmt: skip
    assert charged.headers() == {
        "x-hardcap-cost-usd": "0.000123456", "x-hardcap-tokens-charged": "57"
    }  # fmt: skip
    assert Charged(1, 1, None, cost_nusd=3_000_000_000).cost_usd() == "3"
    assert Charged(1, 1, None).cost_usd() == "0"


def test_the_usage_chunk_is_the_providers_own_report_when_it_completed() -> None:
    raw = {
        "prompt_tokens": 9,
        "completion_tokens": 300,
        "total_tokens": 309,
        "completion_tokens_details": {"reasoning_tokens": 250},
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    provider = Usage(9, 300, 250, 4, raw=raw)
    assert close_usage(Charged(9, 300, provider)) == raw


def test_a_provider_report_without_a_total_gets_one() -> None:
    provider = Usage(9, 3, raw={"prompt_tokens": 9, "completion_tokens": 3})
    assert close_usage(Charged(9, 3, provider)) == USAGE


@pytest.mark.parametrize(
    "provider",
    [None, Usage(9, 3), Usage(None, None, raw={})],
    ids=["no report", "no raw object", "empty raw object"],
)
def test_the_usage_chunk_is_the_charge_without_a_provider_report(provider: Usage | None) -> None:
    assert close_usage(Charged(40, 17, provider)) == {
        "prompt_tokens": 40,
        "completion_tokens": 17,
        "total_tokens": 57,
    }


def test_a_provider_report_with_missing_counts_is_completed_by_the_charge() -> None:
    raw = {"prompt_tokens": None, "completion_tokens": 3, "total_tokens": None}
    usage = close_usage(Charged(40, 3, Usage(None, 3, raw=raw)))
    assert usage == {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43}


def test_the_usage_chunk_shows_the_charge_where_the_gateway_did_not_believe_the_report() -> None:
    # A provider reporting 0 output tokens after tokens were forwarded is charged what went out.
    raw = {"prompt_tokens": 9, "completion_tokens": 0, "completion_tokens_details": {"x": 1}}
    usage = close_usage(Charged(9, 25, Usage(9, 0, raw=raw)))
    assert usage == {
        "prompt_tokens": 9,
        "completion_tokens": 25,
        "total_tokens": 34,
        "completion_tokens_details": {"x": 1},
    }


def test_the_provider_report_is_not_changed_in_place() -> None:
    raw = {"prompt_tokens": 9, "completion_tokens": 3}
    close_usage(Charged(9, 3, Usage(9, 3, raw=raw)))
    assert raw == {"prompt_tokens": 9, "completion_tokens": 3}


# -- chunks built from normalized events (a provider of another dialect) ----------------------


def out(kind: OutputKind, text: str, call: int | None = None) -> Output:
    return Output(kind, text, 1, tool_call=call)


@pytest.mark.parametrize(
    ("outputs", "delta"),
    [
        ([out(OutputKind.CONTENT, "Hi")], {"content": "Hi"}),
        ([out(OutputKind.REASONING, "hmm")], {"reasoning_content": "hmm"}),
        ([out(OutputKind.REFUSAL, "no")], {"refusal": "no"}),
        ([out(OutputKind.OTHER, "x")], {"content": "x"}),
        (
            [out(OutputKind.CONTENT, "a"), out(OutputKind.CONTENT, "b")],
            {"content": "ab"},
        ),
        (
            [out(OutputKind.REASONING, "why"), out(OutputKind.CONTENT, "so")],
            {"reasoning_content": "why", "content": "so"},
        ),
        (
            [out(OutputKind.TOOL_NAME, "f", 0), out(OutputKind.TOOL_ARGUMENTS, '{"a"', 0)],
            {"tool_calls": [{"index": 0, **FIRST, "function": {"name": "f", "arguments": '{"a"'}}]},
        ),
        (
            [
                out(OutputKind.TOOL_ARGUMENTS, "{", 0),
                out(OutputKind.TOOL_ARGUMENTS, "}", 0),
                out(OutputKind.TOOL_NAME, "g", 2),
            ],
            {
                "tool_calls": [
                    {"index": 0, **FIRST, "function": {"arguments": "{}"}},
                    {"index": 2, **FIRST, "function": {"name": "g", "arguments": ""}},
                ]
            },
        ),
        (
            [out(OutputKind.TOOL_NAME, "legacy", None)],
            {
                "tool_calls": [
                    {"index": 0, **FIRST, "function": {"name": "legacy", "arguments": ""}}
                ]
            },
        ),
    ],
)
def test_a_built_chunk_puts_each_kind_in_its_delta_field(
    outputs: list[Output], delta: dict[str, Any]
) -> None:
    event = Event(raw={"type": "content_block_delta"}, output=outputs, tokens=len(outputs))
    sent = one(built().event(event))
    # A call's first chunk carries a fresh id (the client needs it to send the tool result).
    for call in sent["choices"][0]["delta"].get("tool_calls", []):
        assert call.pop("id").startswith("call_") and call["type"] == "function"
        call["id"] = ANY_ID
    assert sent["choices"] == [{"index": 0, "delta": delta, "finish_reason": None}]
    assert (sent["model"], sent["object"]) == (PUBLIC, "chat.completion.chunk")
    valid_chunk(sent)


@pytest.mark.parametrize(
    "finish",
    [
        FinishReason.STOP,
        FinishReason.LENGTH,
        FinishReason.TOOL_CALLS,
        FinishReason.CONTENT_FILTER,
        FinishReason.FUNCTION_CALL,
    ],
)
def test_a_built_chunk_carries_the_finish_reason(finish: FinishReason) -> None:
    sent = one(built().event(Event(finish=finish)))
    assert sent["choices"] == [{"index": 0, "delta": {}, "finish_reason": finish.value}]
    valid_chunk(sent)


def test_a_finish_reason_openai_has_no_name_for_is_stop() -> None:
    sent = one(built().event(Event(finish=FinishReason.OTHER)))
    assert sent["choices"][0]["finish_reason"] == "stop"
    valid_chunk(sent)


@pytest.mark.parametrize("include_usage", [False, True])
def test_an_event_with_nothing_for_the_client_builds_no_chunk(include_usage: bool) -> None:
    encoder = built(include_usage=include_usage)
    assert encoder.event(Event(raw={"type": "ping"})) is None
    assert encoder.event(Event(usage=Usage(5, 7, raw=USAGE))) is None


def test_built_chunks_share_one_id_with_the_closing_chunk() -> None:
    encoder = built()
    first = one(encoder.event(Event(output=[out(OutputKind.CONTENT, "a")], tokens=1)))
    closing = events(encoder.close(for_length=True, charged=NOTHING))[0]
    assert closing["id"] == first["id"] and closing["created"] == first["created"]


# -- the wire format ---------------------------------------------------------------------------


def request(**fields: Any) -> Any:
    body = {"model": PUBLIC, "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_chat_request(json.dumps(body).encode())


@pytest.mark.parametrize("same", [False, True])
@pytest.mark.parametrize("include_usage", [False, True])
def test_the_encoder_follows_the_request_and_the_dialect(same: bool, include_usage: bool) -> None:
    chat = request(stream=True, stream_options={"include_usage": include_usage})
    encoder = OpenAIChat().encoder(chat, model=PUBLIC, same_dialect=same)
    raw = chunk(usage=USAGE)
    sent = one(encoder.event(Event(raw=raw, output=[out(OutputKind.CONTENT, "yo")], tokens=1)))
    # Passthrough forwards the provider's chunk; otherwise it is built from the output.
    assert sent["choices"][0]["delta"] == ({"content": "Hi"} if same else {"content": "yo"})
    closing = events(encoder.close(for_length=False, charged=Charged(1, 2, None)))
    assert len(closing) == 1 + include_usage


COMPLETION_RAW = {
    "id": "chatcmpl-up-9",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": UPSTREAM,
    "system_fingerprint": "fp_1",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": USAGE,
}


def test_a_same_dialect_reply_is_the_providers_with_the_public_model() -> None:
    completion = Completion(COMPLETION_RAW, [out(OutputKind.CONTENT, "Hello")], 1, None, None)
    charged = Charged(9, 3, Usage(9, 3, raw=USAGE))
    reply = OpenAIChat().reply(completion, model=PUBLIC, same_dialect=True, charged=charged)
    assert reply == {**COMPLETION_RAW, "model": PUBLIC}
    assert COMPLETION_RAW["model"] == UPSTREAM  # the provider's object is not changed
    ChatCompletion.model_validate(reply)


@pytest.mark.parametrize(
    ("broken", "expected_choices"),
    [
        ({"choices": [None]}, []),
        ({"choices": "x"}, []),
        ({"usage": 5}, COMPLETION_RAW["choices"]),
        ({"usage": {"prompt_tokens": None}}, COMPLETION_RAW["choices"]),
    ],
    ids=["null-choice", "choices-not-a-list", "usage-not-an-object", "usage-with-nulls"],
)
def test_a_mangled_reply_reaches_the_client_in_a_shape_its_sdk_reads(
    broken: dict[str, Any], expected_choices: Any
) -> None:
    """The provider's usage object is replaced by what was charged, and choices that are not
    objects are dropped: the SDK failed validating `choices: [null]` or `usage: 5`."""
    completion = Completion({**COMPLETION_RAW, **broken}, [], 0, None, None)
    charged = Charged(40, 25, None)
    reply = OpenAIChat().reply(completion, model=PUBLIC, same_dialect=True, charged=charged)
    assert reply["choices"] == expected_choices
    assert reply["usage"] == {"prompt_tokens": 40, "completion_tokens": 25, "total_tokens": 65}
    ChatCompletion.model_validate(reply)


@pytest.mark.parametrize(
    ("usage", "prompt", "completion_tokens"),
    [
        (Usage(11, 22), 11, 22),
        (None, 40, 3),  # the usage shown is what was charged
        (Usage(11, None), 11, 3),
    ],
)
def test_an_other_dialect_reply_is_built_from_the_output(
    usage: Usage | None, prompt: int, completion_tokens: int
) -> None:
    outputs = [
        out(OutputKind.REASONING, "think "),
        out(OutputKind.CONTENT, "Hel"),
        out(OutputKind.CONTENT, "lo"),
        out(OutputKind.REFUSAL, "no"),
    ]
    completion = Completion({"type": "message"}, outputs, 3, usage, FinishReason.LENGTH)
    charged = Charged(prompt, completion_tokens, usage)
    reply = OpenAIChat().reply(completion, model=PUBLIC, same_dialect=False, charged=charged)
    ChatCompletion.model_validate(reply)
    assert reply["model"] == PUBLIC and reply["object"] == "chat.completion"
    (choice,) = reply["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["message"] == {
        "role": "assistant",
        "content": "Hello",
        "reasoning_content": "think ",
        "refusal": "no",
    }
    assert reply["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }


def test_an_other_dialect_reply_without_a_finish_reason_stopped() -> None:
    completion = Completion({}, [out(OutputKind.CONTENT, "a")], 1, None, None)
    reply = OpenAIChat().reply(completion, model=PUBLIC, same_dialect=False, charged=NOTHING)
    assert reply["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            InvalidRequest("'n' is bad.", param="n"),
            {
                "message": "'n' is bad.",
                "type": "invalid_request_error",
                "code": "invalid_request",
                "param": "n",
            },
        ),
        (
            TooManyRequests("Over budget.", code="budget_exceeded"),
            {
                "message": "Over budget.",
                "type": "rate_limit_error",
                "code": "budget_exceeded",
                "param": None,
            },
        ),
        (
            UpstreamTimeout("Slow."),
            {
                "message": "Slow.",
                "type": "upstream_error",
                "code": "upstream_timeout",
                "param": None,
            },
        ),
        (
            GatewayError("Internal error in the gateway."),
            {
                "message": "Internal error in the gateway.",
                "type": "server_error",
                "code": None,
                "param": None,
            },
        ),
    ],
)
def test_the_error_body_is_openais_shape(error: GatewayError, expected: dict[str, Any]) -> None:
    assert OpenAIChat().error_body(error) == {"error": expected}
    # Mid-stream, the same object as one event, and the stream does not claim to be complete.
    sent = events(passthrough().error(error))
    assert sent == [{"error": expected}]


def test_an_error_event_is_not_followed_by_done() -> None:
    data = built().error(UpstreamFailed("The provider failed mid-stream: overloaded"))
    assert DONE.encode() not in data
    assert data.endswith(b"\n\n")
