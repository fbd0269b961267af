"""The overshoot benchmark with the prompt sizes of real traffic, priced, per input tokenizer.

:mod:`bench.budget.overshoot` sends prompts of a few words, where how admission counts input does
not
matter. Here tenants spend their budgets with requests from :mod:`bench.budget.prompts`: multi-turn
chat (500-4,000 prompt tokens), RAG (2,000-16,000) and agent steps (5-20 tool schemas and a
short history), each asking the mock upstream for an output length drawn from the workload's
own distribution. Routes are priced (``--prices`` in USD per million input and output tokens,
gpt-4o's by default); each workload runs against a ``cost_usd`` budget, priced input and
output, and a ``total_tokens`` budget, each sized to pay for ``--requests-per-budget`` of the
workload's mean request. Cells are workload x budget x mode x tokenizer x streams per tenant,
through ``--gateways`` ``hardcap serve`` processes sharing one Valkey, the SDK-like client
(max_retries 2) and the gateway's default queue wait (5 s).

``--tokenizer`` lists how the routes count input before admission: ``bound`` (today's upper
bound by character class, about 3x English) or a tokenizer name (``cl100k_base``, ...) once the
route's ``tokenizer:`` field exists. The report puts them side by side with the goals: never
over (ground truth <= budget), >= 99 % of the budget usable, >= 95 % spent before the first
refusal at 128 streams, and budget_busy per tenant stated.

Per batch: every Valkey key but the p95 estimators' is deleted and the mock's ground truth
reset; a p95 route's sample is emptied and warmed with ``--warmup`` replies of the workload's
output lengths before each of its cells. The machine's load average is recorded before the run,
per cell and at the end.

    python -m bench overshoot_realistic --quick --check   # ~2 min
    python -m bench overshoot_realistic   # bound alone: ~12 min
    python -m bench overshoot_realistic --tokenizer bound,cl100k_base

Durations on 2 cores shared with other work (load average 3-4): the full run with ``bound``
alone took 707 s (15 cells); the quick run 163 s with two tokenizers (7 cells). With two
tokenizers the full run has 24 cells, about 20 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

from bench.budget import prompts
from bench.budget.budget_runs import (
    MODES,
    Batch,
    check_cells,
    choose_window,
    finish,
    p95_state,
    reset_estimator,
    summarize,
    warm_up,
)
from bench.budget.overshoot_cells import Target, measure_batches
from bench.budget.realistic_runs import (
    BOUND,
    DIMENSIONS,
    TOKENIZER_FIELD,
    Arm,
    Prices,
    Workload,
    build_config,
    run_batch,
    tenant_ids,
)
from bench.lib import stack
from bench.lib.machine import CpuWatch, machine_info, pids_of, write_json
from bench.lib.stack import LogWatch
from hardcap_core.config.schema import GatewayConfig
from hardcap_core.local.valkey import LocalValkey

RESULTS = Path(__file__).resolve().parents[1] / "results"
HEAD_MODE = "p95_truncate"
# Quick: each workload once, at the top and the bottom concurrency, on a cost budget.
QUICK_CELLS = (
    ("rag", "cost_usd", HEAD_MODE, 128),
    ("chat", "cost_usd", HEAD_MODE, 32),
    ("agent", "cost_usd", HEAD_MODE, 8),
    ("rag", "cost_usd", "count_after", 32),
)
CHECK_MAX_OVERSHOOT = 0.0  # never over: what the provider billed is at most the budget


@dataclasses.dataclass(frozen=True)
class Cell:
    workload: str
    dimension: str
    arm: Arm
    concurrency: int


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 cells, 2 tenants, smaller budgets")
    p.add_argument("--check", action="store_true", help="exit 1 if a truncating cell went over")
    p.add_argument("--out", type=Path, help="default bench/results/overshoot-realistic.json")
    p.add_argument("--workloads", default=",".join(prompts.WORKLOADS))
    p.add_argument("--budgets", default=",".join(DIMENSIONS), help="budget dimensions")
    p.add_argument("--modes", default=HEAD_MODE, help=f"measured modes, of {', '.join(MODES)}")
    p.add_argument("--baseline", default="count_after", help="a mode measured at --baseline-at")
    p.add_argument("--baseline-at", default="128", help="its streams per tenant ('all': each)")
    p.add_argument(
        "--token-budget-at",
        default="128",
        help="streams per tenant at which the token budgets run too ('all': each level)",
    )
    p.add_argument(
        "--tokenizer",
        default="bound",
        help="how routes count input before admission, comma-separated: bound, cl100k_base, "
        "... (NAME:EXACT_COUNT sets the route's exact_count too, e.g. cl100k_base:always)",
    )
    p.add_argument("--concurrency", default="128,32,8", help="streams per tenant")
    p.add_argument("--tenants", type=int, default=3, help="tenant-runs per cell")
    p.add_argument(
        "--requests-per-budget", type=int, default=80, help="mean requests a budget pays"
    )
    p.add_argument("--pool", type=int, default=240, help="generated requests per workload")
    p.add_argument("--prices", default="2.5,10", help="USD per million input, output tokens")
    p.add_argument("--pace-ms", type=float, default=10.0, help="mock ms per token (10 = 100/s)")
    p.add_argument("--mock-nice", type=int, default=-10, help="mock CPU priority")
    p.add_argument("--gateways", type=int, default=3, help="gateway processes")
    p.add_argument("--max-streams", type=int, default=256, help="streams of tenants together")
    p.add_argument("--warmup", type=int, default=300, help="replies that warm each p95 route")
    p.add_argument("--time-limit", type=float, default=300.0, help="s per tenant-run, at most")
    p.add_argument("--max-retries", type=int, default=2, help="the SDK-like client's max_retries")
    p.add_argument(
        "--contended-retries",
        type=int,
        default=0,
        help="reruns of a batch while other processes took over a quarter of the machine "
        "(0: on a shared machine every batch would run twice; each records how contended it was)",
    )
    p.add_argument("--seed", type=int, default=7, help="prompt, mock and client seeds")
    ns = p.parse_args(argv)
    if ns.quick:
        ns.tenants, ns.warmup, ns.requests_per_budget, ns.pool = 2, 150, 30, 60
    tokenizers = ns.tokenizer.split(",")
    if not TOKENIZER_FIELD and tokenizers != [BOUND]:
        p.error("this tree's routes have no tokenizer field yet: only --tokenizer bound")
    return ns


def plan_cells(ns: argparse.Namespace) -> list[Cell]:
    """Cells in the order they run: highest concurrency first, then workload, budget, arm.

    The measured modes run with every tokenizer on the cost budget at every level, and on the
    token budget at --token-budget-at; the baseline with the first tokenizer, on the cost
    budget, at --baseline-at.
    """
    tokenizers = [t for t in ns.tokenizer.split(",") if t]
    if ns.quick:
        return [
            Cell(w, d, Arm(MODES[m], t), c)
            for w, d, m, c in QUICK_CELLS
            for t in (tokenizers if m == HEAD_MODE else tokenizers[:1])
        ]
    levels = sorted({int(c) for c in ns.concurrency.split(",")}, reverse=True)
    arms = [Arm(MODES[m], t) for m in ns.modes.split(",") if m for t in tokenizers]
    base = [Arm(MODES[ns.baseline], tokenizers[0])] if ns.baseline else []
    dims = [d for d in ns.budgets.split(",") if d]
    cells = []
    for c in levels:
        for w in ns.workloads.split(","):
            for d in dims:
                if d == "total_tokens" and not _at(ns.token_budget_at, c):
                    continue
                cells += [Cell(w, d, a, c) for a in arms]
                if d == dims[0] and _at(ns.baseline_at, c):
                    cells += [Cell(w, d, a, c) for a in base]
    return cells


def _at(levels: str, concurrency: int) -> bool:
    return levels == "all" or str(concurrency) in levels.split(",")


def batches_of(cell: Cell, ns: argparse.Namespace) -> list[Batch]:
    """The cell's tenant-runs, together while their streams add up to at most --max-streams."""
    tenants = tenant_ids(cell.workload, cell.dimension, ns.tenants)
    together = max(1, min(len(tenants), ns.max_streams // cell.concurrency))
    out = []
    for start in range(0, len(tenants), together):
        group = list(range(start, min(start + together, len(tenants))))
        seeds = [ns.seed * 1_000_003 + cell.concurrency * 1009 + i for i in group]
        out.append(
            Batch(
                cell.arm.mode,
                cell.concurrency,
                [0] * len(group),
                [tenants[i] for i in group],
                seeds,
            )
        )
    return out


def run_cell(
    ns: argparse.Namespace, cell: Cell, workload: Workload, prices: Prices, target: Target
) -> dict[str, Any]:
    """One cell: its p95 route warmed afresh with the workload's lengths, its batches run
    (again while the machine was contended), summarized in the budget's unit."""
    arm, route = cell.arm, cell.arm.route
    target.bar.set_postfix_str(f"{cell.workload} {cell.dimension} {route} x{cell.concurrency}")
    before = None
    if arm.mode.learns_p95:
        reset_estimator(target.redis_url, route)
        warm = workload.warm_prompts()
        asyncio.run(warm_up(target.urls, arm.mode, ns.warmup, prompts=warm, route=route))
        before = p95_state(target.redis_url, route)
    watch = CpuWatch(target.pids).start()
    batches = batches_of(cell, ns)

    def run(batch: Batch) -> None:
        run_batch(
            batch,
            arm,
            workload,
            cell.dimension,
            prices,
            target.urls,
            target.mock_url,
            target.redis_url,
            ns.time_limit,
            ns.max_retries,
        )

    measure_batches(batches, run, target, ns.contended_retries)
    results = [r for b in batches for r in b.results]
    summary = summarize(results, [w for b in batches for w in b.queue_waits_ms])
    # summarize's token figure is total tokens less the budget; here the budget's own unit.
    del summary["worst_tokens_over_ground_truth"]
    summary["worst_over_budget_units"] = max(r["spent"] - r["budget"] for r in results)
    return {
        "workload": cell.workload,
        "dimension": cell.dimension,
        "unit": "nano_usd" if cell.dimension == "cost_usd" else "tokens",
        "budget": workload.budgets[cell.dimension],
        "mode": arm.mode.name,
        "label": arm.mode.label,
        "truncates": arm.mode.truncates,
        "tokenizer": arm.tokenizer,
        "route": route,
        "concurrency": cell.concurrency,
        "tenants": ns.tenants,
        "tenants_together": len(batches[0].tenants),
        "client": "sdk",
        "p95_before": before,
        "p95_after": p95_state(target.redis_url, route) if arm.mode.learns_p95 else None,
        "cpu": watch.stop(),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "summary": summary,
        "tenant_runs": results,
    }


def check(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The gate: no truncating cell over its budget by ground truth, no hold left anywhere."""
    return check_cells(cells, CHECK_MAX_OVERSHOOT)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop every child process
    out = ns.out or RESULTS / (
        "overshoot-realistic-quick.json" if ns.quick else "overshoot-realistic.json"
    )
    started = time.monotonic()
    cells = plan_cells(ns)
    price_in, price_out = (float(x) for x in ns.prices.split(","))
    prices = Prices(price_in, price_out)
    names = list(dict.fromkeys(c.workload for c in cells))
    dimensions = list(dict.fromkeys(c.dimension for c in cells))
    arms = list({c.arm.route: c.arm for c in cells}.values())
    print(f"generating {ns.pool} requests for each of {', '.join(names)}", file=sys.stderr)
    workloads = {
        w: Workload.build(w, prompts.pool(w, ns.pool, ns.seed), prices, ns.requests_per_budget)
        for w in names
    }
    batches = sum(len(batches_of(c, ns)) for c in cells)
    window = choose_window(ns.time_limit * batches)
    gateway_cfg: dict[str, Any] = {"reservation_ttl_seconds": 120}
    args = sys.argv[1:] if argv is None else argv
    result: dict[str, Any] = {
        "benchmark": "overshoot-realistic",
        "command": "python -m bench overshoot_realistic " + " ".join(args),
        "complete": False,
        "machine": machine_info(),
        "parameters": {
            "quick": ns.quick,
            "workloads": {w: workloads[w].stats(prices) for w in names},
            "budget_dimensions": dimensions,
            "requests_per_budget": ns.requests_per_budget,
            "prices_usd_per_million": {"input": price_in, "output": price_out},
            "tokenizers": ns.tokenizer.split(","),
            "tokenizer_field_in_tree": TOKENIZER_FIELD,
            "routes": {a.route: {"label": a.mode.label, **a.entry(prices)} for a in arms},
            "concurrency": sorted({c.concurrency for c in cells}, reverse=True),
            "tenants_per_cell": ns.tenants,
            "max_streams_together": ns.max_streams,
            "gateway_processes": ns.gateways,
            "gateway_config": gateway_cfg,
            "queue_wait_seconds": GatewayConfig().queue_wait_seconds,  # the default: not set
            "max_tokens": prompts.MAX_TOKENS,
            "mock_pace_ms": ns.pace_ms,
            "seed": ns.seed,
            "p95_warmup_replies": ns.warmup,
            "time_limit_s_per_tenant_run": ns.time_limit,
            "client": "sdk",
            "client_max_retries": ns.max_retries,
            "contended_retries": ns.contended_retries,
            "budget_window": window,
        },
        "notes": [
            "Prompt tokens are what the mock bills (tiktoken cl100k_base over the chat "
            "format, bench/budget/prompts.py); output lengths are asked of the mock per request "
            "([mock:tokens=N]); agent tool steps are answered with a tool call.",
            "bound_over_billed_input: the gateway's upper-bound input estimate "
            "(hardcap_core/wire/openai_input.py) over the billed prompt, per workload.",
            "Budgets: cost_usd in nano-USD (ground truth = the mock's prompt and completion "
            "tokens at the route's prices), total_tokens in tokens; each sized to pay for "
            "requests_per_budget mean requests of its workload.",
            "usable_before_first_refusal: the mock's spend for the tenant, fetched when any of "
            "its clients first got budget_busy, rate_limited, budget_exceeded or overloaded.",
            "The queue wait is the gateway's default (queue_wait_seconds not set).",
        ],
        "cells": [],
    }
    with tempfile.TemporaryDirectory(prefix="hardcap-realistic-") as tmp_name:
        tmp = Path(tmp_name)
        with LocalValkey() as valkey:
            mock = stack.start_mock(tmp, pace_ms=ns.pace_ms, seed=ns.seed, nice=ns.mock_nice)
            result["parameters"]["mock_nice"] = stack.get_nice(mock.proc.pid)
            try:
                data = build_config(
                    mock.url,
                    valkey.url,
                    arms,
                    list(workloads.values()),
                    dimensions,
                    ns.tenants,
                    window,
                    prices,
                    gateway_cfg,
                )
                with stack.gateways(data, ns.gateways, tmp) as gws:
                    pids = {
                        **pids_of([mock, *gws]),
                        "valkey": valkey.proc.pid if valkey.proc else 0,
                    }
                    total = sum(ns.tenants for _ in cells)
                    bar = tqdm(total=total, unit="tenant-run")
                    logs = LogWatch([g.log for g in gws])
                    target = Target([f"{g.url}/v1" for g in gws], mock.url, valkey.url, pids, bar)
                    for cell in cells:
                        row = run_cell(ns, cell, workloads[cell.workload], prices, target)
                        row["gateway_log"] = logs.new_entries()
                        result["cells"].append(row)
                        write_json(out, result)
                    bar.close()
            finally:
                mock.stop()
    result["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    return finish(result, out, started, check, print_summary, ns.check)


def print_summary(result: dict[str, Any], out: Path) -> None:
    print(f"\nwrote {out} in {result['seconds']} s")
    for c in result["cells"]:
        s = c["summary"]
        before = s.get("usable_before_refusal_mean")
        print(
            f"{c['workload']:>5} {c['dimension']:>12} {c['route']:>24} x{c['concurrency']:<4}"
            f" worst {s['worst_overshoot_ground_truth']:+.4%} usable {s['usable_mean']:.2%}"
            f" before-refusal {'-' if before is None else f'{before:.2%}'}"
            f" busy {s['busy_per_tenant']:.1f} failed {s['failed_per_tenant']:.1f}"
            f" queue p50/p99 {s['queue_wait_p50_ms']}/{s['queue_wait_p99_ms']} ms"
            f" left {s['reserved_left_max']} errors {s['errors']}"
        )
    print("check:", result["check"])


if __name__ == "__main__":
    sys.exit(main())
