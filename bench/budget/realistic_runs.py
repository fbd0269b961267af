"""The pieces of the realistic overshoot benchmark (:mod:`bench.budget.overshoot_realistic`): the
workloads with their budgets, the routes (a mode with a tokenizer, priced), the config, and one
batch of tenant-runs measured in the budget's own unit.

A cost budget is in nano-USD, as the ledger keeps it; the ground truth of a tenant's spend is
the mock's prompt and completion tokens at the route's prices, so "never over" compares what
the provider would really bill with the limit. A token budget is the mock's total tokens.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bench.budget.budget_runs import Batch, Mode, drive_batch, warmup_entries
from bench.budget.prompts import MAX_TOKENS, Request
from bench.lib import stack
from bench.lib.workload_clients import drive_workload, payloads
from hardcap_core.budgets import NANO_USD_PER_USD
from hardcap_core.config.schema import RouteConfig
from hardcap_core.wire.openai_input import input_tokens
from tests.load.harness import usage_rows

DIMENSIONS = ("cost_usd", "total_tokens")
SHORT = {"cost_usd": "usd", "total_tokens": "tok"}
# Whether this tree's routes take a `tokenizer:` (the input count admission reserves); until
# they do, only today's upper bound can be measured.
TOKENIZER_FIELD = "tokenizer" in RouteConfig.model_fields
BOUND = "bound"


@dataclass(frozen=True)
class Prices:
    """A route's prices, USD per million tokens, and in nano-USD per token as the ledger
    charges them (2.5 USD per million = 2,500 nano-USD a token)."""

    input_per_million: float
    output_per_million: float

    @property
    def input_nusd(self) -> int:
        return round(self.input_per_million * NANO_USD_PER_USD / 1_000_000)

    @property
    def output_nusd(self) -> int:
        return round(self.output_per_million * NANO_USD_PER_USD / 1_000_000)

    def cost(self, prompt: int, completion: int) -> int:
        """nano-USD of ``prompt`` and ``completion`` tokens."""
        return prompt * self.input_nusd + completion * self.output_nusd


@dataclass(frozen=True)
class Workload:
    """A workload's request pool (serialized once) and each budget dimension's limit, sized so
    that a tenant's budget pays for ``requests_per_budget`` of its mean request."""

    name: str
    requests: list[Request]
    payloads: list[bytes]
    budgets: dict[str, int]  # dimension -> limit, in the ledger's unit (nano-USD or tokens)

    @classmethod
    def build(
        cls, name: str, requests: list[Request], prices: Prices, requests_per_budget: int
    ) -> Workload:
        cost = statistics.fmean(prices.cost(r.prompt_tokens, r.output_tokens) for r in requests)
        tokens = statistics.fmean(r.prompt_tokens + r.output_tokens for r in requests)
        # Round limits: a cost to a tenth of a cent, tokens to a thousand.
        usd_tenth_cents = max(1, round(cost * requests_per_budget / (NANO_USD_PER_USD / 1000)))
        budgets = {
            "cost_usd": usd_tenth_cents * NANO_USD_PER_USD // 1000,
            "total_tokens": max(1000, int(round(tokens * requests_per_budget, -3))),
        }
        return cls(name, requests, payloads([r.body for r in requests]), budgets)

    def stats(self, prices: Prices) -> dict[str, Any]:
        """What the pool's requests are like: sizes, tools, and what the bound reserves."""
        prompt = [r.prompt_tokens for r in self.requests]
        output = [r.output_tokens for r in self.requests]
        bound = [input_tokens(r.body) / r.prompt_tokens for r in self.requests]
        tools = [len(r.body.get("tools", ())) for r in self.requests]
        return {
            "requests_in_pool": len(self.requests),
            "prompt_tokens": _spread(prompt),
            "output_tokens_asked": _spread(output),
            "tool_call_share": round(sum(r.tool_call for r in self.requests) / len(prompt), 4),
            "tool_schemas": _spread(tools) if any(tools) else None,
            "bound_over_billed_input": {
                "mean": round(statistics.fmean(bound), 3),
                "min": round(min(bound), 3),
                "max": round(max(bound), 3),
            },
            "mean_request_nano_usd": round(
                statistics.fmean(
                    prices.cost(r.prompt_tokens, r.output_tokens) for r in self.requests
                )
            ),
            "budgets": self.budgets,
            "cost_usd_budget_usd": self.budgets["cost_usd"] / NANO_USD_PER_USD,
        }

    def warm_prompts(self) -> list[str]:
        """Short prompts asking for the pool's output lengths, to warm a p95 sample."""
        return [f"Warm the estimator. [mock:tokens={r.output_tokens}]" for r in self.requests]


def _spread(xs: list[int]) -> dict[str, float]:
    ordered = sorted(xs)
    return {
        "min": ordered[0],
        "p50": ordered[len(ordered) // 2],
        "mean": round(statistics.fmean(ordered), 1),
        "max": ordered[-1],
    }


@dataclass(frozen=True)
class Arm:
    """A route of the run: an enforcement mode with the tokenizer its admission counts input
    with, ``NAME`` or ``NAME:EXACT_COUNT`` (``cl100k_base:always``: the route's exact_count)."""

    mode: Mode
    tokenizer: str

    @property
    def route(self) -> str:
        return f"{self.mode.name}.{self.tokenizer}"

    def entry(self, prices: Prices) -> dict[str, Any]:
        fields: dict[str, Any] = {
            **self.mode.route,
            "max_output_tokens": MAX_TOKENS,
            "price": {
                "input_per_million": prices.input_per_million,
                "output_per_million": prices.output_per_million,
            },
        }
        name, _, exact = self.tokenizer.partition(":")
        if TOKENIZER_FIELD:
            fields["tokenizer"] = name
        elif name != BOUND:
            raise ValueError(f"tokenizer {name!r}: this tree's routes have no tokenizer field yet")
        if exact:
            if "exact_count" not in RouteConfig.model_fields:
                raise ValueError(f"{self.tokenizer!r}: this tree's routes have no exact_count")
            fields["exact_count"] = exact
        return stack.mock_route(self.route, **fields)


def tenant_ids(workload: str, dimension: str, count: int) -> list[str]:
    return [f"{workload}-{SHORT[dimension]}-t{i}" for i in range(count)]


def tenant_entry(tenant: str, dimension: str, limit: int, window: str) -> dict[str, Any]:
    """A config tenant with one budget, ``limit`` in the ledger's unit."""
    entry = stack.tenant_entry(tenant, 1, window)
    value: float | int = limit / NANO_USD_PER_USD if dimension == "cost_usd" else limit
    entry["budgets"] = [{"dimension": dimension, "limit": value, "window": window}]
    return entry


def build_config(
    mock_url: str,
    redis_url: str,
    arms: list[Arm],
    workloads: list[Workload],
    dimensions: list[str],
    tenants: int,
    window: str,
    prices: Prices,
    gateway: dict[str, Any],
) -> dict[str, Any]:
    """The arms' routes, ``tenants`` tenants per workload and dimension, the warm-up tenants."""
    data = stack.base_config(mock_url, redis_url, **gateway)
    data["routes"] = [a.entry(prices) for a in arms]
    data["tenants"] = [
        tenant_entry(t, d, w.budgets[d], window)
        for w in workloads
        for d in dimensions
        for t in tenant_ids(w.name, d, tenants)
    ]
    data["tenants"] += warmup_entries(window)
    return data


def spent(dimension: str, prices: Prices, prompt: int, completion: int) -> int:
    """What ``prompt`` and ``completion`` tokens spend of a budget of ``dimension``."""
    return prices.cost(prompt, completion) if dimension == "cost_usd" else prompt + completion


def run_batch(
    batch: Batch,
    arm: Arm,
    workload: Workload,
    dimension: str,
    prices: Prices,
    urls: list[str],
    mock_url: str,
    redis_url: str,
    time_limit_s: float,
    max_retries: int,
) -> None:
    """Fresh state, the batch's tenants spend their budgets at once, then read both sides."""
    budget = workload.budgets[dimension]
    pool = workload.payloads
    runs, truth = drive_batch(
        batch,
        mock_url,
        redis_url,
        lambda t, seed: drive_workload(
            urls,
            stack.tenant_key(t),
            t,
            concurrency=batch.concurrency,
            model=arm.route,
            pool=pool,
            start=(seed * 7919) % len(pool),
            time_limit_s=time_limit_s,
            seed=seed,
            truth_url=mock_url,
            max_retries=max_retries,
        ),
    )
    for run, run_index in zip(runs, batch.runs, strict=True):
        rows = [
            r
            for r in usage_rows(urls[0], stack.tenant_key(run.tenant))
            if r["id"] == run.tenant and r["dimension"] == dimension
        ]
        gt = truth[run.tenant]
        total = spent(
            dimension, prices, int(gt.get("prompt_tokens", 0)), int(gt.get("completion_tokens", 0))
        )
        batch.queue_waits_ms += run.queue_waits_ms
        batch.results.append(
            {
                "run": run_index,
                "tenant": run.tenant,
                "budget": budget,
                "spent": total,
                "ground_truth": gt,
                "ledger": {"used": rows[0]["used"], "reserved": rows[0]["reserved"]},
                "client": run.as_json(),
                "overshoot_ground_truth": round(total / budget - 1, 6),
                "overshoot_ledger": round(rows[0]["used"] / budget - 1, 6),
                "usable": round(total / budget, 6),
                "usable_before_first_refusal": before_first_refusal(
                    run.first_refusal, dimension, prices, total, budget
                ),
                "ledger_minus_truth": rows[0]["used"] - total,
            }
        )


def before_first_refusal(
    first: dict[str, Any] | None, dimension: str, prices: Prices, total: int, budget: int
) -> float | None:
    """Share of the budget the mock had billed when the tenant's first refusal came; the
    whole run's when none came; None when the fetch at that moment failed."""
    if first is None:
        return round(total / budget, 6)
    if "prompt_tokens" not in first:
        return None
    return round(
        spent(dimension, prices, first["prompt_tokens"], first["completion_tokens"]) / budget, 6
    )
