"""The realistic workloads of the overshoot benchmark (bench/budget/prompts.py): sizes as the mock
bills them, what they ask of the mock, determinism; and the goals the report reads from a run."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from bench.budget import prompts
from bench.budget.realistic_runs import Prices, Workload, before_first_refusal
from bench.lib.report_realistic import realistic_tables
from hardcap_core.local.mock_billing import prompt_tokens
from hardcap_core.local.mock_plan import ChatRequest, make_plan

POOL = 24


@pytest.fixture(scope="module")
def pools() -> dict[str, list[prompts.Request]]:
    return {w: prompts.pool(w, POOL, seed=3) for w in prompts.WORKLOADS}


@pytest.mark.parametrize("workload", ["chat", "rag"])
def test_prompts_fall_in_their_workloads_range_of_billed_tokens(
    pools: dict[str, list[prompts.Request]], workload: str
) -> None:
    low, high = prompts.PROMPT_RANGES[workload]
    sizes = [r.prompt_tokens for r in pools[workload]]
    assert all(low <= s <= high for s in sizes), sizes
    # Spread over the range, not bunched at one end: log-uniform targets.
    assert min(sizes) < low * 2 and max(sizes) > high / 2
    # The recorded size is the mock's bill of the very body sent.
    assert all(r.prompt_tokens == prompt_tokens(r.body) for r in pools[workload])


def test_chat_is_a_multi_turn_conversation_ending_with_the_users_question(
    pools: dict[str, list[prompts.Request]],
) -> None:
    for r in pools["chat"]:
        roles = [m["role"] for m in r.body["messages"]]
        assert roles[0] == "system" and roles[-1] == "user"
        assert roles.count("assistant") >= 1


def test_agent_steps_carry_5_to_20_tool_schemas_and_a_history_of_calls(
    pools: dict[str, list[prompts.Request]],
) -> None:
    steps = pools["agent"]
    assert all(5 <= len(r.body["tools"]) <= 20 for r in steps)
    for r in steps:
        for tool in r.body["tools"]:
            params = tool["function"]["parameters"]
            assert params["type"] == "object" and set(params["required"]) <= set(
                params["properties"]
            )
    assert any(m["role"] == "tool" for r in steps for m in r.body["messages"])
    assert 0 < sum(r.tool_call for r in steps) < len(steps)  # most steps call, some answer


@pytest.mark.parametrize("workload", prompts.WORKLOADS)
def test_the_mock_answers_with_the_asked_length_and_kind(
    pools: dict[str, list[prompts.Request]], workload: str
) -> None:
    import random

    for r in pools[workload][:8]:
        body = {"model": "m", **r.body}
        plan = make_plan(
            ChatRequest.model_validate(body),
            random.Random(0),
            median_tokens=150,
            sigma=1.0,
            reasoning_tokens=0,
            pace_ms=0,
        )
        assert plan.completion_tokens == r.output_tokens <= prompts.MAX_TOKENS
        assert plan.prompt_tokens == r.prompt_tokens
        assert (plan.tool_name is not None) == r.tool_call


def test_text_tokenizes_like_english_prose_not_like_lorem_ipsum() -> None:
    import random

    from hardcap_core.local.mock_billing import text_tokens

    text = " ".join(prompts.paragraph(random.Random(i), 6) for i in range(40))
    chars_per_token = len(text) / text_tokens(text)
    assert 4.0 < chars_per_token < 5.5  # English prose in cl100k_base: about 4 to 5
    assert len(set(re.findall(r"[a-z]+", text))) > 300


def test_the_same_seed_gives_the_same_requests() -> None:
    one, two = prompts.pool("agent", 3, seed=9), prompts.pool("agent", 3, seed=9)
    assert [json.dumps(r.body) for r in one] == [json.dumps(r.body) for r in two]
    assert json.dumps(prompts.pool("agent", 1, seed=10)[0].body) != json.dumps(one[0].body)


def test_a_cost_budget_prices_input_and_output_in_nano_usd() -> None:
    prices = Prices(2.5, 10.0)
    assert (prices.input_nusd, prices.output_nusd) == (2_500, 10_000)
    requests = prompts.pool("chat", 4, seed=1)
    w = Workload.build("chat", requests, prices, requests_per_budget=50)
    mean = sum(prices.cost(r.prompt_tokens, r.output_tokens) for r in requests) / 4
    assert abs(w.budgets["cost_usd"] - 50 * mean) <= 500_000  # rounded to a tenth of a cent
    first = {"prompt_tokens": 1_000, "completion_tokens": 100}
    spent = before_first_refusal(first, "cost_usd", prices, 0, 7_000_000)
    assert spent == round((2_500_000 + 1_000_000) / 7_000_000, 6)
    assert before_first_refusal(first, "total_tokens", prices, 0, 2_200) == 0.5


def _cell(tokenizer: str, streams: int, worst: float, usable: float, before: float) -> Any:
    return {
        "workload": "rag",
        "dimension": "cost_usd",
        "mode": "p95_truncate",
        "label": "Reserve p95, truncate",
        "tokenizer": tokenizer,
        "concurrency": streams,
        "summary": {
            "worst_overshoot_ground_truth": worst,
            "usable_mean": usable,
            "usable_before_refusal_mean": before,
            "usable_before_refusal_min": before - 0.01,
            "busy_per_tenant": 12.0,
            "failed_per_tenant": 1.0,
            "queue_wait_p50_ms": 10.0,
            "queue_wait_p99_ms": 5000.0,
            "tenant_runs": 3,
            "reserved_left_max": 0,
            "errors": 0,
        },
    }


def test_the_report_puts_tokenizers_side_by_side_with_goals_met_or_missed() -> None:
    workload = {
        "prompt_tokens": {"min": 2000, "p50": 5000, "mean": 6400.0, "max": 15000},
        "output_tokens_asked": {"mean": 300.0},
        "tool_schemas": None,
        "bound_over_billed_input": {"mean": 3.3},
        "cost_usd_budget_usd": 1.5,
        "budgets": {"cost_usd": 1_500_000_000, "total_tokens": 500_000},
    }
    data = {
        "complete": True,
        "seconds": 600,
        "machine": {"git_commit": "abc", "load_average": [2.0, 2.0, 2.0]},
        "parameters": {
            "gateway_processes": 3,
            "client_max_retries": 2,
            "queue_wait_seconds": 5.0,
            "mock_pace_ms": 10.0,
            "prices_usd_per_million": {"input": 2.5, "output": 10.0},
            "requests_per_budget": 80,
            "workloads": {"rag": workload},
        },
        "cells": [
            _cell("bound", 128, -0.02, 0.97, 0.45),
            _cell("bound", 8, -0.01, 0.975, 0.9),
            _cell("cl100k_base", 128, 0.001, 0.995, 0.96),
            _cell("cl100k_base", 8, -0.001, 0.996, 0.99),
        ],
    }
    text = realistic_tables(data, "`r.json`")
    assert "| Workload, budget | Goal | `bound` | `cl100k_base` |" in text
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| rag, ")}
    assert rows["Never over: ground truth <= budget, every level"].endswith(
        "| never over (-1.00%) met | **+0.10%** **missed** |"
    )
    assert rows["Usable >= 99%, lowest cell mean"].endswith(
        "| 97.0% (128 streams) **missed** | 99.5% (128 streams) met |"
    )
    assert (
        "| 45.0% / 44.0% **missed** | 96.0% / 95.0% met |"
        in rows["Spent before the first refusal >= 95%, 128 streams (mean / worst)"]
    )
    assert rows["budget_busy per tenant, by streams"].endswith(
        "| 12 / 12 (8 / 128) | 12 / 12 (8 / 128) |"
    )
