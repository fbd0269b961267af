"""The field tables against the pinned SDKs' own request types (an SDK upgrade that brings a
field names it here), and what the tables make of the bodies clients send: Claude Code's
accepted and sent on unchanged, refused fields a 400 naming them before anything is spent."""

from __future__ import annotations

import copy
import json
import typing
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import message_count_tokens_params, message_create_params
from anthropic.types.beta import message_count_tokens_params as beta_count_params
from anthropic.types.beta import message_create_params as beta_create_params
from openai.types.chat import completion_create_params

from hardcap_core.chat import ChatRequest
from hardcap_core.config import parse_config
from hardcap_core.errors import InvalidRequest
from hardcap_core.providers.anthropic_request import messages_body
from hardcap_core.providers.openai_compat import OpenAICompatible
from hardcap_core.wire.anthropic_fields import COUNT_FIELDS, MESSAGES_FIELDS
from hardcap_core.wire.anthropic_request import parse_messages_request, with_headers
from hardcap_core.wire.field_policy import Effect, FieldPolicy
from hardcap_core.wire.openai_chat_fields import CHAT_FIELDS
from hardcap_core.wire.openai_request import parse_chat_request, price_terms

DOCUMENTED: list[tuple[FieldPolicy, Any]] = [
    (MESSAGES_FIELDS, message_create_params.MessageCreateParamsStreaming),
    (MESSAGES_FIELDS, message_create_params.MessageCreateParamsNonStreaming),
    (MESSAGES_FIELDS, beta_create_params.MessageCreateParamsStreaming),
    (MESSAGES_FIELDS, beta_create_params.MessageCreateParamsNonStreaming),
    (COUNT_FIELDS, message_count_tokens_params.MessageCountTokensParams),
    (COUNT_FIELDS, beta_count_params.MessageCountTokensParams),
    (CHAT_FIELDS, completion_create_params.CompletionCreateParamsStreaming),
    (CHAT_FIELDS, completion_create_params.CompletionCreateParamsNonStreaming),
]

# Claude Code 2.1's request, as it sends it to `/v1/messages?beta=true` (trimmed).
CLAUDE_CODE: dict[str, Any] = {
    "model": "claude",
    "max_tokens": 2048,
    "stream": True,
    "system": [
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [  # a system message mid-conversation too, as Claude Code sends it
        {"role": "user", "content": [{"type": "text", "text": "list the files"}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment: linux"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Use Bash.", "signature": "c2ln"},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"cmd": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "README.md"}],
                    "cache_control": {"type": "ephemeral", "ttl": "1h"},
                },
            ],
        },
    ],
    "tools": [
        {
            "name": "Bash",
            "description": "Run a command.",
            "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        }
    ],
    "metadata": {"user_id": "user_dev1_account_x_session_y"},
    "thinking": {"type": "adaptive"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
}
BETAS = "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27"


def fields_of(params: Any) -> set[str]:
    return set(typing.get_type_hints(params))


@pytest.mark.parametrize(("policy", "params"), DOCUMENTED, ids=lambda p: getattr(p, "name", ""))
def test_every_field_the_pinned_sdks_send_has_an_entry(policy: FieldPolicy, params: Any) -> None:
    documented = fields_of(params)
    assert {"model", "messages"} <= documented  # the SDK's types were read, not an empty set
    assert policy.missing(documented) == [], f"decide these in {policy.name}'s table"


def test_missing_names_a_field_newer_than_the_table() -> None:
    newer = fields_of(beta_create_params.MessageCreateParamsStreaming) | {"telepathy"}
    assert MESSAGES_FIELDS.missing(newer) == ["telepathy"]


@pytest.mark.parametrize(
    "policy", [MESSAGES_FIELDS, COUNT_FIELDS, CHAT_FIELDS], ids=lambda p: str(p.name)
)
def test_every_entry_says_why(policy: FieldPolicy) -> None:
    assert all(f.why.strip() for f in policy.fields.values())


@pytest.mark.parametrize(
    "policy", [MESSAGES_FIELDS, COUNT_FIELDS, CHAT_FIELDS], ids=lambda p: str(p.name)
)
def test_docs_config_shows_each_table_as_the_code_has_it(policy: FieldPolicy) -> None:
    docs = (Path(__file__).parents[2] / "docs" / "config.md").read_text()
    start = f"<!-- field table: {policy.name} -->\n"
    assert start in docs, f"docs/config.md has no table of {policy.name}"
    shown = docs.split(start, 1)[1].split("<!-- end field table -->", 1)[0]
    assert shown == policy.markdown(), f"docs/config.md's table should be:\n{policy.markdown()}"


def parse(body: dict[str, Any], **kw: Any) -> ChatRequest:
    return parse_messages_request(json.dumps(body).encode(), **kw)


def refused(body: dict[str, Any], *, counting: bool = False) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse(body, counting=counting)
    return caught.value


def test_claude_codes_body_is_sent_to_anthropic_as_it_came() -> None:
    chat = with_headers(parse(CLAUDE_CODE), {"anthropic-beta": BETAS})
    sent = messages_body(chat, "claude-sonnet-4-5", 1500, stream=True)
    # Only the gateway's own settings differ: the upstream model and the output cap.
    assert sent == {**CLAUDE_CODE, "model": "claude-sonnet-4-5", "max_tokens": 1500}
    assert list(sent) == list(CLAUDE_CODE)  # in the client's order: the cached prefix is kept
    assert chat.betas == tuple(BETAS.split(","))
    assert chat.thinks and chat.body["user"] == "user_dev1_account_x_session_y"


def test_an_openai_upstream_gets_none_of_the_anthropic_only_fields() -> None:
    config = parse_config({
        "upstreams": [{"name": "u", "base_url": "http://127.0.0.1:9/v1"}],
        "routes": [{"name": "claude", "upstream": "u"}], "tenants": [],
    })  # fmt: skip
    body = OpenAICompatible(None)._body(
        config.routes["claude"], parse(CLAUDE_CODE), 100, stream=True
    )  # type: ignore[arg-type]
    text = json.dumps(body)
    for name in ("context_management", "output_config", "cache_control", "thinking"):
        assert name not in text
    assert body["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": "README.md",
    }


def test_the_estimate_counts_the_anthropic_only_fields() -> None:
    plain = {
        k: v for k, v in CLAUDE_CODE.items() if k not in ("output_config", "context_management")
    }
    assert parse(CLAUDE_CODE).input_tokens > parse(plain).input_tokens


def test_an_hour_long_cache_mark_prices_the_write_wherever_it_is() -> None:
    """A 1h mark on a tool result, inside one, on a tool use or on the body: the hour-long
    write price holds it; 5m marks alone do not."""
    assert price_terms(parse(CLAUDE_CODE).body).cache_1h
    five = copy.deepcopy(CLAUDE_CODE)
    five["messages"][3]["content"][0]["cache_control"] = {"type": "ephemeral"}
    assert not price_terms(parse(five).body).cache_1h
    inner = copy.deepcopy(five)
    inner["messages"][3]["content"][0]["content"][0]["cache_control"] = {
        "type": "ephemeral",
        "ttl": "1h",
    }
    assert price_terms(parse(inner).body).cache_1h
    use = copy.deepcopy(five)
    use["messages"][2]["content"][1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    assert price_terms(parse(use).body).cache_1h
    top = {**five, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    assert price_terms(parse(top).body).cache_1h


def test_search_results_documents_and_images_keep_their_marks_and_count() -> None:
    mark = {"type": "ephemeral", "ttl": "1h"}
    text = [{"type": "text", "text": "found " * 50}]
    block = {"type": "search_result", "source": "https://a", "title": "A", "content": text,
             "cache_control": mark}  # fmt: skip
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [block]}]}
    chat = parse(body)
    assert price_terms(chat.body).cache_1h
    plain = {**body, "messages": [{"role": "user", "content": "x"}]}
    assert chat.input_tokens > parse(plain).input_tokens + 50
    assert messages_body(chat, "m", 10, stream=False)["messages"][0]["content"][0] == block


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"container": "cntr_1"}, "container"),
        ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers"),
        ({"fallbacks": ["default"]}, "fallbacks"),
        ({"thread": {"type": "create"}}, "thread"),
        ({"betas": ["context-1m-2025-08-07"]}, "betas"),  # a header, not a body field
        ({"speed": "fast"}, "speed"),
        ({"inference_geo": "us"}, "inference_geo"),
        ({"service_tier": "priority"}, "service_tier"),
        ({"telepathy": True}, "telepathy"),
        ({"cache_control": {"type": "ephemeral", "ttl": "1d"}}, "cache_control.ttl"),
        (
            {"context_management": {"edits": [{"type": "compact_20260112"}]}},
            "context_management.edits[0].type",
        ),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 0}]},
            "tools[0].max_uses",
        ),
        ({"tools": [{"type": "code_execution_20250825", "name": "x"}]}, "tools[0].type"),
    ],
)
def test_a_refused_field_is_a_400_naming_it(extra: dict[str, Any], param: str) -> None:
    error = refused({**CLAUDE_CODE, **extra})
    assert error.param == param and error.status == 400
    assert param.split(".")[0].split("[")[0] in error.message


def test_a_tool_added_mid_conversation_is_checked_as_tools_are() -> None:
    def added(tool: dict[str, Any]) -> dict[str, Any]:
        body = copy.deepcopy(CLAUDE_CODE)
        body["messages"][1]["content"].append({"type": "tool_addition", "tool": tool})
        return body

    chat = parse(added({"type": "tool_reference", "name": "Bash"}))
    assert chat.input_tokens > parse(CLAUDE_CODE).input_tokens
    definition = {"type": "web_search_20250305", "name": "web_search"}
    server = {"type": "tool_definition", "definition": definition}
    assert refused(added(server)).param == "messages[1].content[1].tool.definition.type"
    mcp = {"type": "mcp_toolset_reference", "mcp_server_name": "x"}
    assert refused(added(mcp)).param == "messages[1].content[1].tool.type"


def test_a_server_tool_is_named_in_its_refusal() -> None:
    error = refused({**CLAUDE_CODE, "tools": [{"type": "code_execution_20250825", "name": "c"}]})
    assert "'code_execution_20250825' is billed per use" in error.message
    # Web search and web fetch are the route's to price (money.tool_hold): parsed and kept.
    chat = parse({**CLAUDE_CODE, "tools": [{"type": "web_fetch_20250910", "name": "f"}]})
    assert [(t.kind, t.where, t.max_uses) for t in chat.server_tools] == [
        ("web_fetch", "tools[0]", None)
    ]


def test_the_plain_values_of_priced_fields_pass() -> None:
    plain = {"speed": "standard", "inference_geo": "global", "service_tier": "auto",
             "diagnostics": {"previous_message_id": "msg_1"}}  # fmt: skip
    chat = parse({**CLAUDE_CODE, **plain})
    assert messages_body(chat, "m", 100, stream=True)["service_tier"] == "auto"


def test_count_tokens_takes_the_fields_a_count_needs() -> None:
    body = {k: v for k, v in CLAUDE_CODE.items() if k not in ("max_tokens", "stream", "metadata")}
    assert parse(body, counting=True).input_tokens > 0
    assert parse({**body, "compaction": {"type": "compact"}}, counting=True)
    assert refused({**body, "metadata": {"user_id": "u"}}, counting=True).param == "metadata"


def test_openai_chat_refuses_what_it_cannot_price_and_forwards_what_it_does_not_know() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(json.dumps({**base, "web_search_options": {}}).encode())
    assert caught.value.param == "web_search_options"
    assert "billed per call" in caught.value.message
    chat = parse_chat_request(json.dumps({**base, "x_vendor": {"k": "v" * 400}}).encode())
    assert chat.body["x_vendor"] == {"k": "v" * 400}
    assert chat.input_tokens > parse_chat_request(json.dumps(base).encode()).input_tokens + 50


def test_refused_entries_are_refused_and_the_rest_are_not() -> None:
    """The table's effect is what the check does: a REFUSED entry is a 400 with its why."""
    for name, field in MESSAGES_FIELDS.fields.items():
        if field.effect is Effect.REFUSED and field.header is None:
            with pytest.raises(InvalidRequest) as caught:
                MESSAGES_FIELDS.check({name: None})
            assert caught.value.message == f"'{name}': {field.why}"
        elif field.header is None:
            MESSAGES_FIELDS.check({name: None})
