"""Strict JSON for request bodies: every error names the field path it is in (deep nesting past
Python's recursion limit, huge integers, numbers out of range, NaN, duplicate keys), and a lone
UTF-16 surrogate, valid JSON that no encoder can send on as UTF-8, is a 400 naming its field
instead of a 500 when the upstream body is encoded."""

from __future__ import annotations

import json

import pytest

from hardcap_core import json_codec
from hardcap_core.errors import InvalidRequest
from hardcap_core.wire import json_body
from hardcap_core.wire.json_body import MAX_DEPTH


def refused(raw: str | bytes) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        json_body.loads(raw.encode() if isinstance(raw, str) else raw)
    assert caught.value.status == 400
    return caught.value


def nested(depth: int, inner: str = "") -> str:
    return "[" * depth + inner + "]" * depth


TOOL = '{"type": "function", "function": {"name": "f", "parameters": %s}}'


@pytest.mark.parametrize(
    ("raw", "param", "said"),
    [
        # Past Python's recursion limit (a RecursionError inside json.loads): named nowhere.
        ('{"model": "m", "system": ' + nested(5_000) + "}", "system", "levels deep"),
        ('{"messages": [{"content": ' + nested(5_000) + "}]}", "messages[0].content", "deep"),
        # Within it, but past the bound: the top-level field was all it named.
        (
            '{"tools": [' + TOOL % ('{"properties": {"a": ' + nested(80) + "}}") + "]}",
            "tools[0].function.parameters.properties.a",
            "levels deep",
        ),
        ('{"max_tokens": ' + "9" * 5_000 + "}", "max_tokens", "5000 digits"),
        ('{"max_tokens": -' + "9" * 4_999 + "}", "max_tokens", "5000 digits"),
        (
            '{"tools": [{"input_schema": {"properties": {"n": {"maximum": ' + "1" * 200 + "}}}}]}",
            "tools[0].input_schema.properties.n.maximum",
            "200 digits",
        ),
        ('{"a": [1, 2, {"b": 1e999}]}', "a[2].b", "out of range"),
        ('{"temperature": NaN}', "temperature", "NaN"),
        ('{"x": [0, -Infinity]}', "x[1]", "-Infinity"),
        ('{"model": "a", "model": "b"}', "model", '"model" twice'),
        ('{"messages": [{"role": "user", "role": "system"}]}', "messages[0].role", '"role" twice'),
        # The decoder checks the inner object first (it closes first): so does the search.
        ('{"a": 1, "a": 2, "b": {"c": 1, "c": 2}}', "b.c", '"c" twice'),
        # A key that is no identifier is quoted; the same text in a string is not the error.
        ('{"x y": "123", "s": "[[[", "x y2": {"k": ' + "7" * 101 + "}}", '["x y2"].k', "101"),
    ],
)
def test_every_error_names_the_field_path(raw: str, param: str, said: str) -> None:
    error = refused(raw)
    assert error.param == param
    assert f"'{param}'" in error.message and said in error.message


def test_an_error_in_the_body_itself_says_the_request_body() -> None:
    assert "The request body is nested" in refused(nested(100_000)).message
    assert refused(nested(100_000)).param is None
    assert refused("9" * 200).message.startswith("The request body is an integer of 200 digits")


def test_a_deep_error_names_the_field_not_every_level_of_it() -> None:
    error = refused('{"x_vendor": [{"k": ' + nested(MAX_DEPTH) + "}]}")
    assert error.param == "x_vendor[0].k"


@pytest.mark.parametrize(
    ("raw", "param", "unit"),
    [
        ('{"messages": [{"role": "user", "content": "hi \\ud800 there"}]}', "messages[0].content",
         "\\ud800"),
        ('{"system": "\\uDFFF"}', "system", "\\udfff"),
        ('{"tools": [{"description": "\\ud83d"}]}', "tools[0].description", "\\ud83d"),
        # A high half followed by a high half, and a low half first: each alone.
        ('{"a": ["ok", "\\ud800\\ud800\\udc00"]}', "a[1]", "\\ud800"),
        ('{"a": {"b": "\\udc00\\ud800"}}', "a.b", "\\udc00"),
        # In a key: the key is named by its escape, never echoed raw.
        ('{"metadata": {"\\ud800": 1}}', 'metadata["\\ud800"]', "\\ud800"),
    ],
)  # fmt: skip
def test_a_lone_surrogate_is_a_400_naming_its_field(raw: str, param: str, unit: str) -> None:
    error = refused(raw)
    assert error.param == param
    assert f"'{param}'" in error.message and unit in error.message
    # The error itself can be sent: nothing in it is unencodable.
    json_codec.dumps({"message": error.message, "param": error.param})


@pytest.mark.parametrize(
    "ok",
    [
        '"\\ud83d\\ude00"',  # a pair is one whole character ...
        '"\\uD83D\\uDE00"',  # ... whatever the case of its hex digits
        '"\\\\ud800 is how a surrogate is written"',  # an escaped backslash: text
        '"\\u00e9\\u4e2d"',
    ],
)
def test_only_the_lone_surrogate_is_refused_not_escapes_that_are_characters(ok: str) -> None:
    assert refused('{"ok": ' + ok + ', "bad": ["\\udbff"]}').param == "bad[0]"
    value = json_body.loads(('{"ok": ' + ok + "}").encode())
    assert value == json.loads('{"ok": ' + ok + "}")
    json_codec.dumps(value)  # what is accepted can be encoded for the upstream


def test_a_utf16_body_with_a_lone_surrogate_is_refused_too() -> None:
    raw = '{"content": "\\ud800"}'.encode("utf-16")
    assert refused(raw).param == "content"
