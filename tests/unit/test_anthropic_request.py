"""An OpenAI chat request translated into an Anthropic Messages request, field by field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hardcap_core.chat import ChatRequest
from hardcap_core.errors import InvalidRequest
from hardcap_core.providers.anthropic import AnthropicMessages
from hardcap_core.providers.anthropic_request import messages_body
from hardcap_core.providers.transport import CallbackTransport, Reply


def request(**body: Any) -> ChatRequest:
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return ChatRequest(
        body={"model": "r", **body}, model="r", stream=False, include_usage=False,
        max_tokens=None, max_tokens_field="max_tokens", input_tokens=10, dialect="openai_chat",
    )  # fmt: skip


def translate(max_tokens: int = 100, **body: Any) -> dict[str, Any]:
    return messages_body(request(**body), "claude-x", max_tokens, stream=False)


def test_system_and_developer_messages_become_the_system_blocks() -> None:
    out = translate(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "No jokes."}]},
            {"role": "user", "content": "hi"},
        ]
    )
    assert out["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "No jokes."},
    ]
    assert out["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert (out["model"], out["max_tokens"]) == ("claude-x", 100) and "stream" not in out


def test_tool_calls_and_results_become_blocks_and_turns_are_merged() -> None:
    out = translate(
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "user", "content": "in Oslo"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "thanks"},
        ]
    )  # fmt: skip
    assert out["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "weather?"}, {"type": "text", "text": "in Oslo"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "call_1", "name": "get_weather",
             "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1",
             "content": [{"type": "text", "text": "sunny"}]},
            {"type": "text", "text": "thanks"}]},
    ]  # fmt: skip


def test_tool_results_go_first_in_a_merged_turn() -> None:
    out = translate(
        messages=[
            {"role": "user", "content": "x"},
            {"role": "tool", "tool_call_id": "c", "content": "r"},
        ]
    )
    assert [b["type"] for b in out["messages"][0]["content"]] == ["tool_result", "text"]


def test_images_and_files_become_sources() -> None:
    out = translate(
        messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}},
            {"type": "image_url", "image_url": {"url": "https://x.test/cat.jpg", "detail": "low"}},
            {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0x"}},
        ]}]
    )  # fmt: skip
    blocks = out["messages"][0]["content"]
    assert blocks == [
        {"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "iVBORw0K"}},
        {"type": "image", "source": {"type": "url", "url": "https://x.test/cat.jpg"}},
        {"type": "document", "source": {
            "type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("choice", "want"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ({"type": "function", "function": {"name": "f"}}, {"type": "tool", "name": "f"}),
    ],
)
def test_tools_and_tool_choice(choice: Any, want: dict[str, Any]) -> None:
    tool = {"type": "function", "function": {
        "name": "f", "description": "d", "parameters": {"type": "object"}}}  # fmt: skip
    out = translate(tools=[tool], tool_choice=choice)
    assert out["tools"] == [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]
    assert out["tool_choice"] == want
    serial = translate(tools=[tool], parallel_tool_calls=False)
    assert serial["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}


def test_sampling_stop_and_user() -> None:
    out = translate(stop="END", temperature=1.6, top_p=0.5, user="u-1", seed=3, n=1,
                    presence_penalty=0.2, stream_options={"include_usage": True})  # fmt: skip
    assert out["stop_sequences"] == ["END"]
    assert (out["temperature"], out["top_p"]) == (1.0, 0.5)
    assert out["metadata"] == {"user_id": "u-1"}
    for leaked in ("seed", "n", "presence_penalty", "stream_options", "user"):
        assert leaked not in out
    assert translate(stop=["a", "b"])["stop_sequences"] == ["a", "b"]


@pytest.mark.parametrize(
    ("max_tokens", "budget", "want"),
    [
        (5_000, 2_000, 2_000),  # fits: as given
        (3_000, 4_000, 2_999),  # at or over the cap: just under it
        (800, 2_000, None),  # the cap leaves no room for the minimum: thinking off
    ],
)
def test_a_thinking_budget_is_kept_under_max_tokens(
    max_tokens: int, budget: int, want: int | None
) -> None:
    out = translate(max_tokens, thinking={"type": "enabled", "budget_tokens": budget})
    if want is None:
        assert "thinking" not in out
    else:
        assert out["thinking"] == {"type": "enabled", "budget_tokens": want}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 2}, "n"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "sometimes"},
         "tool_choice"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "assistant", "tool_calls": [
            {"id": "c", "function": {"name": "f", "arguments": "{cut"}}]}]},
         "messages[0].tool_calls[0]"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]"),
        ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
    ],
)  # fmt: skip
def test_what_anthropic_cannot_take_is_refused_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        translate(**body)
    assert caught.value.param == param


async def test_the_request_carries_the_key_and_version_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hardcap_core.auth import hash_key
    from hardcap_core.config import parse_config

    monkeypatch.setenv("HC_UNIT_ANTHROPIC", "sk-ant-1")
    config = parse_config({
        "gateway": {"redis_url": "redis://x"},
        "upstreams": [{"name": "a", "kind": "anthropic", "base_url": "https://api.test/v1/",
                       "api_key_env": "HC_UNIT_ANTHROPIC"}],
        "routes": [{"name": "r", "upstream": "a", "model": "claude-x",
                    "price": {"input_per_million": 1, "output_per_million": 1}}],
        "tenants": [{"id": "t", "keys": [{"id": "k", "hash": hash_key("sk-x")}]}],
    })  # fmt: skip
    body = json.dumps({"type": "message", "content": [], "usage": {}}).encode()
    http = CallbackTransport(lambda _: Reply(200, {}, body))
    await AnthropicMessages(http).complete(config.routes["r"], request(), 50)
    (sent,) = http.sent
    assert sent.url == "https://api.test/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant-1"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers


def test_a_request_in_anthropic_format_keeps_its_cache_marks_thinking_and_top_k() -> None:
    """Claude Code through the gateway: prompt-cache marks (else every turn pays full input),
    the signed thinking block ahead of the last turn's tool_use (else Anthropic refuses the
    request with thinking on), and top_k all reach an Anthropic upstream."""
    import json

    from hardcap_core.wire.anthropic_request import parse_messages_request

    mark = {"type": "ephemeral"}
    raw = {
        "model": "m", "max_tokens": 4000, "top_k": 7,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "system": [{"type": "text", "text": "Be brief.", "cache_control": mark}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": mark}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "go", "cache_control": mark}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "plan", "signature": "sig=="},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}]},
        ],
    }  # fmt: skip
    request = parse_messages_request(json.dumps(raw).encode())
    body = messages_body(request, "claude", 4000, stream=True)
    assert body["top_k"] == 7 and body["thinking"]["budget_tokens"] == 2048
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": mark}]
    assert body["tools"][0]["cache_control"] == mark
    assert body["messages"][0]["content"][0]["cache_control"] == mark
    assistant = body["messages"][1]["content"]
    assert [b["type"] for b in assistant] == ["thinking", "tool_use"]
    assert assistant[0]["signature"] == "sig=="
