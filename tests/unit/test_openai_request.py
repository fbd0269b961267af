"""Reading an OpenAI chat-completions body: a 400 naming the bad field, the fields the gateway
needs, the body intact for the provider, and an input estimate that grows with every billed
input field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hardcap_core.errors import InvalidRequest
from hardcap_core.wire.openai_chat import OpenAIChat
from hardcap_core.wire.openai_request import PER_MESSAGE_OVERHEAD, parse_chat_request

CPT = 4.0
USER = {"role": "user", "content": "hello"}


def body(**fields: Any) -> dict[str, Any]:
    """A valid request with ``fields`` set (a value of ... removes the field)."""
    data: dict[str, Any] = {"model": "small", "messages": [USER], **fields}
    return {k: v for k, v in data.items() if v is not ...}


def parse(data: dict[str, Any] | bytes) -> Any:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return parse_chat_request(raw, chars_per_token=CPT)


# -- invalid requests ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": ...}, "model"),
        ({"model": ""}, "model"),
        ({"model": 5}, "model"),
        ({"model": None}, "model"),
        ({"model": ["small"]}, "model"),
        ({"messages": ...}, "messages"),
        ({"messages": None}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hello"}, "messages"),
        ({"messages": {"role": "user", "content": "hi"}}, "messages"),
        ({"messages": ["hello"]}, "messages[0]"),
        ({"messages": [USER, None]}, "messages[1]"),
        ({"messages": [USER, USER, 3]}, "messages[2]"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [USER, {"role": "User", "content": "hi"}]}, "messages[1].role"),
        ({"messages": [{"role": 1, "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": {"text": "hi"}}]}, "messages[0].content"),
        ({"messages": [USER, {"role": "user", "content": True}]}, "messages[1].content"),
        ({"stream": "true"}, "stream"),
        ({"stream": 1}, "stream"),
        ({"stream_options": "yes"}, "stream_options"),
        ({"stream_options": [True]}, "stream_options"),
        ({"stream_options": {"include_usage": "true"}}, "stream_options.include_usage"),
        ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ({"n": 2}, "n"),
        ({"n": 0}, "n"),
        ({"n": True}, "n"),
        ({"n": 1.0}, "n"),
        ({"n": "1"}, "n"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": "f"}, "tools"),
        ({"max_tokens": "100"}, "max_tokens"),
        ({"max_tokens": 10.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"max_completion_tokens": "100"}, "max_completion_tokens"),
        ({"max_completion_tokens": 1.0}, "max_completion_tokens"),
        ({"max_completion_tokens": False}, "max_completion_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"max_completion_tokens": 0, "max_tokens": 10}, "max_completion_tokens"),
        # The field that loses is still checked: it would otherwise reach the provider.
        ({"max_completion_tokens": 10, "max_tokens": "x"}, "max_tokens"),
    ],
)
def test_an_invalid_field_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(body(**fields))
    error = caught.value
    assert error.param == param
    assert error.status == 400 and error.type == "invalid_request_error"
    # The message names the field too (for people reading it), not just the param.
    assert param.split(".")[-1].split("[")[0] in error.message


@pytest.mark.parametrize("tool_calls", [5, True, "call", {"id": "c1"}])
def test_tool_calls_that_are_not_an_array_are_a_400(tool_calls: Any) -> None:
    messages = [USER, {"role": "assistant", "content": None, "tool_calls": tool_calls}]
    with pytest.raises(InvalidRequest) as caught:
        parse(body(messages=messages))
    assert caught.value.param == "messages[1].tool_calls"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b'{"model": "small",}',
        b"not json",
        b'{"model": "small", "messages": [',
    ],
)
def test_a_body_that_is_not_json_is_a_400(raw: bytes) -> None:
    with pytest.raises(InvalidRequest, match="not valid JSON") as caught:
        parse(raw)
    assert caught.value.param is None


@pytest.mark.parametrize("raw", [b"[]", b'"model"', b"42", b"null", b"true"])
def test_a_body_that_is_not_an_object_is_a_400(raw: bytes) -> None:
    with pytest.raises(InvalidRequest, match="JSON object"):
        parse(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "\xff", "messages": []}',
        b'{"model": "small", "messages": [{"role": "user", "content": "caf\xc3"}]}',
        b"\xc3\x28",
    ],
)
def test_a_body_that_is_not_utf8_is_a_400(raw: bytes) -> None:
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        parse(raw)


# -- valid requests ------------------------------------------------------------------------------


def test_a_minimal_request_gets_the_defaults() -> None:
    request = parse(body())
    assert request.model == "small"
    assert (request.stream, request.include_usage) == (False, False)
    assert (request.max_tokens, request.max_tokens_field) == (None, "max_tokens")
    assert request.dialect == "openai_chat" == OpenAIChat.dialect
    assert request.messages == [USER]


@pytest.mark.parametrize(
    ("fields", "stream", "include_usage"),
    [
        ({"stream": True}, True, False),
        ({"stream": False}, False, False),
        ({"stream": None}, False, False),
        ({"stream": True, "stream_options": {"include_usage": True}}, True, True),
        ({"stream": True, "stream_options": {"include_usage": False}}, True, False),
        ({"stream": True, "stream_options": {}}, True, False),
        ({"stream": True, "stream_options": None}, True, False),
        ({"stream": True, "stream_options": {"other": 1}}, True, False),
    ],
)
def test_streaming_and_usage_flags(
    fields: dict[str, Any], stream: bool, include_usage: bool
) -> None:
    request = parse(body(**fields))
    assert (request.stream, request.include_usage) == (stream, include_usage)


@pytest.mark.parametrize(
    ("fields", "max_tokens", "field"),
    [
        ({"max_tokens": 100}, 100, "max_tokens"),
        ({"max_completion_tokens": 200}, 200, "max_completion_tokens"),
        ({"max_tokens": 1}, 1, "max_tokens"),
        # Both sent: the newer field wins (OpenAI deprecated max_tokens in its favour).
        ({"max_tokens": 100, "max_completion_tokens": 200}, 200, "max_completion_tokens"),
        ({"max_tokens": 300, "max_completion_tokens": 200}, 200, "max_completion_tokens"),
        # A null field is as if not sent.
        ({"max_tokens": 100, "max_completion_tokens": None}, 100, "max_tokens"),
        ({"max_tokens": None, "max_completion_tokens": 200}, 200, "max_completion_tokens"),
        ({"max_tokens": None}, None, "max_tokens"),
    ],
)
def test_the_output_cap_and_the_field_it_came_in(
    fields: dict[str, Any], max_tokens: int | None, field: str
) -> None:
    request = parse(body(**fields))
    assert (request.max_tokens, request.max_tokens_field) == (max_tokens, field)


@pytest.mark.parametrize("n", [1, None])
def test_n_of_one_is_accepted(n: int | None) -> None:
    parse(body(n=n))


@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant", "tool", "function"])
def test_every_chat_role_is_accepted(role: str) -> None:
    assert parse(body(messages=[{"role": role, "content": "x"}])).messages[0]["role"] == role


@pytest.mark.parametrize(
    "content", [None, "", "text", [], [{"type": "text", "text": "hi"}], [{"type": "image_url"}]]
)
def test_content_may_be_text_parts_or_absent(content: Any) -> None:
    parse(body(messages=[{"role": "assistant", "content": content}]))


def test_the_body_is_kept_intact_with_fields_the_gateway_does_not_know() -> None:
    sent = body(
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        max_completion_tokens=50,
        temperature=0.1,
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
        metadata={"a": "b"},
        x_vendor=[1, {"two": None}],
        messages=[
            {"role": "system", "content": "be brief", "name": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]},
        ],
    )
    request = parse(sent)
    assert request.body == sent


# -- input estimate ------------------------------------------------------------------------------


def estimate(**fields: Any) -> int:
    tokens: int = parse(body(**fields)).input_tokens
    return tokens


def messages_estimate(*messages: dict[str, Any], **fields: Any) -> int:
    return estimate(messages=list(messages), **fields)


CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_each_message_costs_its_overhead_and_its_text() -> None:
    empty = messages_estimate({"role": "user", "content": ""})
    assert empty == PER_MESSAGE_OVERHEAD
    assert messages_estimate({"role": "user", "content": "x" * 40}) == PER_MESSAGE_OVERHEAD + 10
    two = messages_estimate({"role": "user", "content": ""}, {"role": "assistant", "content": ""})
    assert two == 2 * PER_MESSAGE_OVERHEAD


@pytest.mark.parametrize(
    ("small", "large"),
    [
        # longer text
        ({"role": "user", "content": "hi"}, {"role": "user", "content": "hi " * 100}),
        # text parts of a content array, however many
        (
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "x" * 80}],
            },
        ),
        # an assistant's tool calls
        (
            {"role": "assistant", "content": None},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
        ),
        (
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "assistant", "content": None, "tool_calls": [CALL, CALL]},
        ),
        # text next to the tool calls
        (
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "assistant", "content": "calling f", "tool_calls": [CALL]},
        ),
        # a tool result
        ({"role": "tool", "content": ""}, {"role": "tool", "content": '{"temp": 21}'}),
    ],
)
def test_the_estimate_grows_with_each_billed_input_field(
    small: dict[str, Any], large: dict[str, Any]
) -> None:
    assert messages_estimate(large) > messages_estimate(small)


def test_a_text_part_counts_like_the_same_text_as_a_string() -> None:
    text = "y" * 41
    as_string = messages_estimate({"role": "user", "content": text})
    as_part = messages_estimate({"role": "user", "content": [{"type": "text", "text": text}]})
    assert as_string == as_part == PER_MESSAGE_OVERHEAD + 11


def test_non_text_parts_do_not_count_and_do_not_fail() -> None:
    parts = [{"type": "image_url", "image_url": {"url": "data:..."}}, "odd", None, {"text": 5}]
    assert messages_estimate({"role": "user", "content": parts}) == PER_MESSAGE_OVERHEAD


@pytest.mark.parametrize("tools", [[TOOL], [TOOL, TOOL]])
def test_tool_definitions_are_counted(tools: list[dict[str, Any]]) -> None:
    without = estimate()
    with_tools = estimate(tools=tools)
    serialized = len(json.dumps(tools, separators=(",", ":")))
    assert with_tools - without == -(-serialized // 4)


def test_an_empty_tools_array_costs_nothing() -> None:
    assert estimate(tools=[]) == estimate()


@pytest.mark.parametrize(
    ("cpt", "expected"),
    [(4.0, PER_MESSAGE_OVERHEAD + 10), (2.0, PER_MESSAGE_OVERHEAD + 20)],
)
def test_the_estimate_uses_the_configured_chars_per_token(cpt: float, expected: int) -> None:
    raw = json.dumps(body(messages=[{"role": "user", "content": "z" * 40}])).encode()
    assert parse_chat_request(raw, chars_per_token=cpt).input_tokens == expected
