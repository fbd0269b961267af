"""How far past its budget a tenant gets when the cache is flushed at the worst moment.

A tenant spends its daily total-token budget at a steady rate (``--spend-seconds`` to spend it
all) through the gateway's ledger (admit, settle: the real scripts on a real Valkey) while the
rollup moves its usage records into DynamoDB (moto, in this process) on a cadence:

* ``before``: one pass per scheduled invocation, once a minute (the rollup until this change);
* ``after``: passes every ``INTERVAL_S`` until ``RESERVE_S`` before the function's ``Timeout``
  (hardcap_core/rollup/run.py, infra/template.yaml), invocations once a minute;
* ``serve``: ``hardcap serve``'s rollup timer (hardcap_core/local/rollup_timer.py, its thread
  and cache client), which keeps the same cadence with no invocations: a pass every
  ``INTERVAL_S`` from the start of the one before; the cache is flushed just before a pass.

The schedule is set so the budget runs out just before a drain that follows the longest gap
between two drains, and the cache is flushed (``FLUSHALL``) just before that drain: every record
since the previous drain is lost. The tenant goes on; the ledger restores its counters from
DynamoDB and lets it spend what was lost again, until it is refused. The result is what the
tenant was granted in all, against its budget.

Time is scaled by ``--scale`` (0.1: a minute of the schedule takes 6 s, and the tenant spends
10x as fast); the overshoot, a rate times a gap, does not depend on it as long as requests come
far enough apart that a pass finds the stream empty and ends (``--request-tokens``), as it does
at real rates: a pass goes on reading while records keep arriving.

    python -m bench flush_gap                 # about a minute
    python -m bench flush_gap --cadence before --spend-seconds 120
    python -m bench flush_gap --plot /tmp/flush-gap.png
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from moto import mock_aws
from tqdm import tqdm  # type: ignore[import-untyped]

from bench.lib.machine import machine_info, write_json
from hardcap_core.auth import hash_key
from hardcap_core.config import Config, parse_config
from hardcap_core.config.settings import ROLLUP_FULL_SECONDS
from hardcap_core.ledger import Admitted, Ledger, Refused, ReservationMeta
from hardcap_core.ledger.connection import connect
from hardcap_core.local.aws import OneCallAtATime
from hardcap_core.local.rollup_timer import RollupTimer
from hardcap_core.local.valkey import LocalValkey
from hardcap_core.rollup import run as rollup
from hardcap_core.rollup.restore import durable_ledger
from hardcap_core.rollup.run import RollupReport
from hardcap_core.rollup.table import UsageTable, create_table

RESULTS = Path(__file__).resolve().parents[1] / "results"
MINUTE_S = 60.0  # the schedule: rate(1 minute)
TIMEOUT_S = 58.0  # infra/template.yaml, RollupFunction.Timeout
TENANT, KEY = "t0", "t0-k"


def config(redis_url: str, budget: int) -> Config:
    return parse_config({
        "gateway": {"redis_url": redis_url},
        "upstreams": [{"name": "u", "base_url": "http://127.0.0.1:9/v1"}],
        "routes": [{"name": "r", "upstream": "u", "model": "m", "max_output_tokens": 16384}],
        "tenants": [{
            "id": TENANT,
            "budgets": [{"dimension": "total_tokens", "limit": budget, "window": "day"}],
            "keys": [{"id": KEY, "hash": hash_key("sk-flush-gap")}],
        }],
    })  # fmt: skip


@dataclass
class Trial:
    cadence: str
    spend_seconds: float
    scale: float
    budget: int
    request_tokens: int  # a fifth input, the rest output
    granted: int = 0  # tokens the tenant was granted (admitted and settled)
    granted_at_flush: int = 0
    applied_at_flush: int = 0  # of those, in DynamoDB when the cache was flushed
    drains: list[float] = field(default_factory=list)  # when each pass began, s after t0
    flushed_at: float = 0.0
    exhausted_at: float = 0.0
    done_at: float = 0.0

    def as_json(self) -> dict[str, Any]:
        before = [d for d in self.drains if d < self.flushed_at]
        gap = (self.flushed_at - before[-1]) / self.scale if before else None
        return {
            "cadence": self.cadence,
            "spend_seconds": self.spend_seconds,
            "budget_tokens": self.budget,
            "granted_tokens": self.granted,
            "granted_at_flush_tokens": self.granted_at_flush,
            "lost_at_flush_tokens": self.granted_at_flush - self.applied_at_flush,
            "past_budget_tokens": self.granted - self.budget,
            "granted_over_budget": round(self.granted / self.budget, 4),
            "seconds_since_last_drain_at_flush": None if gap is None else round(gap, 2),
            "exhausted_s": round(self.exhausted_at / self.scale, 2),
            "flushed_s": round(self.flushed_at / self.scale, 2),
            "drains_s": [round(d / self.scale, 2) for d in self.drains],
        }


class Schedule:
    """Invocations every minute from ``first``; each one pass (``before``) or passes every
    INTERVAL_S until RESERVE_S before the timeout (``after``). Knows when the next drain is."""

    def __init__(self, trial: Trial, first: float, t0: float, run: Callable[..., Any]) -> None:
        self.trial, self.first, self.t0, self.run = trial, first, t0, run
        self.next_drain = first
        self.stopped = asyncio.Event()

    async def serve(self) -> None:
        s = self.trial.scale
        k = 0
        while not self.stopped.is_set():
            start = self.first + k * MINUTE_S * s
            self.next_drain = start
            await asyncio.sleep(max(start - time.monotonic(), 0))
            if self.stopped.is_set():
                return
            if self.trial.cadence == "before":
                self.trial.drains.append(time.monotonic() - self.t0)
                await self.run(first_pass=True)
                self.next_drain = self.first + (k + 1) * MINUTE_S * s
            else:
                until = start + (TIMEOUT_S - rollup.RESERVE_S) * s
                await self.run(until=until, interval_s=rollup.INTERVAL_S * s, sleep=self._sleep)
            k += 1

    async def _sleep(self, seconds: float) -> None:
        """The loop's wait between passes: the next pass begins when it ends."""
        self.next_drain = time.monotonic() + seconds
        await asyncio.sleep(seconds)
        self.trial.drains.append(time.monotonic() - self.t0)


class TimedTimer(RollupTimer):
    """``hardcap serve``'s timer, telling the trial when each pass began and when the next
    will (a pass starts an interval after the one before began)."""

    def __init__(self, trial: Trial, t0: float, schedule: Schedule, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.trial, self.t0, self.schedule = trial, t0, schedule

    async def _run_once(self, full: bool = True) -> RollupReport:
        began = time.monotonic()
        self.trial.drains.append(began - self.t0)
        self.schedule.next_drain = began + self.interval_s
        return await super()._run_once(full)


async def one_trial(trial: Trial, server: LocalValkey, table: UsageTable) -> None:
    s = trial.scale
    admin = await connect(server.url)
    await admin.flushall()
    cache = await connect(server.url)
    cfg = config(server.url, trial.budget)
    scope = cfg.principal_by_id(KEY).scope  # type: ignore[union-attr]
    ledger = durable_ledger(cache, cfg, table)  # the gateway's: restores from DynamoDB
    per_s = trial.budget / (trial.spend_seconds * s)  # tokens a second
    inp = trial.request_tokens // 5
    out = trial.request_tokens - inp
    t0 = time.monotonic()
    # The budget runs out right before an invocation's first drain, a whole gap after the last
    # drain of the one before: the first invocation comes a small margin after that time,
    # minus as many minutes as fit.
    exhausted = t0 + trial.spend_seconds * s
    margin = 0.5 * s
    first = exhausted + margin - MINUTE_S * s * int((trial.spend_seconds + 0.5) / MINUTE_S)
    rolled = Ledger(cache)

    async def run(**kwargs: Any) -> None:
        if "until" in kwargs:
            trial.drains.append(time.monotonic() - t0)
            await rollup.rollup_loop(cfg, cache, table, ledger=rolled, **kwargs)
        else:
            await rollup.run_rollup(cfg, cache, table, ledger=rolled, **kwargs)

    schedule = Schedule(trial, first, t0, run)
    timer: RollupTimer | None = None
    if trial.cadence == "serve":  # the timer in its own thread, as `hardcap serve` runs it
        timer = TimedTimer(trial, t0, schedule, cfg, table, interval_s=rollup.INTERVAL_S * s,
                           full_every_s=ROLLUP_FULL_SECONDS * s).start()  # fmt: skip
        schedule.next_drain = t0 + rollup.INTERVAL_S * s
        serving = asyncio.get_running_loop().create_task(schedule.stopped.wait())
    else:
        serving = asyncio.get_running_loop().create_task(schedule.serve())
    flushed = asyncio.Event()

    async def flush_at_the_worst_moment() -> None:
        await asyncio.sleep(max(exhausted - time.monotonic(), 0))
        trial.exhausted_at = time.monotonic() - t0
        await asyncio.sleep(max(schedule.next_drain - 0.1 * s - time.monotonic(), 0))
        await admin.flushall()
        trial.flushed_at = time.monotonic() - t0
        trial.granted_at_flush = trial.granted
        rows = await asyncio.to_thread(table.usage, [TENANT], 0, 2**42)
        trial.applied_at_flush = sum(r.input_tokens + r.output_tokens for r in rows)
        flushed.set()

    flusher = asyncio.get_running_loop().create_task(flush_at_the_worst_moment())
    n = 0
    while True:
        n += 1
        meta = ReservationMeta("r", "m", KEY, f"rq-{n}", provider="u")
        after_flush = flushed.is_set()  # a refusal asked before the flush does not count
        got = await ledger.admit(scope, input_tokens=inp, output_estimate=out, meta=meta)
        if isinstance(got, Admitted):
            await ledger.settle(got.reservation, input_tokens=inp, output_tokens=out)
            trial.granted += inp + out
            await asyncio.sleep(max(t0 + trial.granted / per_s - time.monotonic(), 0))
        elif isinstance(got, Refused) and after_flush:
            break  # spent all the restored counters let it
        else:
            await asyncio.sleep(0.02)  # spent: asks again now and then, as a client would
    trial.done_at = time.monotonic() - t0
    await flusher
    schedule.stopped.set()
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)
    if timer is not None:
        await asyncio.to_thread(timer.stop)
    await cache.aclose()
    await admin.aclose()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cadence", choices=("before", "after", "serve"), action="append",
                   help="default: all three")  # fmt: skip
    p.add_argument(
        "--spend-seconds",
        type=float,
        action="append",
        help="seconds the tenant takes to spend its budget (default: 60 and 120)",
    )
    p.add_argument("--budget", type=int, default=200_000, help="the tenant's daily tokens")
    p.add_argument("--scale", type=float, default=0.1, help="time scale (1: real time)")
    p.add_argument(
        "--request-tokens",
        type=int,
        default=4000,
        help="tokens per request: with the defaults a request every 120-240 ms of "
        "scaled time, so a pass finds the stream empty and ends, as at real rates",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "flush-gap.json")
    p.add_argument("--plot", type=Path, help="also draw the result as this PNG")
    return p.parse_args(argv)


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    """Granted over budget per spend rate, before and after (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spends = sorted({r["spend_seconds"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, cadence in enumerate(("before", "after", "serve")):
        got = {
            r["spend_seconds"]: r["granted_over_budget"] for r in rows if r["cadence"] == cadence
        }
        xs = [j + (i - 1) * 0.27 for j, sp in enumerate(spends) if sp in got]
        ax.bar(xs, [100 * got[sp] for sp in spends if sp in got], width=0.25, label=cadence)
    ax.axhline(100, color="black", linewidth=0.8)
    ax.set_xticks(range(len(spends)), [f"budget spent in {sp:g} s" for sp in spends])
    ax.set_ylabel("granted, % of the budget")
    ax.set_title("A flush just before a drain: what the tenant gets in all")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    cadences = ns.cadence or ["before", "after", "serve"]
    spends = ns.spend_seconds or [60.0, 120.0]
    trials = [Trial(c, s, ns.scale, ns.budget, ns.request_tokens) for s in spends for c in cadences]
    with mock_aws(), LocalValkey() as server:
        client = boto3.client("dynamodb", region_name="us-east-1")
        for trial in tqdm(trials, desc="flush-gap trials", unit="trial"):
            name = f"usage-{trial.cadence}-{int(trial.spend_seconds)}"
            create_table(client, name)
            asyncio.run(one_trial(trial, server, UsageTable(OneCallAtATime(client), name)))
    rows = [t.as_json() for t in trials]
    result = {
        "benchmark": "flush_gap",
        "command": " ".join(
            [
                "python -m bench flush_gap",
                *(sys.argv[1:] if argv is None else argv),
            ]
        ),
        "machine": machine_info(),
        "parameters": {
            "budget_tokens": ns.budget,
            "tokens_per_request": ns.request_tokens,
            "scale": ns.scale,
            "schedule_minute_s": MINUTE_S,
            "before": "one pass per invocation, an invocation a minute",
            "after": {
                "interval_s": rollup.INTERVAL_S,
                "reserve_s": rollup.RESERVE_S,
                "timeout_s": TIMEOUT_S,
            },
            "serve": {"interval_s": rollup.INTERVAL_S, "full_every_s": ROLLUP_FULL_SECONDS},
        },
        "notes": [
            "granted_over_budget is what the tenant was granted in all over its budget; times "
            "(_s) are in unscaled seconds after the tenant began; the flush came just before "
            "the first drain of an invocation, a whole gap after the previous drain (serve: "
            "just before a pass of hardcap serve's timer).",
        ],
        "trials": rows,
    }
    write_json(ns.out, result)
    if ns.plot:
        plot(rows, ns.plot)
    for r in rows:
        print(f"{r['cadence']:>6}  spend {r['spend_seconds']:>5.0f} s  granted "
              f"{r['granted_over_budget']:.1%} of the budget  (flush "
              f"{r['seconds_since_last_drain_at_flush']} s after a drain)")  # fmt: skip
    print(f"-> {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
