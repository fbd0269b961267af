"""Anthropic's web search through the gateway, sent by the official `anthropic` SDK to an
Anthropic upstream (the mock's Anthropic mode, which searches and bills like Anthropic), on
real Valkey: a route that prices it holds max_uses searches at its price and charges the
searches the provider reports; a route that does not refuses it naming the tool, costing
nothing; a budget that cannot cover the searches refuses at admission; a provider that
reports more searches than it was allowed is charged the bound."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import anthropic
import httpx
import pytest
import redis

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from tests.stack import (
    ANTHROPIC_KEY_ENV,
    KEYS,
    Mock,
    anthropic_client,
    anthropic_config,
    gateway_thread,
    mock_fixture,
)

PRICE = {"input_per_million": 3.0, "output_per_million": 15.0}
NUSD = {"input": 3_000, "output": 15_000, "search": 10_000_000}  # a token; a search ($10/1,000)
RESULT_TOKENS = 100  # the input the route holds per use
SEARCH = {"type": "web_search_20250305", "name": "web_search"}


mock = mock_fixture(MockSettings(pace_ms=0.2, seed=37))


@contextmanager
def stack(
    valkey: LocalValkey, mock: Mock, usd_limit: float = 100.0
) -> Iterator[tuple[str, anthropic.Anthropic]]:
    """The gateway with `searching` (web search priced, web fetch allowed at no fee) and
    `claude` (no tool prices) on one Anthropic upstream; tenant alpha has a USD budget."""
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    data = anthropic_config(mock, valkey)
    priced = {**PRICE, "web_search_per_1000": 10.0, "web_fetch_per_1000": 0}
    data["routes"] += [
        {"name": "searching", "upstream": "claude", "model": "mock-small", "price": priced,
         "max_output_tokens": 1024, "server_tool_input_tokens": RESULT_TOKENS},
        {"name": "claude", "upstream": "claude", "model": "mock-small", "price": PRICE,
         "max_output_tokens": 1024},
    ]  # fmt: skip
    data["tenants"][0]["budgets"].append(
        {"dimension": "cost_usd", "limit": usd_limit, "window": "day"}
    )
    with gateway_thread(data) as base:
        yield base, anthropic_client(base)


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ANTHROPIC_KEY_ENV, "sk-ant-test")


def cost_used(base: str) -> tuple[int, int]:
    """The tenant's USD budget: (used, reserved), nano-USD."""
    r = httpx.get(f"{base}/hardcap/usage", headers={"x-api-key": KEYS["alpha"]})
    rows = {(b["level"], b["dimension"]): b for b in r.json()["budgets"]}
    row = rows[("tenant", "cost_usd")]
    return row["used"], row["reserved"]


def ask(text: str, **tool: Any) -> dict[str, Any]:
    return {
        "model": "searching",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": text}],
        "metadata": {"user_id": "alpha"},
        "tools": [{**SEARCH, **tool}],
    }


def token_cost(usage: Any) -> int:
    return usage.input_tokens * NUSD["input"] + usage.output_tokens * NUSD["output"]


def test_a_priced_search_is_bounded_upstream_and_charged_per_search(
    valkey: LocalValkey, mock: Mock
) -> None:
    """No max_uses: the provider is sent the route's default (5), and the two searches it
    ran are charged at the route's price beside the tokens (their results as input)."""
    with stack(valkey, mock) as (base, sdk):
        with sdk.messages.stream(**ask("news? [mock:web_search=2] [mock:tokens=6]")) as stream:
            kinds = [e.content_block.type for e in stream if e.type == "content_block_start"]
            final = stream.get_final_message()
        assert kinds.count("server_tool_use") == kinds.count("web_search_tool_result") == 2
        assert final.usage.server_tool_use is not None
        assert final.usage.server_tool_use.web_search_requests == 2
        sent = mock.received()[-1]
        assert sent["body"]["tools"] == [{**SEARCH, "max_uses": 5}]
        truth = mock.truth("alpha")
        assert final.usage.input_tokens == truth["prompt_tokens"]  # the results' input too
        used, reserved = cost_used(base)
        assert used == token_cost(final.usage) + 2 * NUSD["search"]
        assert reserved == 0


def test_a_whole_reply_is_charged_its_searches_too(valkey: LocalValkey, mock: Mock) -> None:
    with stack(valkey, mock) as (base, sdk):
        raw = sdk.messages.with_raw_response.create(
            **ask("news? [mock:web_search=3] [mock:tokens=4]", max_uses=3)
        )
        message = raw.parse()
        assert message.usage.server_tool_use is not None
        assert message.usage.server_tool_use.web_search_requests == 3
        want = token_cost(message.usage) + 3 * NUSD["search"]
        assert Decimal(raw.headers["x-hardcap-cost-usd"]) * 10**9 == want
        assert cost_used(base) == (want, 0)


def test_a_route_without_the_price_refuses_the_tool_and_costs_nothing(
    valkey: LocalValkey, mock: Mock
) -> None:
    with stack(valkey, mock) as (base, sdk):
        before = len(mock.received())
        with pytest.raises(anthropic.BadRequestError) as caught:
            sdk.messages.create(**{**ask("news?"), "model": "claude"})
        assert "tools[0].type" in caught.value.message
        assert "web_search_20250305" in caught.value.message
        assert len(mock.received()) == before  # no upstream was asked
        assert cost_used(base) == (0, 0)


def test_a_budget_that_cannot_hold_the_searches_refuses_at_admission(
    valkey: LocalValkey, mock: Mock
) -> None:
    """$0.03 left: five searches ($0.05) cannot be held, however few tokens the request
    has; one search can."""
    with stack(valkey, mock, usd_limit=0.03) as (base, sdk):
        before = len(mock.received())
        with pytest.raises(anthropic.APIStatusError) as caught:
            sdk.messages.create(**ask("news? [mock:tokens=3]", max_uses=5))
        assert caught.value.status_code == 429
        assert len(mock.received()) == before
        assert cost_used(base) == (0, 0)
        message = sdk.messages.create(**ask("news? [mock:tokens=3]", max_uses=1))
        assert message.usage.server_tool_use is not None
        assert message.usage.server_tool_use.web_search_requests == 1
        assert cost_used(base) == (token_cost(message.usage) + NUSD["search"], 0)


def test_an_upstream_reporting_more_searches_than_allowed_is_charged_the_bound(
    valkey: LocalValkey, mock: Mock, caplog: pytest.LogCaptureFixture
) -> None:
    with stack(valkey, mock) as (base, sdk):
        with sdk.messages.stream(
            **ask("news? [mock:web_search=2] [mock:overreport=5] [mock:tokens=4]", max_uses=2)
        ) as stream:
            final = stream.get_final_message()
        assert final.usage.server_tool_use is not None
        assert final.usage.server_tool_use.web_search_requests == 7  # what it claims
        used, _ = cost_used(base)
        assert used == token_cost(final.usage) + 2 * NUSD["search"]
        assert any("more server-tool uses" in r.getMessage() for r in caplog.records)


def test_a_web_fetch_is_sent_its_bounds(valkey: LocalValkey, mock: Mock) -> None:
    """Web fetch has no fee (0 opts in), but what it fetches is input: the provider is sent
    the route's bound on uses and on the tokens each fetch may add."""
    fetch = {"type": "web_fetch_20250910", "name": "web_fetch"}
    with stack(valkey, mock) as (_, sdk):
        body = {**ask("read it [mock:tokens=3]"), "tools": [fetch]}
        sdk.beta.messages.create(**body, betas=["web-fetch-2025-09-10"])
        sent = mock.received()[-1]
        assert sent["body"]["tools"] == [
            {**fetch, "max_uses": 5, "max_content_tokens": RESULT_TOKENS}
        ]


def test_count_tokens_takes_the_server_tools_and_betas_claude_code_sends(
    valkey: LocalValkey, mock: Mock
) -> None:
    """count_tokens with Claude Code's betas (sent as the anthropic-beta header), a web search
    tool and context_management: counted, the tool's definition with the rest."""
    betas = ["claude-code-20250219", "context-management-2025-06-27"]
    edits = {"edits": [{"type": "clear_tool_uses_20250919"}]}
    with stack(valkey, mock) as (base, sdk):
        plain = {"model": "searching", "messages": [{"role": "user", "content": "news?"}]}
        without = sdk.beta.messages.count_tokens(**plain, betas=betas)
        counted = sdk.beta.messages.count_tokens(
            **plain, tools=[SEARCH], context_management=edits, betas=betas
        )
        assert counted.input_tokens > without.input_tokens > 0
        assert cost_used(base) == (0, 0)


def test_search_results_stream_as_input_not_output(valkey: LocalValkey, mock: Mock) -> None:
    """Each search streams kilobytes of encrypted results, billed as input of the next turn:
    a reply of 5 tokens completes on a budget ($0.07) whose hold could not grow by the
    thousands of tokens the results would count as output, which would cut it."""
    with stack(valkey, mock, usd_limit=0.07) as (base, sdk):
        body = {**ask("news? [mock:web_search=2] [mock:search_tokens=3000] [mock:tokens=5]")}
        body["max_tokens"] = 40
        with sdk.messages.stream(**body) as stream:
            final = stream.get_final_message()
        assert final.stop_reason == "end_turn"
        assert final.usage.output_tokens == 5 + 2  # the reply and the two queries
        used, _ = cost_used(base)
        assert used == token_cost(final.usage) + 2 * NUSD["search"]
