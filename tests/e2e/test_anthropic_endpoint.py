"""The official `anthropic` SDK against `/v1/messages` and `/v1/messages/count_tokens`, through
the gateway to the OpenAI-compatible mock upstream, on real Valkey: replies, streams, tools,
thinking, truncation at the budget, errors, and usage equal to the mock's ground truth."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from tests.stack import KEYS, Mock, config_data, gateway, gateway_thread, mock_fixture
from tests.stack import anthropic_client as client

HI: Any = [{"role": "user", "content": "Say something about budgets."}]
ALPHA: Any = {"user_id": "alpha"}  # becomes the OpenAI `user`, the mock's tenant
WEATHER: Any = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


mock = mock_fixture(MockSettings(pace_ms=0.5, seed=17))


def used(base: str, dimension: str = "total_tokens") -> dict[str, Any]:
    r = httpx.get(f"{base}/hardcap/usage", headers={"x-api-key": KEYS["alpha"]})
    r.raise_for_status()
    rows: dict[tuple[str, str], dict[str, Any]] = {
        (b["level"], b["dimension"]): b for b in r.json()["budgets"]
    }
    return rows[("tenant", dimension)]


def test_message_non_stream_usage_is_the_mocks_and_the_ledgers(
    mock: Mock, flushed: LocalValkey
) -> None:
    with gateway(mock, flushed) as base:
        raw = client(base).messages.with_raw_response.create(
            model="small", max_tokens=50, messages=HI, metadata=ALPHA
        )
        message = raw.parse()
        assert message.type == "message" and message.role == "assistant"
        assert message.model == "small"
        assert message.content[0].type == "text" and message.content[0].text
        assert message.stop_reason in ("end_turn", "max_tokens")
        truth = mock.truth("alpha")
        assert message.usage.output_tokens == truth["completion_tokens"] <= 50
        assert message.usage.input_tokens == truth["prompt_tokens"]
        row = used(base)
        assert row["used"] == truth["total_tokens"] and row["reserved"] == 0
        assert int(raw.headers["x-token-budget-remaining"]) == 1_000_000 - row["used"]
        assert raw.headers["anthropic-ratelimit-tokens-remaining"] == str(1_000_000 - row["used"])
        assert raw.headers["x-ratelimit-remaining-tokens"]


def test_stream_with_the_helper_and_with_create(mock: Mock, flushed: LocalValkey) -> None:
    with gateway(mock, flushed) as base:
        c = client(base)
        with c.messages.stream(model="small", max_tokens=80, messages=HI, metadata=ALPHA) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        assert text and final.content[0].type == "text" and final.content[0].text == text
        first = mock.truth("alpha")
        assert final.usage.output_tokens == first["completion_tokens"]
        assert final.usage.input_tokens == first["prompt_tokens"]

        events = list(
            c.messages.create(
                model="small", max_tokens=80, messages=HI, metadata=ALPHA, stream=True
            )
        )
        kinds = [e.type for e in events]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
        assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
        delta = events[-2]
        assert delta.type == "message_delta"
        assert delta.delta.stop_reason in ("end_turn", "max_tokens")
        truth = mock.truth("alpha")
        assert delta.usage.output_tokens == truth["completion_tokens"] - first["completion_tokens"]
        assert used(base)["used"] == truth["total_tokens"]


def test_tools_round_trip_stream_and_not(mock: Mock, flushed: LocalValkey) -> None:
    ask: Any = [{"role": "user", "content": "What is the weather in Paris? [mock:tokens=20]"}]
    with gateway(mock, flushed) as base:
        c = client(base)
        first = c.messages.create(
            model="small", max_tokens=200, messages=ask, tools=WEATHER, metadata=ALPHA
        )
        assert first.stop_reason == "tool_use"
        call = next(b for b in first.content if b.type == "tool_use")
        assert call.name == "get_weather" and isinstance(call.input, dict) and call.input
        # The result goes back as a tool_result block: OpenAI's tool message upstream.
        follow: Any = [
            *ask,
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"},
                    {"type": "text", "text": "Thanks. And tomorrow?"},
                ],
            },
        ]
        second = c.messages.create(
            model="small",
            max_tokens=50,
            messages=follow,
            tools=WEATHER,
            tool_choice={"type": "none"},
            metadata=ALPHA,
        )
        assert second.content[0].type == "text" and second.stop_reason != "tool_use"

        with c.messages.stream(
            model="small",
            max_tokens=200,
            messages=ask,
            tools=WEATHER,
            tool_choice={"type": "tool", "name": "get_weather"},
            metadata=ALPHA,
        ) as s:
            final = s.get_final_message()
        streamed = [b for b in final.content if b.type == "tool_use"]
        assert len(streamed) == 1 and streamed[0].name == "get_weather"
        assert isinstance(streamed[0].input, dict) and streamed[0].input
        assert final.stop_reason == "tool_use"
        truth = mock.truth("alpha")
        assert used(base)["used"] == truth["total_tokens"]


def test_thinking_streams_as_thinking_blocks(mock: Mock, flushed: LocalValkey) -> None:
    with gateway(mock, flushed) as base:
        with client(base).messages.stream(
            model="reason",
            max_tokens=1500,
            messages=[{"role": "user", "content": "think [mock:tokens=5]"}],
            thinking={"type": "enabled", "budget_tokens": 1024},
            metadata=ALPHA,
        ) as s:
            final = s.get_final_message()
        kinds = [b.type for b in final.content]
        assert kinds[0] == "thinking" and "text" in kinds
        thinking = final.content[0]
        assert thinking.type == "thinking" and thinking.thinking
        truth = mock.truth("alpha")
        assert final.usage.output_tokens == truth["completion_tokens"]
        assert used(base)["used"] == truth["total_tokens"]


def test_stream_truncated_at_a_60_token_output_budget(mock: Mock, flushed: LocalValkey) -> None:
    budget = [{"dimension": "output_tokens", "limit": 60, "window": "day"}]
    with gateway(mock, flushed, **{"tenants.0.budgets": budget}) as base:
        with client(base).messages.stream(
            model="reason",
            max_tokens=400,
            messages=[{"role": "user", "content": "think hard [mock:tokens=400] [mock:pace_ms=2]"}],
            metadata=ALPHA,
        ) as s:
            final = s.get_final_message()
        assert final.stop_reason == "max_tokens"
        assert final.content and final.content[0].type == "thinking"
        truth = mock.truth("alpha")
        assert truth["aborted"] == 1, truth  # the upstream was closed, not drained
        assert truth["completion_tokens"] <= 60
        row = used(base, "output_tokens")
        assert row["reserved"] == 0 and truth["completion_tokens"] <= row["used"] <= 60
        assert final.usage.output_tokens == row["used"]


def test_count_tokens_is_the_reservation_and_costs_nothing(
    mock: Mock, flushed: LocalValkey
) -> None:
    with gateway(mock, flushed) as base:
        c = client(base)
        counted = c.messages.count_tokens(
            model="small", messages=HI, system="Be brief.", tools=WEATHER
        )
        plain = c.messages.count_tokens(model="small", messages=HI)
        assert counted.input_tokens > plain.input_tokens > 0
        row = used(base)
        assert (row["used"], row["reserved"]) == (0, 0)
        assert mock.truth("alpha") == {}  # no upstream call
        # An upper bound on what the provider bills for the same prompt.
        message = c.messages.create(model="small", max_tokens=5, messages=HI, metadata=ALPHA)
        assert plain.input_tokens >= message.usage.input_tokens
        with pytest.raises(anthropic.AuthenticationError):
            client(base, "sk-wrong").messages.count_tokens(model="small", messages=HI)
        with pytest.raises(anthropic.PermissionDeniedError):
            client(base, KEYS["beta"]).messages.count_tokens(model="reason", messages=HI)
        with pytest.raises(anthropic.NotFoundError):
            c.messages.count_tokens(model="nope", messages=HI)


def test_errors_in_anthropics_shape(mock: Mock, flushed: LocalValkey) -> None:
    budget = [{"dimension": "total_tokens", "limit": 30, "window": "day"}]
    with gateway(mock, flushed, **{"tenants.0.budgets": budget}) as base:
        with pytest.raises(anthropic.AuthenticationError) as auth:
            client(base, "sk-wrong").messages.create(model="small", max_tokens=5, messages=HI)
        assert auth.value.body == {
            "type": "error",
            "error": {
                "type": "authentication_error",
                "message": "Incorrect API key provided.",
                "code": "invalid_api_key",
            },
        }
        with pytest.raises(anthropic.RateLimitError) as refused:
            client(base).messages.create(model="small", max_tokens=500, messages=HI)
        assert refused.value.status_code == 429
        headers = refused.value.response.headers
        assert headers["x-token-budget-limit"] == "30"
        assert headers["anthropic-ratelimit-tokens-limit"] == "30"
        assert headers["x-should-retry"] == "false"
        body: Any = refused.value.body
        assert body["error"]["type"] == "rate_limit_error"
        assert body["error"]["code"] == "budget_exceeded"
        # The SDK checks max_tokens itself; other clients do not, so the gateway does too.
        body_without = {"model": "small", "messages": HI}
        with pytest.raises(anthropic.BadRequestError) as missing:
            client(base).post("/v1/messages", body=body_without, cast_to=httpx.Response)
        missing_body: Any = missing.value.body
        assert missing_body["error"]["type"] == "invalid_request_error"
        assert "'max_tokens' is required" in missing_body["error"]["message"]
        with pytest.raises(anthropic.NotFoundError):
            client(base).messages.create(model="nope", max_tokens=5, messages=HI)
        with pytest.raises(anthropic.PermissionDeniedError):
            client(base, KEYS["beta"]).messages.create(model="reason", max_tokens=5, messages=HI)
        nothing = used(base)
        assert (nothing["used"], nothing["reserved"]) == (0, 0)

        wrong_method = httpx.get(f"{base}/messages", headers={"x-api-key": KEYS["alpha"]})
        assert wrong_method.status_code == 405
        assert wrong_method.json()["type"] == "error"
        no_route = httpx.post(f"{base}/messages/batches", headers={"x-api-key": KEYS["alpha"]})
        assert no_route.status_code == 404
        assert no_route.json()["error"]["type"] == "not_found_error"
        bad = httpx.post(
            f"{base}/messages",
            headers={"x-api-key": KEYS["alpha"]},
            content=json.dumps({"model": "small", "max_tokens": 5, "messages": HI, "speed": 1}),
        )
        assert bad.status_code == 400
        assert bad.json()["error"]["type"] == "invalid_request_error"
        assert "speed" in bad.json()["error"]["message"]


def test_error_mid_stream_is_an_anthropic_error_event(mock: Mock, flushed: LocalValkey) -> None:
    with gateway(mock, flushed) as base:
        stream = client(base).messages.create(
            model="small",
            max_tokens=100,
            messages=[{"role": "user", "content": "go [mock:tokens=50] [mock:die_after=5]"}],
            metadata=ALPHA,
            stream=True,
        )
        with pytest.raises(anthropic.APIStatusError) as failed:
            list(stream)
        body: Any = failed.value.body
        assert body["type"] == "error" and body["error"]["type"] == "api_error"
        assert used(base)["reserved"] == 0


# -- in front of an Anthropic upstream (the mock's Anthropic mode) ---------------------------------

KEY_ENV = "HARDCAP_TEST_ANTHROPIC_KEY"


def claude(mock: Mock, valkey: LocalValkey, **overrides: Any) -> Any:
    """A gateway whose routes `claude` and `claude-small` go to the mock's Anthropic mode."""
    data = config_data(mock.url, valkey.url, **overrides)
    data["upstreams"].append(
        {
            "name": "anthropic-mock",
            "kind": "anthropic",
            "base_url": f"{mock.url}/v1",
            "api_key_env": KEY_ENV,
            "timeout_seconds": 5,
        }
    )
    price = {"input_per_million": 3.0, "output_per_million": 15.0}
    for name, model in (("claude", "mock-reason"), ("claude-small", "mock-small")):
        data["routes"].append(
            {
                "name": name,
                "upstream": "anthropic-mock",
                "model": model,
                "price": price,
                "max_output_tokens": 4096,
            }
        )
    return gateway_thread(data)


@pytest.fixture
def anthropic_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-ant-mock")


@pytest.mark.usefixtures("anthropic_key")
def test_anthropic_upstream_non_stream_usage_with_cache_reads(
    mock: Mock, flushed: LocalValkey
) -> None:
    ask: Any = [{"role": "user", "content": "Hello [mock:tokens=12] [mock:cache_read=10]"}]
    with claude(mock, flushed) as base:
        raw = client(base).messages.with_raw_response.create(
            model="claude-small", max_tokens=100, messages=ask, metadata=ALPHA
        )
        message = raw.parse()
        assert message.model == "claude-small" and message.content[0].type == "text"
        assert message.stop_reason == "end_turn"
        truth = mock.truth("alpha")
        usage = message.usage
        assert usage.cache_read_input_tokens == 10
        assert usage.input_tokens + 10 == truth["prompt_tokens"]
        assert usage.output_tokens == truth["completion_tokens"] == 12
        assert used(base)["used"] == truth["total_tokens"]
        assert raw.headers["anthropic-ratelimit-tokens-remaining"]


@pytest.mark.usefixtures("anthropic_key")
def test_anthropic_upstream_thinking_end_to_end(mock: Mock, flushed: LocalValkey) -> None:
    ask: Any = [{"role": "user", "content": "Think [mock:thinking=20] [mock:tokens=8]"}]
    with claude(mock, flushed) as base:
        with client(base).messages.stream(
            model="claude",
            max_tokens=2048,
            messages=ask,
            thinking={"type": "enabled", "budget_tokens": 1024},
            metadata=ALPHA,
        ) as s:
            final = s.get_final_message()
        thinking = final.content[0]
        assert thinking.type == "thinking" and thinking.thinking and thinking.signature
        assert final.content[-1].type == "text" and final.model == "claude"
        truth = mock.truth("alpha")
        assert final.usage.output_tokens == truth["completion_tokens"]
        assert final.usage.input_tokens == truth["prompt_tokens"]
        assert used(base)["used"] == truth["total_tokens"]

        # The thinking goes back with its signature in the next turn, as Anthropic requires.
        follow: Any = [
            *ask,
            {"role": "assistant", "content": [b.model_dump() for b in final.content]},
            {"role": "user", "content": "And then? [mock:tokens=3]"},
        ]
        again = client(base).messages.create(
            model="claude",
            max_tokens=2048,
            messages=follow,
            thinking={"type": "enabled", "budget_tokens": 1024},
            metadata=ALPHA,
        )
        assert again.content[-1].type == "text"


@pytest.mark.usefixtures("anthropic_key")
def test_anthropic_upstream_thinking_truncated_at_a_60_token_budget(
    mock: Mock, flushed: LocalValkey
) -> None:
    budget = [{"dimension": "output_tokens", "limit": 60, "window": "day"}]
    ask: Any = [{"role": "user", "content": "Think [mock:thinking=400] [mock:pace_ms=2]"}]
    with claude(mock, flushed, **{"tenants.0.budgets": budget}) as base:
        events = list(
            client(base).messages.create(
                model="claude", max_tokens=400, messages=ask, metadata=ALPHA, stream=True
            )
        )
        kinds = [e.type for e in events]
        assert kinds[-2:] == ["message_delta", "message_stop"]
        assert kinds.count("content_block_start") == kinds.count("content_block_stop") >= 1
        end = events[-2]
        assert end.type == "message_delta" and end.delta.stop_reason == "max_tokens"
        truth = mock.truth("alpha")
        assert truth["aborted"] == 1 and truth["completion_tokens"] <= 60
        row = used(base, "output_tokens")
        assert row["reserved"] == 0 and truth["completion_tokens"] <= row["used"] <= 60
        assert end.usage.output_tokens == row["used"]


@pytest.mark.usefixtures("anthropic_key")
def test_anthropic_upstream_tools_round_trip(mock: Mock, flushed: LocalValkey) -> None:
    ask: Any = [{"role": "user", "content": "Weather in Paris? [mock:tool_use=1] [mock:tokens=12]"}]
    with claude(mock, flushed) as base:
        c = client(base)
        with c.messages.stream(
            model="claude-small", max_tokens=200, messages=ask, tools=WEATHER, metadata=ALPHA
        ) as s:
            first = s.get_final_message()
        assert first.stop_reason == "tool_use"
        call = next(b for b in first.content if b.type == "tool_use")
        assert call.name == "get_weather" and call.input
        follow: Any = [
            *ask,
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny"},
                    {"type": "text", "text": "Thanks [mock:tokens=4]"},
                ],
            },
        ]
        second = c.messages.create(
            model="claude-small", max_tokens=50, messages=follow, tools=WEATHER, metadata=ALPHA
        )
        assert second.content[0].type == "text"
        truth = mock.truth("alpha")
        assert used(base)["used"] == truth["total_tokens"]


@pytest.mark.usefixtures("anthropic_key")
def test_count_tokens_bounds_what_the_anthropic_upstream_bills(
    mock: Mock, flushed: LocalValkey
) -> None:
    ask: Any = [{"role": "user", "content": "Weather in Paris, please? [mock:tokens=3]"}]
    with claude(mock, flushed) as base:
        c = client(base)
        counted = c.messages.count_tokens(
            model="claude-small", messages=ask, tools=WEATHER, system="Be brief."
        )
        assert mock.truth("alpha") == {}
        message = c.messages.create(
            model="claude-small",
            max_tokens=20,
            messages=ask,
            tools=WEATHER,
            system="Be brief.",
            tool_choice={"type": "none"},
            metadata=ALPHA,
        )
        assert (
            counted.input_tokens
            >= message.usage.input_tokens
            == mock.truth("alpha")["prompt_tokens"]
        )
