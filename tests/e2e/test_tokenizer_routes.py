"""Routes with a tokenizer, end to end: the gateway on real Valkey, the mock upstream billing
with cl100k_base, the official SDKs as clients.

- A request whose bound does not fit the budget, but whose exact count does, is admitted on a
  route with ``tokenizer: cl100k_base`` (and refused on a route without one); what the mock
  bills stays within the budget.
- ``exact_count: always`` holds the exact count: the budget left at admission says so.
- ``count_tokens`` and an Anthropic stream's ``message_start`` answer the exact count, which
  is never below what the mock bills for the same prompt, and well below the bound.
- ``count_api``: the Anthropic upstream's own count (with its slack), cached by prompt
  prefix; when the upstream stalls, the calibrated bound after the timeout, or the cached
  count of the conversation so far plus the calibrated bound of the rest.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from hardcap_core.tokenize import count_api
from hardcap_core.tokenize.counters import BpeCounter, CalibratedCounter
from hardcap_core.wire.anthropic_request import parse_messages_request
from tests.input_shapes import PROSE, agent_tool, agent_turns
from tests.stack import KEYS, Mock, config_data, gateway_thread

PRICE = {"input_per_million": 1.0, "output_per_million": 2.0}
KEY_ENV = "HARDCAP_TEST_TOKENIZER_KEY"
BUDGET = 4_000
MAX_TOKENS = 64
LONG: Any = [{"role": "user", "content": PROSE * 25}]  # ~1,800 tokens; its bound ~4,700
ALPHA: Any = {"user_id": "alpha"}


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0.5, seed=11))
    yield m
    m.stop()


def route(name: str, upstream: str = "mock", **fields: Any) -> dict[str, Any]:
    return {"name": name, "upstream": upstream, "model": "mock-small", "price": PRICE,
            "max_output_tokens": 1024, **fields}  # fmt: skip


@pytest.fixture
def base(valkey: LocalValkey, mock: Mock, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A gateway whose tenant alpha has 4,000 tokens a day: routes `small` (the bound),
    `exact` and `exact-always` (cl100k_base, the mock's own tokenizer) and `claude-counted`
    (an Anthropic upstream, the mock in its Anthropic mode, with count_api)."""
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    budgets = [{"dimension": "total_tokens", "limit": BUDGET, "window": "day"}]
    data = config_data(mock.url, valkey.url, **{"tenants.0.budgets": budgets})
    data["upstreams"].append(
        {"name": "claude", "kind": "anthropic", "base_url": f"{mock.url}/v1",
         "timeout_seconds": 5, "api_key_env": KEY_ENV}
    )  # fmt: skip
    data["routes"] += [
        route("exact", tokenizer="cl100k_base"),
        route("exact-always", tokenizer="cl100k_base", exact_count="always"),
        route("claude-counted", "claude", model="claude-sonnet-4-5", count_api=True),
    ]
    with gateway_thread(data) as url:
        yield url


def sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0)


def claude(url: str, key: str = KEYS["alpha"]) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key=key, max_retries=0)


def used(base: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {KEYS['alpha']}"})
    row: dict[str, Any] = next(b for b in r.json()["budgets"] if b["level"] == "tenant")
    return row


def exact(body: dict[str, Any]) -> int:
    return BpeCounter("cl100k_base").count(body)


def test_the_exact_count_admits_what_the_bound_refuses(base: str, mock: Mock) -> None:
    with sdk(base) as client:
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(
                model="small", messages=LONG, max_tokens=MAX_TOKENS, user="alpha"
            )
        assert refused.value.code == "budget_exceeded"
        reply = client.chat.completions.create(
            model="exact", messages=LONG, max_tokens=MAX_TOKENS, user="alpha"
        )
    assert reply.usage is not None
    billed = mock.truth("alpha")
    assert reply.usage.prompt_tokens == billed["prompt_tokens"]
    assert exact({"messages": LONG}) >= billed["prompt_tokens"]
    row = used(base)
    assert row["reserved"] == 0
    assert row["used"] == billed["prompt_tokens"] + billed["completion_tokens"] <= BUDGET


def test_exact_count_always_holds_the_count(base: str) -> None:
    body = {"model": "exact-always", "messages": LONG, "max_tokens": MAX_TOKENS, "stream": True,
            "user": "alpha"}  # fmt: skip
    headers = {"authorization": f"Bearer {KEYS['alpha']}"}
    with httpx.stream("POST", f"{base}/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        remaining = int(r.headers["x-token-budget-remaining"])
        r.read()
    assert remaining == BUDGET - exact(body) - MAX_TOKENS  # held: the count and the output


def test_an_agent_request_is_held_within_10_percent_of_its_bill(base: str, mock: Mock) -> None:
    """Ten nested tools and two rounds of parallel calls: counted as JSON (1.5 times their bill)
    this did not fit the budget; counted as OpenAI renders them it is admitted, held at most
    10% above what the mock bills, never below."""
    messages, tools = agent_turns(2, 2, 300), [agent_tool(i) for i in range(10)]
    body = {"model": "exact-always", "messages": messages, "tools": tools}
    with sdk(base) as client, client.chat.completions.with_streaming_response.create(
        model="exact-always", messages=messages, tools=tools, max_tokens=MAX_TOKENS,
        user="alpha", stream=True,
    ) as streamed:  # fmt: skip
        held = BUDGET - int(streamed.headers["x-token-budget-remaining"]) - MAX_TOKENS
        assert [chunk for chunk in streamed.parse()]
    billed = mock.truth("alpha")["prompt_tokens"]
    assert held == exact(body)
    assert billed <= held <= billed * 1.10
    assert used(base)["reserved"] == 0


def test_count_tokens_and_message_start_are_exact(base: str, mock: Mock) -> None:
    system = "Be brief."
    messages: Any = [{"role": "user", "content": PROSE * 3}]
    raw = json.dumps({"model": "exact", "system": system, "messages": messages}).encode()
    translated = parse_messages_request(raw, counting=True).body
    with claude(base) as client:
        counted = client.messages.count_tokens(model="exact", system=system, messages=messages)
        bound = client.messages.count_tokens(model="small", system=system, messages=messages)
        assert counted.input_tokens == exact(translated)
        assert counted.input_tokens * 2 < bound.input_tokens
        with client.messages.stream(
            model="exact", max_tokens=MAX_TOKENS, system=system, messages=messages,
            metadata=ALPHA,
        ) as stream:  # fmt: skip
            start = next(e for e in stream if e.type == "message_start")
            final = stream.get_final_message()
    assert start.message.usage.input_tokens == counted.input_tokens
    assert final.usage.input_tokens == mock.truth("alpha")["prompt_tokens"]
    assert counted.input_tokens >= final.usage.input_tokens  # never below the bill


def slack(tokens: int) -> int:
    return count_api._slack(tokens)


def test_count_api_answers_caches_and_falls_back_when_it_stalls(base: str, mock: Mock) -> None:
    system = "Answer in French."
    first: Any = [{"role": "user", "content": PROSE}]
    later: Any = [*first, {"role": "assistant", "content": PROSE[:200]},
             {"role": "user", "content": "And in German? " + PROSE[:300]}]  # fmt: skip
    fresh: Any = [{"role": "user", "content": PROSE[::-1]}]
    with claude(mock.url, "sk-ant-test") as upstream, claude(base) as client:
        truth = upstream.messages.count_tokens(
            model="claude-sonnet-4-5", system=system, messages=first
        ).input_tokens
        asked = client.messages.count_tokens(model="claude-counted", system=system, messages=first)
        assert asked.input_tokens == slack(truth)  # the upstream's count, with its slack
        httpx.post(
            f"{mock.url}/mock/fault", json={"mode": "hang", "seconds": 30}
        ).raise_for_status()
        try:
            cached = client.messages.count_tokens(
                model="claude-counted", system=system, messages=first
            )
            stalled = client.messages.count_tokens(
                model="claude-counted", system=system, messages=fresh
            )
            grown = client.messages.count_tokens(
                model="claude-counted", system=system, messages=later
            )
        finally:
            httpx.post(f"{mock.url}/mock/fault", json={}).raise_for_status()
    assert cached.input_tokens == asked.input_tokens  # from the cache: no call

    def body(messages: list[dict[str, Any]]) -> dict[str, Any]:
        raw = {"model": "claude-counted", "system": system, "messages": messages}
        return parse_messages_request(json.dumps(raw).encode(), counting=True).body

    # The upstream did not answer in time: the calibrated bound ...
    assert stalled.input_tokens == CalibratedCounter().count(body(fresh))
    # ... or, for a conversation whose beginning was counted, that count and the calibrated
    # bound of the messages after it, when that is less than the calibrated bound of it all.
    rest = CalibratedCounter().count({"messages": body(later)["messages"][2:]})
    whole = CalibratedCounter().count(body(later))
    assert grown.input_tokens == min(whole, slack(truth) + rest) < whole
