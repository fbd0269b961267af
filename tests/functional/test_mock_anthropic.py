"""The mock upstream's Anthropic mode with the official `anthropic` SDK as client: the Messages
API's events and bodies, its header and field checks, its bill and the ground truth."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from hardcap_core.local.mock_anthropic import (
    IMAGE_MAX_TOKENS,
    TOOL_SYSTEM_TOKENS,
    anthropic_prompt_tokens,
)
from hardcap_core.local.mock_upstream import MockSettings
from tests.stack import Mock, mock_fixture

WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}


mock = mock_fixture(MockSettings(pace_ms=0, seed=9))


@pytest.fixture
def sdk(mock: Mock) -> Iterator[anthropic.Anthropic]:
    mock.reset()
    with anthropic.Anthropic(base_url=mock.url, api_key="k", max_retries=0) as client:
        yield client


def says(text: str) -> Any:
    return [{"role": "user", "content": text}]


def test_a_whole_message_is_billed_like_anthropic(mock: Mock, sdk: anthropic.Anthropic) -> None:
    body: Any = {
        "model": "mock-small",
        "max_tokens": 100,
        "system": "Be brief.",
        "messages": says("hi [mock:tokens=12] [mock:cache_read=5] [mock:cache_write=3]"),
        "metadata": {"user_id": "ann"},
    }
    reply = sdk.messages.create(**body)
    assert reply.stop_reason == "end_turn"
    assert reply.content[0].type == "text" and reply.content[0].text
    bill = anthropic_prompt_tokens(body)
    assert reply.usage.cache_read_input_tokens == 5
    assert reply.usage.cache_creation_input_tokens == 3
    assert reply.usage.input_tokens == bill - 8
    assert reply.usage.output_tokens == 12
    counted = sdk.messages.count_tokens(
        model="mock-small", system="Be brief.", messages=body["messages"]
    )
    assert counted.input_tokens == bill
    truth = mock.truth("ann")
    assert truth["prompt_tokens"] == bill and truth["completion_tokens"] == 12


def test_a_stream_of_thinking_then_text_in_anthropic_events(
    mock: Mock, sdk: anthropic.Anthropic
) -> None:
    payload = {
        "model": "mock-small",
        "max_tokens": 100,
        "stream": True,
        "messages": says("think [mock:thinking=7] [mock:tokens=5]"),
        "metadata": {"user_id": "ben"},
    }
    names: list[str] = []
    usages: list[dict[str, Any]] = []
    with mock.http.stream("POST", "/v1/messages", json=payload, headers=HEADERS) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = json.loads(line[6:])
                names.append(data["delta"]["type"] if "index" in data and "delta" in data
                             else data["type"])  # fmt: skip
                usage = data.get("usage") or (data.get("message") or {}).get("usage")
                usages += [usage] if usage else []
    with sdk.messages.stream(**{k: v for k, v in payload.items() if k != "stream"}) as stream:
        final = stream.get_final_message()
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names.count("thinking_delta") == 7 and names.count("text_delta") == 5
    assert names.count("signature_delta") == 1 and names[-1] == "message_stop"
    # As Anthropic streams it: message_start counts one output token before any is sent, and
    # message_delta's cumulative count replaces it.
    assert [u["output_tokens"] for u in usages] == [1, 12]
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].type == "thinking" and final.content[0].signature
    assert final.usage.output_tokens == 12
    assert mock.truth("ben")["completion_tokens"] == 24  # both streams


def test_max_tokens_covers_thinking_and_ends_with_max_tokens(
    mock: Mock, sdk: anthropic.Anthropic
) -> None:
    with sdk.messages.stream(
        model="mock-small", max_tokens=10, messages=says("[mock:thinking=50]"),
        metadata={"user_id": "cy"},
    ) as stream:  # fmt: skip
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 10
    assert [b.type for b in final.content] == ["thinking"]
    capped = sdk.messages.create(
        model="mock-small", max_tokens=10, messages=says("[mock:tokens=40] [mock:ignore_cap=1]")
    )
    assert capped.usage.output_tokens == 40


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_blocks(sdk: anthropic.Anthropic, stream: bool) -> None:
    params: Any = {
        "model": "mock-small",
        "max_tokens": 200,
        "tools": [WEATHER],
        "messages": says("What is the weather in Oslo? [mock:tokens=12]"),
    }
    if stream:
        with sdk.messages.stream(**params) as s:
            final = s.get_final_message()
    else:
        final = sdk.messages.create(**params)
    assert final.stop_reason == "tool_use"
    block = final.content[-1]
    assert block.type == "tool_use" and block.name == "get_weather"
    assert set(block.input) == {"city"}
    forced = sdk.messages.create(**{**params, "messages": says("hi [mock:tool_use=1]")})
    assert forced.content[-1].type == "tool_use"
    named = sdk.messages.create(
        **{**params, "messages": says("hi"), "tool_choice": {"type": "tool", "name": "other"}}
    )
    assert named.content[-1].type == "tool_use" and named.content[-1].name == "other"
    none = sdk.messages.create(**{**params, "tool_choice": {"type": "none"}})
    assert none.content[-1].type == "text"


def png(width: int, height: int) -> str:
    header = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", width, height)
    return base64.b64encode(header + b"\x08\x02\x00\x00\x00").decode()


def test_the_bill_counts_images_tools_and_every_block() -> None:
    def image(source: Any) -> Any:
        return {"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image", "source": source}]}]}  # fmt: skip

    small = anthropic_prompt_tokens(
        image({"type": "base64", "media_type": "image/png", "data": png(750, 100)})
    )
    assert small == 3 + 100
    big = anthropic_prompt_tokens(
        image({"type": "base64", "media_type": "image/png", "data": png(4000, 4000)})
    )
    assert big == 3 + 1_640  # scaled to ~1109 x 1109 (1.23 MP): 1,639.1 -> 1,640
    remote = anthropic_prompt_tokens(image({"type": "url", "url": "https://x/y.png"}))
    assert remote == 3 + IMAGE_MAX_TOKENS
    plain: Any = {"model": "m", "messages": says("hello")}
    with_tools = {**plain, "tools": [WEATHER]}
    assert anthropic_prompt_tokens(with_tools) > anthropic_prompt_tokens(plain) + TOOL_SYSTEM_TOKENS
    history = {
        "model": "m",
        "messages": [
            *says("hello"),
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "get_weather",
                 "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "sunny and warm"}]},
        ],
    }  # fmt: skip
    assert anthropic_prompt_tokens(history) > anthropic_prompt_tokens(plain) + 3 + 3 + 5


@pytest.mark.parametrize(
    ("headers", "body", "status", "kind"),
    [
        ({"anthropic-version": "2023-06-01"}, {}, 401, "authentication_error"),
        ({"x-api-key": "k"}, {}, 400, "invalid_request_error"),
        (HEADERS, {"max_tokens": None}, 400, "invalid_request_error"),
        (HEADERS, {"user": "x"}, 400, "invalid_request_error"),
        (HEADERS, {"messages": [{"role": "tool", "content": "x"}]}, 400, "invalid_request_error"),
        (HEADERS, {"metadata": {"tenant": "x"}}, 400, "invalid_request_error"),
        (HEADERS, {"temperature": 1.5}, 400, "invalid_request_error"),
        (HEADERS, {"thinking": {"type": "enabled", "budget_tokens": 100}}, 400,
         "invalid_request_error"),
        (HEADERS, {"messages": says("x [mock:status=529]")}, 529, "overloaded_error"),
        (HEADERS, {"messages": says("x [mock:audio=1]")}, 400, "invalid_request_error"),
    ],
)  # fmt: skip
def test_what_the_real_api_refuses_is_refused_in_its_error_shape(
    mock: Mock, headers: dict[str, str], body: dict[str, Any], status: int, kind: str
) -> None:
    payload = {"model": "mock-small", "max_tokens": 50, "messages": says("hi"), **body}
    payload = {k: v for k, v in payload.items() if v is not None}
    r = mock.http.post("/v1/messages", json=payload, headers=headers)
    assert r.status_code == status
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == kind


def test_faults_and_stream_errors_in_the_anthropic_mode(
    mock: Mock, sdk: anthropic.Anthropic
) -> None:
    mock.http.post("/mock/fault", json={"status": 429, "seconds": 5, "retry_after": 2})
    with pytest.raises(anthropic.RateLimitError) as caught:
        sdk.messages.create(model="mock-small", max_tokens=5, messages=says("hi"))
    assert caught.value.response.headers["retry-after"] == "2"
    mock.http.post("/mock/fault", json={"mode": "hang", "seconds": 5})
    with pytest.raises(httpx.ReadTimeout):
        mock.http.post(
            "/v1/messages", headers=HEADERS, timeout=0.3,
            json={"model": "m", "max_tokens": 5, "messages": says("hi")},
        )  # fmt: skip
    mock.http.post("/mock/fault", json={})
    with (
        pytest.raises(anthropic.APIStatusError, match="Overloaded"),
        sdk.messages.stream(
            model="mock-small", max_tokens=50, messages=says("[mock:malformed=3] [mock:tokens=9]")
        ) as stream,
    ):
        stream.until_done()
