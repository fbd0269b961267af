"""The Responses API's field table against the pinned openai SDK's own request type, and the
translation of a Responses body into the chat request the pipeline takes."""

from __future__ import annotations

import contextlib
import json
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import response_create_params as params
from openai.types.responses.tool_param import ToolParam

from hardcap_core.errors import InvalidRequest
from hardcap_core.wire.field_policy import Effect
from hardcap_core.wire.openai_input import input_tokens
from hardcap_core.wire.openai_responses_fields import (
    HOSTED_TOOLS,
    RESPONSES_COUNT_FIELDS,
    RESPONSES_FIELDS,
)
from hardcap_core.wire.openai_responses_request import (
    CAP_FIELD,
    parse_openai_body,
    parse_responses_request,
)


def documented() -> set[str]:
    """Every top-level field of ``responses.create`` in the pinned SDK (``stream`` is on the
    streaming and non-streaming subtypes, the rest on the base)."""
    streaming = params.ResponseCreateParamsStreaming
    return set(streaming.__required_keys__ | streaming.__optional_keys__)


def sdk_tool_types() -> set[str]:
    """The ``type`` of every tool in the SDK's ``ToolParam`` union."""
    out: set[str] = set()
    for tool in typing.get_args(ToolParam):
        hint = typing.get_type_hints(tool)["type"]
        while typing.get_origin(hint) is not typing.Literal:
            hint = typing.get_args(hint)[0]  # Required[Literal[...]]
        out |= set(typing.get_args(hint))
    return out


def parse(**body: Any) -> Any:
    return parse_responses_request(json.dumps({"model": "m", "input": "hi", **body}).encode())


def test_every_field_of_the_sdk_has_an_entry() -> None:
    assert RESPONSES_FIELDS.missing(documented()) == []


def test_every_entry_is_a_field_of_the_sdk() -> None:
    # client_metadata: not in the SDK's params, but Codex CLI sends it.
    assert sorted(set(RESPONSES_FIELDS.fields) - documented() - {"client_metadata"}) == []


@pytest.mark.parametrize("name", sorted(RESPONSES_FIELDS.names(Effect.REFUSED)))
def test_a_refused_field_is_a_400_naming_it(name: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse(**{name: True if name == "background" else "x"})
    assert refused.value.param == name and f"'{name}'" in refused.value.message


@pytest.mark.parametrize("kind", sorted(sdk_tool_types() - {"function"}))
def test_every_tool_but_a_function_is_refused_naming_it(kind: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse(tools=[{"type": kind}])
    assert refused.value.param == "tools[0].type" and kind in refused.value.message


def test_the_hosted_tools_are_the_sdks() -> None:
    assert sdk_tool_types() >= HOSTED_TOOLS


def test_null_means_not_given() -> None:
    chat = parse(previous_response_id=None, conversation=None, background=False, prompt=None)
    assert chat.body["messages"] == [{"role": "user", "content": "hi"}]


def test_an_unknown_field_is_refused_naming_it() -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse(brand_new=1)
    assert refused.value.param == "brand_new"


def test_items_become_chat_messages() -> None:
    items = [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Weather?"},
            {"type": "input_image", "image_url": "https://x.test/a.png", "detail": "low"},
        ]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "t"}]},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "Let me look.", "annotations": []},
        ]},
        {"type": "function_call", "call_id": "call_1", "name": "get", "arguments": "{}"},
        {"type": "function_call", "call_id": "call_2", "name": "get", "arguments": "{\"a\":1}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "rain"}]},
    ]  # fmt: skip
    chat = parse(
        input=items,
        instructions="Be brief.",
        tools=[
            {"type": "function", "name": "get", "parameters": {"type": "object"}, "strict": True}
        ],
        tool_choice={"type": "function", "name": "get"},
        parallel_tool_calls=False,
        max_output_tokens=77,
        reasoning={"effort": "low", "summary": "auto"},
        text={"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        service_tier="flex",
        safety_identifier="u1",
        stream=True,
    )
    body = chat.body
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [
            {"type": "text", "text": "Weather?"},
            {"type": "image_url", "image_url": {"url": "https://x.test/a.png", "detail": "low"}},
        ]},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{}"}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get", "arguments": "{\"a\":1}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
    ]  # fmt: skip
    assert body["tools"] == [
        {"type": "function",
         "function": {"name": "get", "parameters": {"type": "object"}, "strict": True}}
    ]  # fmt: skip
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get"}}
    assert body["parallel_tool_calls"] is False
    assert body["reasoning_effort"] == "low"
    assert "thinking" not in body  # an OpenAI-compatible upstream would refuse it
    assert chat.thinks and chat.thinking_budget == 1024  # the hold, and Anthropic, know it
    assert not parse(reasoning={"effort": "none"}).thinks and not parse().thinks
    assert body["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}
    }  # fmt: skip
    assert body["service_tier"] == "flex" and body["safety_identifier"] == "u1"
    assert body["stream_options"] == {"include_usage": True}
    assert "max_output_tokens" not in body and "instructions" not in body
    assert (chat.max_tokens, chat.max_tokens_field, chat.stream) == (77, CAP_FIELD, True)
    assert chat.input_tokens == input_tokens(body)  # what is sent is what is counted
    assert chat.echo["instructions"] == "Be brief." and chat.echo["max_output_tokens"] == 77


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"role": "user", "content": [{"type": "input_image", "file_id": "f1", "detail": "auto"}]},
         "input[0].content[0]"),
        ({"role": "user", "content": [{"type": "input_file", "file_url": "https://x.test/a"}]},
         "input[0].content[0]"),
        ({"type": "web_search_call", "id": "ws_1"}, "input[0].type"),
        ({"role": "tool", "content": "x"}, "input[0].role"),
        ({"type": "function_call", "name": "f", "arguments": "{}"}, "input[0].call_id"),
    ],
)  # fmt: skip
def test_input_the_gateway_cannot_carry_or_bound_is_refused(item: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse(input=[item])
    assert refused.value.param == param


def test_the_quote_body_may_be_chat_or_responses() -> None:
    chat = parse_openai_body(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    responses = parse_openai_body(b'{"model": "m", "input": "hi"}')
    assert chat.dialect == "openai_chat" and responses.dialect == "openai_responses"
    assert responses.body["messages"] == chat.body["messages"]


def test_the_input_tokens_fields_are_the_sdks_count_params() -> None:
    from openai.types.responses import input_token_count_params as count

    sdk = set(
        count.InputTokenCountParams.__optional_keys__
        | count.InputTokenCountParams.__required_keys__
    )
    # `personality` (a preset system prompt the provider adds) is not in the create params:
    # its size is the provider's, so it is refused as unknown.
    assert sorted(set(RESPONSES_COUNT_FIELDS.fields) ^ sdk) == ["personality"]


def test_an_input_tokens_body_takes_no_output_fields() -> None:
    body = json.dumps({"model": "m", "input": "hi", "max_output_tokens": 5}).encode()
    with pytest.raises(InvalidRequest) as refused:
        parse_responses_request(body, counting=True)
    assert refused.value.param == "max_output_tokens"
    counted = parse_responses_request(b'{"model": "m", "input": "hi"}', counting=True)
    assert counted.input_tokens == parse(input="hi").input_tokens


def test_a_tool_choice_without_tools_is_checked_and_not_sent() -> None:
    assert "tool_choice" not in parse(tool_choice="none", parallel_tool_calls=True).body
    with pytest.raises(InvalidRequest) as refused:
        parse(tool_choice={"type": "file_search"})
    assert refused.value.param == "tool_choice"


def test_a_reasoning_effort_asks_an_anthropic_upstream_to_think_within_the_cap() -> None:
    from hardcap_core.providers.anthropic_request import messages_body

    chat = parse(reasoning={"effort": "high"})
    assert messages_body(chat, "claude", 8000, stream=False)["thinking"] == {
        "type": "enabled", "budget_tokens": 4096
    }  # fmt: skip
    lowered = messages_body(chat, "claude", 2000, stream=False)["thinking"]
    assert lowered["budget_tokens"] == 1999  # under the cap it was sent, as a given budget
    assert "thinking" not in messages_body(chat, "claude", 1000, stream=False)  # under 1,024
    assert "thinking" not in messages_body(parse(), "claude", 8000, stream=False)


@pytest.mark.parametrize("kind", [[], {}, None, 5])
def test_a_tool_type_that_is_not_a_string_is_a_400(kind: object) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse(tools=[{"type": kind, "name": "f"}])
    assert refused.value.param == "tools[0].type"


@pytest.mark.parametrize("role", [[], {}, None, 5, "tool"])
def test_a_role_that_is_not_one_of_the_apis_is_a_400(role: object) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse(input=[{"role": role, "content": "x"}])
    assert refused.value.param == "input[0].role"


# Any JSON a client can send: a parse answers a translated request or a 400, never a 500.
_ATOMS = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(
    ["", "x", "user", "assistant", "message", "function", "function_call",
     "function_call_output", "reasoning", "input_text", "input_image", "low", "auto"]
)  # fmt: skip
_KEYS = [*sorted(RESPONSES_FIELDS.fields), "type", "role", "content", "text", "name", "call_id",
         "arguments", "output", "format", "effort", "image_url", "file_data", "schema"]  # fmt: skip
_JSON = st.recursive(
    _ATOMS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(RESPONSES_FIELDS.fields)), _JSON, max_size=5))
def test_any_body_is_a_request_or_a_400(fields: dict[str, Any]) -> None:
    raw = json.dumps({"model": "m", "input": "hi", **fields}).encode()
    for counting in (False, True):
        with contextlib.suppress(InvalidRequest):
            parse_responses_request(raw, counting=counting)
