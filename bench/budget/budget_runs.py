"""The pieces of the overshoot experiment: modes, the config, warm-up, one batch of tenant-runs,
and the per-cell summary. :mod:`bench.budget.overshoot` puts them together.

A *tenant-run* is one tenant spending a fresh budget with ``concurrency`` streams until the
gateway answers ``budget_exceeded``. Ground truth is what the mock upstream says it generated
for that tenant (GET /mock/ground-truth), never the gateway's ledger; the ledger's view is read
separately from GET /v1/hardcap/usage. Each tenant-run also records how much of the budget the
mock had really generated when its clients met their first refusal, and the cell summary pools
the admission-queue waits of every answer.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.lib import stack
from bench.lib.machine import write_json
from tests.load.harness import chat_body, drive_tenant, percentile, usage_rows
from tests.load.http1 import Client

BUDGET = 20_000
MAX_TOKENS = 1024
WARMUP_TENANT = "warmup"
# The p95 sample is per route and tenant; a tenant with few replies of its own (every measured
# tenant, at first) gets the median of the tenants' own p95s once three have voted: so three
# warm-up tenants, each warming its own sample.
WARMUP_TENANTS = (WARMUP_TENANT, "warmup-2", "warmup-3")
WARMUP_BUDGET = 10**12
P95 = {"kind": "p95", "min_samples": 50}


@dataclass(frozen=True)
class Mode:
    """One way of enforcing a budget: a route of the generated config."""

    name: str  # the route name clients send as `model`
    label: str
    route: dict[str, Any]

    @property
    def truncates(self) -> bool:
        return bool(self.route.get("policy", "truncate") == "truncate")

    @property
    def learns_p95(self) -> bool:
        return bool(self.route.get("estimator", {}).get("kind") == "p95")


MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode("count_after", "Count after the fact", {"policy": "count_after"}),
        Mode("max_tokens", "Reserve max_tokens", {"estimator": {"kind": "max_tokens"}}),
        Mode("p95_allow", "Reserve p95, allow", {"estimator": P95, "policy": "allow"}),
        Mode("p95_truncate", "Reserve p95, truncate", {"estimator": P95, "policy": "truncate"}),
        # Not in the default set: what the seed's table suggests it measured, no shrinking at
        # admission (a request needs its whole estimate free, or it is told budget_busy).
        Mode(
            "max_tokens_whole",
            "Reserve max_tokens, never shrunk",
            {"estimator": {"kind": "max_tokens"}, "min_output_reservation": MAX_TOKENS},
        ),
        Mode(
            "p95_truncate_whole",
            "Reserve p95, truncate, never shrunk",
            {"estimator": P95, "policy": "truncate", "min_output_reservation": MAX_TOKENS},
        ),
    )
}
DEFAULT_MODES = ("count_after", "max_tokens", "p95_allow", "p95_truncate")


def tenant_ids(count: int) -> list[str]:
    return [f"t{i}" for i in range(count)]


def build_config(
    mock_url: str,
    redis_url: str,
    modes: list[Mode],
    tenants: int,
    window: str,
    gateway: dict[str, Any],
) -> dict[str, Any]:
    """Routes for ``modes``, ``tenants`` tenants with a fresh BUDGET each, and a warm-up tenant."""
    data = stack.base_config(mock_url, redis_url, **gateway)
    data["routes"] = [
        stack.mock_route(m.name, max_output_tokens=MAX_TOKENS, **m.route) for m in modes
    ]
    data["tenants"] = [stack.tenant_entry(t, BUDGET, window) for t in tenant_ids(tenants)]
    data["tenants"] += warmup_entries(window)
    return data


def warmup_entries(window: str) -> list[dict[str, Any]]:
    """Config entries of the warm-up tenants."""
    return [stack.tenant_entry(t, WARMUP_BUDGET, window) for t in WARMUP_TENANTS]


def choose_window(expected_seconds: float) -> str:
    """A fixed budget window that will not roll over during the run (windows align to epoch)."""
    now = time.time()
    for spec, length in (("7d", 7 * 86400), ("30d", 30 * 86400)):
        if (now // length + 1) * length - now > expected_seconds + 3600:
            return spec
    return "365d"


def p95_state(redis_url: str, route: str) -> dict[str, int]:
    """The route's p95 consensus (what a tenant with few replies of its own is reserved) and
    how many tenants voted for it."""
    with redis.Redis.from_url(redis_url) as r:
        raw = r.hmget(f"hc:{{est:{route}}}:consensus", "q", "t")
    return {"p95": int(float(raw[0] or 0)), "tenants": int(raw[1] or 0)}


def reset_estimator(redis_url: str, route: str) -> None:
    """Forget ``route``'s p95 samples, votes and consensus (before it is warmed again)."""
    with redis.Redis.from_url(redis_url) as r:
        doomed = [
            *r.scan_iter(match=f"hc:{{est:{route}}}:*"),
            *r.scan_iter(match=f"hc:*:est:{route}:*"),
        ]
        if doomed:
            r.delete(*doomed)


def flush_tenants(redis_url: str) -> int:
    """Delete every key but the route-wide estimator keys (hc:{est:...}: votes, consensus) and
    the warm-up tenants' samples: fresh budgets and samples for the measured tenants, warm p95."""
    keep = (b"hc:{est:", *(f"hc:{{t:{t}}}:est:".encode() for t in WARMUP_TENANTS))
    deleted = 0
    with redis.Redis.from_url(redis_url) as r:
        doomed = [k for k in r.scan_iter(count=1000) if not k.startswith(keep)]
        for i in range(0, len(doomed), 500):
            deleted += int(r.delete(*doomed[i : i + 500]))
    return deleted


async def warm_up(
    urls: list[str],
    mode: Mode,
    requests: int,
    concurrency: int = 16,
    prompts: Sequence[str] = (),
    route: str | None = None,
) -> None:
    """Fill ``mode``'s shared p95 sample with non-streamed replies at mock pace 0.

    The replies come from the same log-normal, capped at the same max_tokens, as the streamed
    ones; without streaming they cost the machine one JSON body each instead of a stream.
    ``prompts`` (taken in turn) replace the default prompt: a workload whose requests ask the
    mock for their own output lengths warms the sample with those lengths. ``route``: the
    route to warm, when it is not named after the mode.
    """
    texts = [f"{p} [mock:pace_ms=0]" for p in prompts] or ["Warm the estimator. [mock:pace_ms=0]"]
    asks = []
    for i, prompt in enumerate(texts if len(texts) > 1 else texts * len(WARMUP_TENANTS)):
        tenant = WARMUP_TENANTS[i % len(WARMUP_TENANTS)]
        body = chat_body(tenant, route or mode.name, MAX_TOKENS, prompt, False)
        headers = {
            "authorization": f"Bearer {stack.tenant_key(tenant)}",
            "content-type": "application/json",
        }
        asks.append((json.dumps(body).encode(), headers))
    clients = [Client(u, concurrency) for u in urls]
    slots = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        body, headers = asks[i % len(asks)]
        async with slots:
            status, _, raw = await clients[i % len(clients)].request(
                "POST", "/chat/completions", body, headers
            )
        if status != 200:
            raise RuntimeError(f"warm-up request failed: {status} {raw[:200]!r}")

    try:
        async with asyncio.timeout(600):
            await asyncio.gather(*(one(i) for i in range(requests)))
    finally:
        for c in clients:
            await c.aclose()


@dataclass
class Batch:
    """Tenant-runs of one cell that run at the same time."""

    mode: Mode
    concurrency: int
    runs: list[int]  # the run each tenant belongs to
    tenants: list[str]
    seeds: list[int]
    results: list[dict[str, Any]] = field(default_factory=list)
    queue_waits_ms: list[int] = field(default_factory=list)  # every answer's, pooled


def ground_truth(mock_url: str, tenants: list[str], settle_s: float = 30.0) -> dict[str, Any]:
    """The mock's per-tenant counters once nothing is in flight for ``tenants`` (bounded)."""
    deadline = time.monotonic() + settle_s
    while True:
        rows = httpx.get(f"{mock_url}/mock/ground-truth", timeout=10).json()["tenants"]
        busy = [t for t in tenants if rows.get(t, {}).get("in_flight")]
        if not busy or time.monotonic() > deadline:
            return {t: dict(rows.get(t, {}), settled=t not in busy) for t in tenants}
        time.sleep(0.05)


def drive_batch(
    batch: Batch,
    mock_url: str,
    redis_url: str,
    one: Callable[[str, int], Awaitable[Any]],
) -> tuple[list[Any], dict[str, Any]]:
    """Fresh state (ledger and mock), then every tenant of ``batch`` at once (``one(tenant,
    seed)`` drives one), then what the mock billed each: the runs and the ground truth."""
    flush_tenants(redis_url)
    httpx.post(f"{mock_url}/mock/reset", timeout=10).raise_for_status()

    async def drive() -> list[Any]:
        pairs = zip(batch.tenants, batch.seeds, strict=True)
        return await asyncio.gather(*(one(t, seed) for t, seed in pairs))

    runs = asyncio.run(drive())
    return runs, ground_truth(mock_url, batch.tenants)


def run_batch(
    batch: Batch,
    urls: list[str],
    mock_url: str,
    redis_url: str,
    time_limit_s: float,
    busy_pause_s: tuple[float, float] | None = None,
    retries: str = "sdk",
    max_retries: int = 2,
) -> None:
    """Fresh state, the batch's tenants spend their budgets at once, then read both sides.
    ``retries``: the clients' kind (:func:`tests.load.harness.drive_tenant`)."""
    runs, truth = drive_batch(
        batch,
        mock_url,
        redis_url,
        lambda t, seed: drive_tenant(
            urls,
            stack.tenant_key(t),
            t,
            concurrency=batch.concurrency,
            model=batch.mode.name,
            max_tokens=MAX_TOKENS,
            time_limit_s=time_limit_s,
            busy_pause_s=busy_pause_s,
            seed=seed,
            retries=retries,
            max_retries=max_retries,
            truth_url=mock_url,
        ),
    )
    for run, run_index in zip(runs, batch.runs, strict=True):
        rows = [
            r for r in usage_rows(urls[0], stack.tenant_key(run.tenant)) if r["id"] == run.tenant
        ]
        ledger = rows[0]
        gt = truth[run.tenant]
        total = int(gt.get("total_tokens", 0))
        batch.queue_waits_ms += run.queue_waits_ms
        batch.results.append(
            {
                "run": run_index,
                "tenant": run.tenant,
                "budget": BUDGET,
                "ground_truth": gt,
                "ledger": {"used": ledger["used"], "reserved": ledger["reserved"]},
                "client": run.as_json(),
                "overshoot_ground_truth": round(total / BUDGET - 1, 6),
                "overshoot_ledger": round(ledger["used"] / BUDGET - 1, 6),
                "usable": round(total / BUDGET, 6),
                "usable_before_first_refusal": before_first_refusal(run.first_refusal, total),
                "ledger_minus_truth": ledger["used"] - total,
            }
        )


def before_first_refusal(first: dict[str, Any] | None, total: int) -> float | None:
    """Share of the budget the mock had generated when the tenant's first refusal came; the
    whole run's when none came; None when the fetch at that moment failed."""
    if first is None:
        return round(total / BUDGET, 6)
    spent = first.get("ground_truth_tokens")
    return None if spent is None else round(spent / BUDGET, 6)


def summarize(
    results: list[dict[str, Any]], queue_waits_ms: list[int] | None = None
) -> dict[str, Any]:
    """Per-cell aggregates over tenant-runs (every number is per tenant-run or per tenant);
    queue-wait percentiles over ``queue_waits_ms``, every answer of the cell (None: none)."""
    over = [r["overshoot_ground_truth"] for r in results]
    ledger = [r["overshoot_ledger"] for r in results]
    usable = [r["usable"] for r in results]
    client = [r["client"] for r in results]
    gt = [r["ground_truth"] for r in results]
    seconds = [c["seconds"] for c in client]
    tokens = [int(g.get("total_tokens", 0)) for g in gt]

    def mean(xs: list[float]) -> float:
        return round(statistics.fmean(xs), 6) if xs else 0.0

    before = [
        r["usable_before_first_refusal"]
        for r in results
        if r.get("usable_before_first_refusal") is not None
    ]
    waits = queue_waits_ms or []

    return {
        "tenant_runs": len(results),
        "worst_overshoot_ground_truth": max(over, default=0.0),
        "mean_overshoot_ground_truth": mean(over),
        "worst_overshoot_ledger": max(ledger, default=0.0),
        "mean_overshoot_ledger": mean(ledger),
        "worst_tokens_over_ground_truth": max(
            t - r["budget"] for t, r in zip(tokens, results, strict=True)
        ),
        "usable_mean": mean(usable),
        "usable_min": min(usable, default=0.0),
        "busy_per_tenant": mean([c["busy"] for c in client]),
        "truncated_per_tenant": mean([int(g.get("aborted", 0)) for g in gt]),
        "usable_before_refusal_mean": mean(before) if before else None,
        "usable_before_refusal_min": min(before) if before else None,
        # How late the ground truth was read after the refusal (tokens kept flowing meanwhile).
        "first_refusal_fetch_s_max": max(
            (c["first_refusal"].get("fetch_s", 0.0) for c in client if c.get("first_refusal")),
            default=None,
        ),
        "queue_wait_p50_ms": percentile(waits, 0.5),
        "queue_wait_p99_ms": percentile(waits, 0.99),
        "queue_wait_max_ms": max(waits, default=None),
        "queue_waited_share": round(sum(w > 0 for w in waits) / len(waits), 6) if waits else None,
        "failed_per_tenant": mean([c.get("failed", 0) for c in client]),
        "retries_per_tenant": mean([c.get("retries", 0) for c in client]),
        "rate_limited_per_tenant": mean([c.get("rate_limited", 0) for c in client]),
        "overloaded_per_tenant": mean([c.get("overloaded", 0) for c in client]),
        "truncated_client_per_tenant": mean([c["truncated"] for c in client]),
        "capped_per_tenant": mean([c["capped"] for c in client]),
        "requests_per_tenant": mean([int(g.get("requests", 0)) for g in gt]),
        "reserved_left_max": max(r["ledger"]["reserved"] for r in results),
        "ledger_minus_truth_mean": mean([r["ledger_minus_truth"] for r in results]),
        "errors": sum(c["errors"] for c in client),
        "unsettled_ground_truth": sum(not g.get("settled", True) for g in gt),
        "exceeded_reached": sum(c["exceeded"] > 0 for c in client),
        "seconds_mean": mean(seconds),
        "tokens_per_second_mean": mean(
            [t / s for t, s in zip(tokens, seconds, strict=True) if s > 0]
        ),
    }


def check_cells(cells: list[dict[str, Any]], max_overshoot: float) -> dict[str, Any]:
    """The gate of both overshoot benchmarks: no truncating cell over its budget by more than
    ``max_overshoot`` (ground truth), no reservation left anywhere once traffic stopped."""
    worst = max(
        (c["summary"]["worst_overshoot_ground_truth"] for c in cells if c["truncates"]),
        default=0.0,
    )
    left = max((c["summary"]["reserved_left_max"] for c in cells), default=0)
    return {
        "max_allowed_overshoot": max_overshoot,
        "worst_truncate_overshoot_ground_truth": worst,
        "reserved_left_max": left,
        "client_errors": sum(c["summary"]["errors"] for c in cells),
        "passed": worst <= max_overshoot and left == 0,
    }


def finish(
    result: dict[str, Any],
    out: Path,
    started: float,
    check: Callable[[list[dict[str, Any]]], dict[str, Any]],
    summary: Callable[[dict[str, Any], Path], None],
    strict: bool,
) -> int:
    """Mark a run complete, gate it, write and print it; 1 if ``strict`` and the gate failed."""
    result["complete"] = True
    result["seconds"] = round(time.monotonic() - started, 1)
    result["check"] = check(result["cells"])
    write_json(out, result)
    summary(result, out)
    if strict and not result["check"]["passed"]:
        print(f"CHECK FAILED: {result['check']}", file=sys.stderr)
        return 1
    return 0
