"""Reading an OpenAI chat-completions body: a 400 naming the bad field, the fields the gateway
needs, the body intact for the provider; JSON that Python's decoder mishandles (deep nesting,
huge integers, NaN, duplicate keys) is a 400 too. The input estimate is tested in
test_input_estimate.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardcap_core.errors import InvalidRequest
from hardcap_core.wire.json_body import MAX_DEPTH, MAX_INTEGER_DIGITS
from hardcap_core.wire.openai_chat import OpenAIChat
from hardcap_core.wire.openai_request import parse_chat_request

USER = {"role": "user", "content": "hello"}


def body(**fields: Any) -> dict[str, Any]:
    """A valid request with ``fields`` set (a value of ... removes the field)."""
    data: dict[str, Any] = {"model": "small", "messages": [USER], **fields}
    return {k: v for k, v in data.items() if v is not ...}


def parse(data: dict[str, Any] | bytes) -> Any:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return parse_chat_request(raw)


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
        ({"functions": {"name": "f"}}, "functions"),
        ({"functions": "f"}, "functions"),
        ({"response_format": "json_object"}, "response_format"),
        ({"response_format": [{"type": "json_schema"}]}, "response_format"),
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


# -- JSON Python's decoder mishandles ------------------------------------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        # RecursionError inside json.loads: it was a 500.
        ('{"model": "small", "messages": [], "x": ' + nested(100_000) + "}", "nested more than"),
        (nested(100_000), "nested more than"),
        ('{"a": ' + "{" * 50_000 + "}" * 50_000 + "}", "not valid JSON"),  # keys missing
        # int's 4,300-digit limit, a ValueError: it was a 500.
        ('{"model": "small", "seed": ' + "7" * 5_000 + "}", "5000 digits"),
        (
            '{"model": "small", "messages": [{"role": "user", "content": -' + "1" * 4_301 + "}]}",
            "4302 digits",
        ),
        ('{"model": "small", "temperature": NaN}', "NaN"),
        ('{"model": "small", "temperature": Infinity}', "Infinity"),
        ('{"model": "small", "temperature": -Infinity}', "-Infinity"),
        ('{"model": "small", "temperature": 1e999}', "out of range"),
        ('{"model": "small", "temperature": -1e999}', "out of range"),
        ('{"model": "small", "model": "large", "messages": []}', '"model" twice'),
        ('{"model": "small", "messages": [{"role": "user", "role": "system"}]}', '"role" twice'),
    ],
)
def test_json_python_mishandles_is_a_400_saying_what_is_wrong(raw: str, said: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(raw.encode())
    assert caught.value.status == 400
    assert said in caught.value.message


def field_nested(depth: int) -> dict[str, Any]:
    """A body whose x_vendor field holds arrays ``depth`` levels deep, the body included."""
    return body(x_vendor=json.loads(nested(depth - 1)))


def test_nesting_up_to_the_bound_is_accepted_and_one_more_is_a_400() -> None:
    parse(field_nested(MAX_DEPTH))
    with pytest.raises(InvalidRequest, match=f"more than {MAX_DEPTH} levels") as caught:
        parse(field_nested(MAX_DEPTH + 1))
    assert caught.value.param == "x_vendor"


def test_integers_up_to_the_bound_are_accepted() -> None:
    raw = json.dumps(body(seed=0)).replace('"seed": 0', '"seed": ' + "9" * MAX_INTEGER_DIGITS)
    assert parse(raw.encode()).body["seed"] == int("9" * MAX_INTEGER_DIGITS)


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (
            [{"type": "file", "file": {"file_id": "file-abc"}}],
            "messages[0].content[0].file.file_id",
        ),
        (
            [{"type": "text", "text": "hi"}, {"type": "file", "file": {"file_id": "f"}}],
            "messages[0].content[1].file.file_id",
        ),
    ],
)
def test_a_file_sent_by_id_cannot_be_counted_and_is_a_400(content: Any, param: str) -> None:
    with pytest.raises(InvalidRequest, match="file_data") as caught:
        parse(body(messages=[{"role": "user", "content": content}]))
    assert caught.value.param == param


def test_earlier_audio_sent_by_id_cannot_be_counted_and_is_a_400() -> None:
    messages = [USER, {"role": "assistant", "audio": {"id": "audio_1"}}, USER]
    with pytest.raises(InvalidRequest, match="transcript") as caught:
        parse(body(messages=messages))
    assert caught.value.param == "messages[1].audio.id"


def depth_of(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    return 0


TRICKY_TEXT = st.text(alphabet='[]{}"\\ab', max_size=6)
JSON_VALUES = st.recursive(
    st.none() | st.integers() | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
    max_leaves=200,
)


def deep(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.integers(min_value=0, max_value=70))
def test_nesting_is_measured_exactly_whatever_the_strings_hold(value: Any, extra: int) -> None:
    # Brackets, quotes and backslashes inside strings must not count as nesting.
    data = body(x_vendor=deep(value, extra))
    if depth_of(data) <= MAX_DEPTH:
        assert parse(data).body == data
    else:
        with pytest.raises(InvalidRequest, match="levels deep"):
            parse(data)
