"""Failover under load: a route whose primary upstream fails, then dies, while streams flow.

The seed's experiment. Two mock upstreams in processes of their own (``primary``,
``secondary``), one route ``primary`` with ``fallbacks: [secondary]``, breakers shared through a
real Valkey (threshold 5, cooldown 2 s), ``--gateways`` ``hardcap serve`` processes. An open-loop
generator sends streamed completions round-robin at a fixed rate and records how each ended
(:mod:`bench.failover.failover_load`). Stages:

1. **Rate search**: the issue asks 200 streams/s; blocks at ``--rates`` (highest first) find the
   highest rate this machine holds (every request ok, completions keep up, p99 time to first
   byte under :data:`HOLD_TTFB_P99_MS`). The phases run at it; ``--rate`` skips the search.
2. **Calibration**: the same load straight to a mock, no gateway: the generator's own cost.
3. **Phase A**: after ``--before`` s the primary answers 503 for ``--fault-seconds`` (POST
   /mock/fault); goal: no client request fails.
4. **Phase B**: the primary process is killed (SIGKILL) at ``--kill-at``: only streams in flight
   on it may fail, each with an SSE error event, and settled; every request sent after the kill
   must succeed. Afterwards no reservation may be left (usage endpoint ``live_reservations``).

    python -m bench failover --plot        # ~3 min
    python -m bench failover --quick --check   # ~40 s, CI
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm  # type: ignore[import-untyped]

from bench.failover import failover_load as load
from bench.failover.failover_report import (
    check,
    phase_a_report,
    phase_b_report,
    plot,
    print_summary,
)
from bench.lib import stack
from bench.lib.machine import CpuWatch, machine_info, pids_of, write_json
from bench.lib.stack import LogWatch
from hardcap_core.local.valkey import LocalValkey
from tests.load.http1 import Client

RESULTS = Path(__file__).resolve().parents[1] / "results"
HOLD_TTFB_P99_MS = 250.0  # a rate is held while p99 time to first byte stays under this
HOLD_KEEP_UP = 0.97  # ... and at least this share of its requests completed ok
BIG = 10**12
SEED = {  # the seed's published run (its README and blog post)
    "rate_per_second": 200,
    "phase_503": {"requests": 4000, "failed": 0, "p99": "did not move"},
    "phase_kill": {
        "requests": 4000,
        "failed": 26,
        "note": "every failure a stream in flight on the killed process, each ending "
        "with an SSE error event; every request sent after the kill succeeded",
    },
}
TENANTS = ("search", "calib", "warmup", "phase_503", "phase_kill")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI smoke: short phases, no rate search")
    p.add_argument("--check", action="store_true", help="exit 1 if a goal was missed")
    p.add_argument("--plot", action="store_true", help="draw bench/results/failover.png")
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/failover.json)")
    p.add_argument("--rate", type=float, help="streams/s for the phases (skips the search)")
    p.add_argument("--rates", default="200,150,100,70,50,35,25", help="rates the search tries")
    p.add_argument("--search-seconds", type=float, default=8.0, help="length of a search block")
    p.add_argument("--gateways", type=int, default=2, help="hardcap serve processes (1-3)")
    p.add_argument("--tokens", type=int, default=20, help="output tokens per stream")
    p.add_argument("--pace-ms", type=float, default=10.0, help="mock ms per token")
    p.add_argument("--phase-seconds", type=float, default=20.0, help="length of each phase")
    p.add_argument("--before", type=float, default=5.0, help="phase A: s before the 503s")
    p.add_argument("--fault-seconds", type=float, default=7.0, help="phase A: s of 503s")
    p.add_argument("--kill-at", type=float, default=10.0, help="phase B: s before the kill")
    p.add_argument("--warmup-seconds", type=float, default=3.0)
    p.add_argument("--failures", type=int, default=5, help="breaker: failures that open it")
    p.add_argument("--cooldown", type=float, default=2.0, help="breaker: cooldown, s")
    ns = p.parse_args(argv)
    if ns.quick:
        ns.rate = ns.rate or 30.0
        ns.phase_seconds, ns.before, ns.fault_seconds, ns.kill_at = 8.0, 2.0, 3.0, 4.0
        ns.warmup_seconds, ns.search_seconds = 1.5, 3.0
    return ns


def build_config(primary: str, secondary: str, redis_url: str, ns: argparse.Namespace) -> Any:
    """Route ``primary`` (falls back to ``secondary``), a route on ``secondary`` alone, and one
    tenant per stage with a budget too large to matter."""
    breaker = {"failures": ns.failures, "cooldown_seconds": ns.cooldown, "half_open_probes": 1}
    price = {"input_per_million": 1.0, "output_per_million": 2.0}
    return {
        "gateway": {"redis_url": redis_url, "breaker": breaker},
        "upstreams": [
            {"name": "primary", "base_url": f"{primary}/v1", "timeout_seconds": 30},
            {"name": "secondary", "base_url": f"{secondary}/v1", "timeout_seconds": 30},
        ],
        "routes": [
            {
                **stack.mock_route("primary", price=price, fallbacks=["secondary"]),
                "upstream": "primary",
            },
            {**stack.mock_route("secondary", price=price), "upstream": "secondary"},
        ],
        "tenants": [stack.tenant_entry(t, BIG, "day") for t in TENANTS],
    }


class Run:
    """The processes of one run and the helpers every stage uses."""

    def __init__(
        self,
        ns: argparse.Namespace,
        gws: list[Any],
        mocks: dict[str, Any],
        redis_url: str,
        bar: Any,
    ) -> None:
        self.ns = ns
        self.urls = [f"{g.url}/v1" for g in gws]
        self.mocks = mocks
        self.redis_url = redis_url
        self.bar = bar
        self.pids: dict[str, int] = {}

    def body(self, tenant: str, model: str = "primary") -> Callable[[str], bytes]:
        return lambda sid: load.stream_body(sid, model, tenant, self.ns.tokens)

    async def drive(
        self,
        tenant: str,
        rate: float,
        seconds: float,
        *,
        urls: list[str] | None = None,
        hooks: tuple[load.Hook, ...] = (),
    ) -> tuple[float, list[load.Shot]]:
        clients = [Client(u, max_connections=1024) for u in urls or self.urls]
        key = stack.tenant_key(tenant) if urls is None else ""
        try:
            return await load.open_loop(
                clients,
                key,
                self.body(tenant),
                rate,
                seconds,
                tenant,
                hooks=hooks,
                on_done=lambda _: self.bar.update(1),
            )
        finally:
            for c in clients:
                await c.aclose()

    async def records(self, name: str) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=30) as h:
            r = await h.get(f"{self.mocks[name].url}/mock/requests")
            return dict(r.json())

    def usage(self, tenant: str) -> dict[str, Any]:
        r = httpx.get(
            f"{self.urls[0]}/hardcap/usage",
            timeout=10,
            headers={"authorization": f"Bearer {stack.tenant_key(tenant)}"},
        )
        r.raise_for_status()
        return dict(r.json())


def held(s: dict[str, Any], rate: float, seconds: float) -> bool:
    """Whether a search block kept up: every request ok, the rate delivered, a fast first byte."""
    p99 = s["ttfb_ms"]["p99"]
    return (
        s["failed"] == 0
        and s["ok"] >= HOLD_KEEP_UP * int(rate * seconds)
        and p99 is not None
        and p99 <= HOLD_TTFB_P99_MS
    )


async def search(run: Run) -> tuple[float, list[dict[str, Any]]]:
    """The highest of ``--rates`` this machine holds through the gateways (else the lowest)."""
    blocks = []
    rates = sorted((float(r) for r in run.ns.rates.split(",")), reverse=True)
    for rate in rates:
        cpu = CpuWatch(run.pids).start()
        _, shots = await run.drive("search", rate, run.ns.search_seconds)
        s = load.summarize(shots)
        ok = held(s, rate, run.ns.search_seconds)
        blocks.append({"rate": rate, "held": ok, **s, "cpu": cpu.stop()})
        if ok:
            return rate, blocks
        await asyncio.sleep(1.0)  # let the backlog drain before the next block
    return rates[-1], blocks


async def calibrate(run: Run, rate: float) -> dict[str, Any]:
    """The same streams straight to the secondary mock: what the generator and mock cost alone."""
    direct = [f"{run.mocks['secondary'].url}/v1"]
    await run.drive("calib", rate, 1.0, urls=direct)  # warm: connections, the mock's first use
    before = resource.getrusage(resource.RUSAGE_SELF)
    _, shots = await run.drive(
        "calib", rate, run.ns.search_seconds, urls=[f"{run.mocks['secondary'].url}/v1"]
    )
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {
        "rate": rate,
        "target": "secondary mock, no gateway",
        **load.summarize(shots),
        "generator_cpu_ms_per_request": round(cpu * 1000 / max(len(shots), 1), 3),
        "ideal_stream_ms": run.ns.tokens * run.ns.pace_ms,
    }


async def phase_a(run: Run, rate: float, watch: load.BreakerWatch) -> dict[str, Any]:
    ns = run.ns

    async def fault() -> None:
        async with httpx.AsyncClient(timeout=10) as h:
            body = {"mode": "status", "status": 503, "seconds": ns.fault_seconds}
            (await h.post(f"{run.mocks['primary'].url}/mock/fault", json=body)).raise_for_status()

    t0, shots = await run.drive("phase_503", rate, ns.phase_seconds, hooks=((ns.before, fault),))
    recs = {"primary": await run.records("primary"), "secondary": await run.records("secondary")}
    load.join_served(shots, recs)
    return phase_a_report(shots, t0, ns, watch)


async def closed_again(run: Run, watch: load.BreakerWatch, rate: float) -> None:
    """Until the primary's breaker is closed (probes need traffic: a trickle of requests)."""
    for _ in range(20):
        if watch.changes and watch.changes[-1][1] == "closed":
            return
        await run.drive("warmup", rate, 0.5)


async def phase_b(run: Run, rate: float, watch: load.BreakerWatch) -> dict[str, Any]:
    ns = run.ns
    kill: dict[str, Any] = {}

    async def kill_primary() -> None:
        kill["records"] = await run.records("primary")  # its records die with it
        kill["before"] = time.perf_counter()
        os.kill(run.mocks["primary"].proc.pid, signal.SIGKILL)
        kill["at"] = time.perf_counter()

    t0, shots = await run.drive(
        "phase_kill", rate, ns.phase_seconds, hooks=((ns.kill_at, kill_primary),)
    )
    run.mocks["primary"].proc.wait(10)
    recs = {"primary": kill["records"], "secondary": await run.records("secondary")}
    load.join_served(shots, recs)
    for s in shots:
        # Reached the primary between the last look at its records and the kill.
        if s.served_by is None and s.sent is not None and s.sent < kill["at"] and s.outcome != "ok":
            s.served_by = "primary_unrecorded"
    return phase_b_report(shots, t0, kill["at"], ns, watch)


def settled(run: Run, tenants: tuple[str, ...], timeout_s: float = 15.0) -> dict[str, Any]:
    """Each tenant's live reservations once traffic stopped (waits for them to reach 0), the
    ledger's total tokens, and the primary's breaker as the usage endpoint shows it."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = {t: run.usage(t) for t in tenants}
        if all(r["live_reservations"] == 0 for r in rows.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    out: dict[str, Any] = {}
    for t, r in rows.items():
        used = next(
            b["used"]
            for b in r["budgets"]
            if b["level"] == "tenant" and b["dimension"] == "total_tokens"
        )
        out[t] = {
            "live_reservations": r["live_reservations"],
            "ledger_total_tokens": used,
            "upstreams": r["upstreams"],
        }
    return out


async def stages(run: Run, result: dict[str, Any], out: Path) -> None:
    ns = run.ns
    if ns.rate:
        rate, blocks = ns.rate, list[dict[str, Any]]()
    else:
        rate, blocks = await search(run)
    result["rate_search"] = {
        "criterion": f"every request ok, >= {HOLD_KEEP_UP:.0%} completed, "
        f"p99 TTFB <= {HOLD_TTFB_P99_MS:g} ms",
        "blocks": blocks,
        "chosen_rate": rate,
        "asked_rate": 200,
    }
    result["calibration"] = await calibrate(run, rate)
    write_json(out, result)
    await run.drive("warmup", rate, ns.warmup_seconds)
    watch = load.BreakerWatch(run.redis_url, "hc:{brk:primary}")
    watch.start()
    try:
        cpu = CpuWatch(run.pids).start()
        result["phase_503"] = await phase_a(run, rate, watch)
        result["phase_503"]["cpu"] = cpu.stop()
        await closed_again(run, watch, rate)
        # The primary dies in this phase: its CPU cannot be read at the end, so it is left out.
        cpu = CpuWatch({k: v for k, v in run.pids.items() if k != "primary"}).start()
        result["phase_kill"] = await phase_b(run, rate, watch)
        result["phase_kill"]["cpu"] = cpu.stop()
    finally:
        await watch.stop()


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop every child process
    out = ns.out or RESULTS / ("failover-quick.json" if ns.quick else "failover.json")
    result: dict[str, Any] = {
        "benchmark": "failover",
        "command": "python -m bench failover " + " ".join(sys.argv[1:] if argv is None else argv),
        "complete": False,
        "machine": machine_info(),
        "parameters": {k: v for k, v in vars(ns).items() if k not in ("out", "check", "plot")},
        "seed": SEED,
    }
    started = time.monotonic()
    planned = (ns.phase_seconds * 2 + ns.warmup_seconds + ns.search_seconds * 8) * (ns.rate or 200)
    with tempfile.TemporaryDirectory(prefix="hardcap-failover-") as tmp_name:
        tmp = Path(tmp_name)
        with LocalValkey() as valkey:
            mocks = {
                name: stack.start_mock(tmp, pace_ms=ns.pace_ms, seed=i + 1)
                for i, name in enumerate(("primary", "secondary"))
            }
            try:
                data = build_config(mocks["primary"].url, mocks["secondary"].url, valkey.url, ns)
                with stack.gateways(data, ns.gateways, tmp) as gws:
                    logs = LogWatch([g.log for g in gws])
                    with tqdm(total=int(planned), unit="req", mininterval=2.0) as bar:
                        run = Run(ns, gws, mocks, valkey.url, bar)
                        run.pids = {
                            "primary": mocks["primary"].proc.pid,
                            "secondary": mocks["secondary"].proc.pid,
                            **pids_of(gws),
                        }
                        asyncio.run(stages(run, result, out))
                    result["settled"] = settled(run, ("phase_503", "phase_kill"))
                    result["gateway_log"] = logs.new_entries()
            finally:
                for m in mocks.values():
                    m.stop()
    result["complete"] = True
    result["seconds"] = round(time.monotonic() - started, 1)
    result["check"] = check(result)
    write_json(out, result)
    print_summary(result, out)
    if ns.plot:
        png = out.with_suffix(".png")
        plot(result, png)
        print(f"wrote {png}")
    if ns.check and not result["check"]["passed"]:
        print(f"CHECK FAILED: {result['check']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
