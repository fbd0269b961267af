"""One cell of the overshoot benchmark (a mode at a concurrency): its tenant-runs grouped into
batches, each batch run again while other processes took a real share of the machine, and the
cell's summary. :mod:`bench.budget.overshoot` plans the cells and starts what they run against.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.budget.budget_runs import (
    Batch,
    Mode,
    p95_state,
    reset_estimator,
    run_batch,
    summarize,
    tenant_ids,
    warm_up,
)
from bench.lib import starve
from bench.lib.machine import CpuWatch

CONTENDED = 0.25  # share of the machine other processes took during a batch: run it again


@dataclass(frozen=True)
class Target:
    """What every cell runs against: the gateways, the mock, the cache, the processes whose CPU
    is the benchmark's own, and the progress bar."""

    urls: list[str]
    mock_url: str
    redis_url: str
    pids: dict[str, int]
    bar: Any


def batches_of(mode: Mode, concurrency: int, runs: int, ns: argparse.Namespace) -> list[Batch]:
    """The cell's tenant-runs, grouped to run together while their streams add up to at most
    ``--max-streams``. Each run has its own tenants, so runs of a cell may share a batch."""
    plan = [
        (run, tenant_ids(ns.tenants * (run + 1))[-ns.tenants + i], i)
        for run in range(runs)
        for i in range(ns.tenants)
    ]
    together = max(1, min(len(plan), ns.max_streams // concurrency))
    out = []
    for start in range(0, len(plan), together):
        group = plan[start : start + together]
        seeds = [ns.seed * 1_000_003 + concurrency * 1009 + run * 101 + i for run, _, i in group]
        out.append(
            Batch(mode, concurrency, [r for r, _, _ in group], [t for _, t, _ in group], seeds)
        )
    return out


def measure_batches(
    batches: list[Batch], run: Callable[[Batch], None], target: Target, contended_retries: int
) -> None:
    """``run`` each batch, again (at most ``contended_retries`` times) while other processes
    took more than :data:`CONTENDED` of the machine meanwhile; each tenant-run records how
    contended it was and how many times its batch was run again."""
    for batch in batches:
        retries = 0
        while True:
            batch.results, batch.queue_waits_ms = [], []
            batch_watch = CpuWatch(target.pids).start()
            run(batch)
            share = batch_watch.stop()["other_share"]
            # Other work that takes a real share of the CPU makes the gateways lag behind the
            # upstream, which is what puts tokens in flight past a budget: run it again.
            if share is None or share <= CONTENDED or retries >= contended_retries:
                break
            retries += 1
        for r in batch.results:
            r["other_processes_share"] = share  # how contended the machine was meanwhile
            r["contended_retries"] = retries
        target.bar.update(len(batch.tenants))


def run_cell(
    ns: argparse.Namespace, mode: Mode, conc: int, runs: int, target: Target
) -> dict[str, Any]:
    """One cell: the p95 route warmed afresh, then its batches beside ``--starve`` busy
    processes, summarized."""
    target.bar.set_postfix_str(f"{mode.name} x{conc}")
    if mode.learns_p95:
        # Every cell starts from the same learned estimate, not from what the last cell left.
        reset_estimator(target.redis_url, mode.name)
        asyncio.run(warm_up(target.urls, mode, ns.warmup))
    before = p95_state(target.redis_url, mode.name) if mode.learns_p95 else None
    with starve.Hogs(ns.starve) as hogs:
        # The busy processes are ours: their CPU is not contention that reruns a batch.
        ours = dataclasses.replace(target, pids={**target.pids, **hogs.pids()})
        return _measure_cell(ns, mode, conc, runs, ours, before)


def _measure_cell(
    ns: argparse.Namespace,
    mode: Mode,
    conc: int,
    runs: int,
    target: Target,
    before: dict[str, int] | None,
) -> dict[str, Any]:
    """The cell's batches (each run again while the machine was contended), summarized."""
    urls, mock_url, redis_url = target.urls, target.mock_url, target.redis_url
    watch = CpuWatch(target.pids).start()
    batches = batches_of(mode, conc, runs, ns)

    def run(batch: Batch) -> None:
        run_batch(
            batch,
            urls,
            mock_url,
            redis_url,
            ns.time_limit,
            ns.busy_pause,
            retries=ns.client,
            max_retries=ns.max_retries,
        )

    measure_batches(batches, run, target, ns.contended_retries)
    results = [r for b in batches for r in b.results]
    return {
        "mode": mode.name,
        "label": mode.label,
        "truncates": mode.truncates,
        "concurrency": conc,
        "runs": runs,
        "tenants": ns.tenants,
        "tenants_together": len(batches[0].tenants),
        "p95_before": before,
        "p95_after": p95_state(redis_url, mode.name) if mode.learns_p95 else None,
        "cpu": watch.stop(),
        "client": ns.client,
        "starve_processes": ns.starve,
        "summary": summarize(results, [w for b in batches for w in b.queue_waits_ms]),
        "tenant_runs": results,
    }
