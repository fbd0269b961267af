"""The official `openai` SDK -> the gateway -> an `anthropic` upstream (the mock's Anthropic mode),
on real Valkey: translated requests and replies, usage and ledger equal to the mock's truth."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import redis

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from hardcap_core.rollup.records import parse_entry
from tests.stack import KEYS, Mock, config_data, gateway_thread

KEY_ENV = "HC_TEST_ANTHROPIC_KEY"
PRICE = {
    "input_per_million": 1.0,
    "output_per_million": 2.0,
    "cached_input_per_million": 0.25,
    "cache_write_per_million": 1.5,
}
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0.5, seed=23))
    yield m
    m.stop()


def config(mock: Mock, valkey: LocalValkey) -> dict[str, Any]:
    data = config_data(mock.url, valkey.url)
    data["upstreams"].append(
        {"name": "claude", "kind": "anthropic", "base_url": f"{mock.url}/v1",
         "timeout_seconds": 5, "api_key_env": KEY_ENV}
    )  # fmt: skip
    data["routes"].append(
        {"name": "claude", "upstream": "claude", "model": "mock-small", "price": PRICE,
         "max_output_tokens": 1024}
    )  # fmt: skip
    return data


@pytest.fixture
def stack(
    valkey: LocalValkey, mock: Mock, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, openai.OpenAI]]:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    with (
        gateway_thread(config(mock, valkey)) as base,
        openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0) as sdk,
    ):
        yield base, sdk


def budgets(base: str) -> dict[tuple[str, str], Any]:
    r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {KEYS['alpha']}"})
    return {(b["level"], b["dimension"]): b for b in r.json()["budgets"]}


def ask(text: str) -> Any:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


def test_a_whole_reply_and_its_usage_equal_the_truth(
    mock: Mock, stack: tuple[str, openai.OpenAI]
) -> None:
    base, sdk = stack
    done = sdk.chat.completions.create(
        model="claude", messages=ask("hi [mock:tokens=15]"), max_tokens=100, user="alpha",
        stop=["never"], temperature=1.7, top_p=0.9,
    )  # fmt: skip
    assert done.choices[0].message.content and done.choices[0].finish_reason == "stop"
    truth = mock.truth("alpha")
    assert done.usage is not None
    assert done.usage.prompt_tokens == truth["prompt_tokens"]
    assert done.usage.completion_tokens == truth["completion_tokens"] == 15
    used = budgets(base)[("tenant", "total_tokens")]
    assert used["used"] == truth["total_tokens"] and used["reserved"] == 0


def test_a_stream_reassembles_and_its_usage_chunk_equals_the_truth(
    mock: Mock, stack: tuple[str, openai.OpenAI]
) -> None:
    base, sdk = stack
    chunks = list(
        sdk.chat.completions.create(
            model="claude", messages=ask("hi [mock:tokens=30]"), max_tokens=100, user="alpha",
            stream=True, stream_options={"include_usage": True},
        )
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert len(text) > 30 and finishes[-1] == "stop"
    usage = chunks[-1].usage
    truth = mock.truth("alpha")
    assert usage is not None and usage.completion_tokens == truth["completion_tokens"] == 30
    assert usage.prompt_tokens == truth["prompt_tokens"]
    assert budgets(base)[("tenant", "total_tokens")]["used"] == truth["total_tokens"]


def test_tool_calls_stream_and_come_back_as_tool_results(
    mock: Mock, stack: tuple[str, openai.OpenAI]
) -> None:
    _, sdk = stack
    args: Any = {
        "model": "claude", "max_tokens": 200, "user": "alpha", "tools": [WEATHER],
        "messages": ask("What is the weather in Oslo? [mock:tokens=12]"),
    }  # fmt: skip
    with sdk.chat.completions.stream(**args) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert set(json.loads(call.function.arguments)) == {"city"}
    whole = sdk.chat.completions.create(**args)
    (again,) = whole.choices[0].message.tool_calls or []
    assert whole.choices[0].finish_reason == "tool_calls" and again.id != call.id
    assert again.type == "function" and set(json.loads(again.function.arguments)) == {"city"}
    # The next turn carries the call and its result: tool_use and tool_result blocks upstream.
    history = [
        *args["messages"],
        {"role": "assistant", "content": None, "tool_calls": [again.model_dump()]},
        {"role": "tool", "tool_call_id": again.id, "content": "Sunny, 21 C."},
        {"role": "user", "content": "Thanks! [mock:tokens=5]"},
    ]
    answer = sdk.chat.completions.create(**{**args, "messages": history, "tool_choice": "none"})
    assert answer.choices[0].message.content and answer.choices[0].finish_reason == "stop"


def png(width: int, height: int) -> str:
    header = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", width, height)
    return "data:image/png;base64," + base64.b64encode(header + b"\x08\x02\x00\x00\x00").decode()


def test_images_are_sent_and_billed_as_anthropic_bills_them(
    mock: Mock, stack: tuple[str, openai.OpenAI]
) -> None:
    base, sdk = stack
    content: Any = [
        {"type": "text", "text": "What is in these? [mock:tokens=4]"},
        {"type": "image_url", "image_url": {"url": png(750, 100)}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]
    done = sdk.chat.completions.create(
        model="claude", max_tokens=50, user="alpha",
        messages=[{"role": "user", "content": content}],
    )  # fmt: skip
    truth = mock.truth("alpha")
    assert done.usage is not None and done.usage.prompt_tokens == truth["prompt_tokens"]
    assert truth["prompt_tokens"] > 100 + 1_600  # the small image and the remote one's bound
    assert budgets(base)[("tenant", "total_tokens")]["used"] == truth["total_tokens"]


@pytest.mark.parametrize("ignore_cap", [False, True])
def test_a_thinking_stream_is_cut_at_a_60_token_output_budget(
    valkey: LocalValkey, mock: Mock, monkeypatch: pytest.MonkeyPatch, ignore_cap: bool
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    data = config(mock, valkey)
    data["tenants"][0]["budgets"] = [{"dimension": "output_tokens", "limit": 60, "window": "day"}]
    prompt = "Think hard. [mock:thinking=400] [mock:tokens=50]"
    prompt += " [mock:ignore_cap=1]" if ignore_cap else ""
    with (
        gateway_thread(data) as base,
        openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0) as sdk,
    ):
        chunks = list(
            sdk.chat.completions.create(
                model="claude", messages=ask(prompt), max_tokens=1000, user="alpha",
                stream=True, stream_options={"include_usage": True},
            )
        )  # fmt: skip
        used = budgets(base)[("tenant", "output_tokens")]
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["length"]
    shown = [
        c for c in chunks if c.choices and getattr(c.choices[0].delta, "reasoning_content", None)
    ]
    assert shown and len(shown) <= 60
    truth = mock.truth("alpha")
    assert used["used"] <= 60 and used["reserved"] == 0
    if not ignore_cap:
        # The gateway asked for at most what the budget had left, and charged no less than
        # the mock generated (the thinking's signature is counted too, so the count may
        # reach the budget first and the stream be cut there).
        assert truth["completion_tokens"] <= used["used"] <= 60


def test_cached_and_written_input_are_charged_at_their_prices(
    valkey: LocalValkey, mock: Mock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    data = config(mock, valkey)
    data["tenants"][0]["budgets"].append({"dimension": "cost_usd", "limit": 100, "window": "day"})
    prompt = (
        "Budgets are hard. " * 60 + "[mock:cache_read=128] [mock:cache_write=64] [mock:tokens=9]"
    )
    with (
        gateway_thread(data) as base,
        openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0) as sdk,
    ):
        done = sdk.chat.completions.create(
            model="claude", max_tokens=40, user="alpha",
            messages=[{"role": "user", "content": prompt}],
        )  # fmt: skip
        assert done.usage is not None and done.usage.prompt_tokens_details is not None
        assert done.usage.prompt_tokens_details.cached_tokens == 128
        truth = mock.truth("alpha")
        fresh = truth["prompt_tokens"] - 128 - 64
        want = fresh * 1000 + 128 * 250 + 64 * 1500 + truth["completion_tokens"] * 2000
        assert budgets(base)[("tenant", "cost_usd")]["used"] == want
    with redis.Redis.from_url(valkey.url) as r2:
        (record,) = [parse_entry(i, f) for i, f in r2.xrange("hc:{o:acme}:usage")]
    assert (record.cost_nusd, record.cached_input_tokens) == (want, 128)
