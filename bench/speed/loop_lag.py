"""How late the gateways' event loops run under streaming load, with and without CPU starvation,
and how often shedding would start at candidate thresholds (gateway.shed_when_loop_lag_ms).

Three `hardcap serve` processes (one Valkey, the mock at a higher CPU priority, as in
bench/budget/overshoot.py) run with shedding off; each records every tick of its own
:class:`hardcap_core.gateway.loop_lag.LoopLag` (wrapped by this benchmark's bootstrap: the
lateness the monitor itself sees) and writes them to a file. Phases, one after another on the
same processes:

- ``idle``: no requests;
- ``load``: tenants x streams of the mock's replies (tests/load/harness.py drive_tenant);
- ``load_busy``: the same while busy-looping processes, one per core, compete for the CPU
  (a starved machine: every core busy);
- ``load_quota``: the same load with the gateways in one cgroup of ``--quota`` cores
  (bench/lib/cgroup_cpu.py; needs root, else skipped).

Per phase: the lateness p50/p99/p99.9/max, and per threshold the share of the phase the
monitor would have shed (replaying its hysteresis on the recorded ticks) and how many times
it would have started.

    python -m bench loop_lag
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

from bench.lib import cgroup_cpu, stack
from bench.lib.machine import machine_info, write_json
from hardcap_core.gateway.loop_lag import LoopLag
from hardcap_core.local.valkey import LocalValkey
from tests.load.harness import drive_tenant

RESULTS = Path(__file__).resolve().parents[1] / "results"
THRESHOLDS_MS = (25, 50, 100, 150, 200, 250, 500, 1000)
LAG_DIR = "HARDCAP_BENCH_LAG_DIR"

# The gateway, with every LoopLag tick (monotonic time, lateness) appended to an array that a
# daemon thread writes to <dir>/lag-<pid>.bin every second (time.monotonic is the same clock
# in every process: the phases are cut from it).
BOOTSTRAP = f"""
import os, sys, threading, time
from array import array
from hardcap_core.gateway import loop_lag
ticks = array("d")
_observe = loop_lag.LoopLag.observe
def observe(self, lateness_s):
    ticks.append(time.monotonic()); ticks.append(lateness_s)
    _observe(self, lateness_s)
loop_lag.LoopLag.observe = observe
path = os.path.join(os.environ[{LAG_DIR!r}], f"lag-{{os.getpid()}}.bin")
def dump():
    while True:
        time.sleep(1.0)
        with open(path + ".tmp", "wb") as f:
            ticks[: len(ticks) // 2 * 2].tofile(f)
        os.replace(path + ".tmp", path)
threading.Thread(target=dump, daemon=True).start()
from hardcap_core.local.cli import main
sys.exit(main(sys.argv[1:]))
"""
BUSY = "while True: pass"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gateways", type=int, default=3)
    p.add_argument("--tenants", type=int, default=8)
    p.add_argument("--streams", type=int, default=32, help="streams per tenant")
    p.add_argument("--seconds", type=float, default=45.0, help="per load phase")
    p.add_argument("--idle-seconds", type=float, default=10.0)
    p.add_argument("--pace-ms", type=float, default=10.0, help="mock ms per token")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--quota", type=float, default=0.5, help="cores for all gateways (cgroup)")
    p.add_argument(
        "--shed-ms",
        type=float,
        default=0.0,
        help="gateway.shed_when_loop_lag_ms (0: off, the default: measure without shedding)",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "loop-lag.json")
    return p.parse_args(argv)


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def would_shed(ticks: list[tuple[float, float]], threshold_ms: float) -> dict[str, Any]:
    """Replay LoopLag's hysteresis on recorded ticks: share of time shedding, and starts."""
    clock = [0.0]
    lag = LoopLag(threshold_s=threshold_ms / 1000, clock=lambda: clock[0])
    on_s, starts, was = 0.0, 0, False
    for (t, late), nxt in zip(ticks, [*ticks[1:], ticks[-1]], strict=True):
        clock[0] = t
        lag.observe(late)
        now = lag.shedding()
        starts += now and not was
        if now:
            on_s += nxt[0] - t
        was = now
    span = ticks[-1][0] - ticks[0][0] if len(ticks) > 1 else 0.0
    return {"shedding_share": round(on_s / span, 4) if span else 0.0, "starts": starts}


def summarize(ticks: list[tuple[float, float]]) -> dict[str, Any]:
    lates = sorted(late for _, late in ticks)
    ms = {
        f"lag_{name}_ms": round(percentile(lates, q) * 1000, 2)
        for name, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))
    }
    return {
        "ticks": len(ticks),
        **ms,
        "lag_max_ms": round(lates[-1] * 1000, 2) if lates else 0.0,
    }


def read_ticks(lag_dir: Path) -> dict[str, list[tuple[float, float]]]:
    out = {}
    for path in sorted(lag_dir.glob("lag-*.bin")):
        raw = array("d")
        raw.frombytes(path.read_bytes())
        out[path.stem] = list(zip(raw[0::2], raw[1::2], strict=True))
    return out


async def load(urls: list[str], ns: argparse.Namespace, seed: int) -> dict[str, Any]:
    runs = await asyncio.gather(
        *(
            drive_tenant(
                urls,
                stack.tenant_key(f"t{i}"),
                f"t{i}",
                concurrency=ns.streams,
                model="bench",
                max_tokens=ns.max_tokens,
                time_limit_s=ns.seconds,
                seed=seed + i,
            )
            for i in range(ns.tenants)
        )
    )
    counts: dict[str, Any] = {
        key: sum(getattr(r, key) for r in runs)
        for key in ("requests", "completed", "truncated", "capped", "busy", "errors")
    }
    # With shedding on, the errors are the 503s (a client here retries one after 50 ms).
    counts["error_samples"] = sorted({s for r in runs for s in r.error_samples})
    return counts


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    result: dict[str, Any] = {
        "command": "python -m bench loop_lag "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine_info": machine_info(),
        "parameters": {k: str(v) if isinstance(v, Path) else v for k, v in vars(ns).items()},
        "notes": [
            "Lateness of the gateways' own LoopLag ticks (25 ms interval); shedding as "
            "parameters.shed_ms says (0: off). "
            "would_shed replays the monitor's hysteresis (hold 1 s) on the recorded ticks: "
            "the share of the phase it would have refused new requests, and how often it "
            "would have started.",
        ],
        "phases": {},
    }
    cgroup_cpu.remove_stale()
    with tempfile.TemporaryDirectory(prefix="hardcap-looplag-") as tmp_name:
        tmp = Path(tmp_name)
        lag_dir = tmp / "lag"
        lag_dir.mkdir()
        with LocalValkey() as valkey:
            mock = stack.start_mock(tmp, pace_ms=ns.pace_ms, seed=7, nice=-10)
            try:
                data = stack.base_config(mock.url, valkey.url, shed_when_loop_lag_ms=ns.shed_ms)
                data["routes"] = [stack.mock_route("bench", max_output_tokens=ns.max_tokens)]
                data["tenants"] = [
                    stack.tenant_entry(f"t{i}", 10**12, "day") for i in range(ns.tenants)
                ]
                launch = stack._gateway_launch(hiredis=True, fast_server=True, log_level="WARNING")
                env = {**launch["env"], LAG_DIR: str(lag_dir)}
                command = [sys.executable, "-c", BOOTSTRAP]
                with stack.local_stack.gateways(
                    data, ns.gateways, tmp, command=command, env=env, cwd=stack.ROOT
                ) as gws:
                    urls = [f"{g.url}/v1" for g in gws]
                    spans = run_phases(ns, urls, [g.proc.pid for g in gws], result)
                    time.sleep(2.5)  # the last dump
                    ticks = read_ticks(lag_dir)
            finally:
                mock.stop()
    for name, (start, end) in spans.items():
        mine = sorted(
            (t, late) for series in ticks.values() for t, late in series if start <= t < end
        )
        per_gateway = [
            [(t, late) for t, late in series if start <= t < end] for series in ticks.values()
        ]
        phase = result["phases"][name]
        phase["all_gateways"] = summarize(mine)
        phase["per_gateway_max_ms"] = [
            round(max((late for _, late in s), default=0.0) * 1000, 2) for s in per_gateway
        ]
        # Shedding is per process: replayed per gateway, then the mean share and all starts.
        shed = {t: [would_shed(s, t) for s in per_gateway if s] for t in THRESHOLDS_MS}
        phase["would_shed"] = {
            str(t): {
                "shedding_share_mean": round(sum(x["shedding_share"] for x in v) / len(v), 4),
                "starts": sum(x["starts"] for x in v),
            }
            for t, v in shed.items()
            if v
        }
    write_json(ns.out, result)
    for name, phase in result["phases"].items():
        a = phase["all_gateways"]
        shed = {t: v["shedding_share_mean"] for t, v in phase.get("would_shed", {}).items()}
        print(
            f"{name:11} p50 {a['lag_p50_ms']:7.2f} p99 {a['lag_p99_ms']:7.2f} "
            f"max {a['lag_max_ms']:8.2f} ms  shedding share by threshold {shed}"
        )
    print(f"wrote {ns.out}")
    return 0


def run_phases(
    ns: argparse.Namespace, urls: list[str], pids: list[int], result: dict[str, Any]
) -> dict[str, tuple[float, float]]:
    spans: dict[str, tuple[float, float]] = {}

    def phase(name: str, body: Any) -> None:
        start = time.monotonic()
        info = body()
        spans[name] = (start, time.monotonic())
        result["phases"][name] = {"seconds": round(spans[name][1] - start, 1), **(info or {})}
        print(f"phase {name}: {result['phases'][name]}", flush=True)

    phase("idle", lambda: time.sleep(ns.idle_seconds))
    phase("load", lambda: {"requests": asyncio.run(load(urls, ns, 1))})

    def busy() -> dict[str, Any]:
        cores = os.cpu_count() or 1
        hogs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(cores)]
        try:
            return {"busy_processes": cores, "requests": asyncio.run(load(urls, ns, 100))}
        finally:
            for h in hogs:
                h.kill()
                h.wait()

    phase("load_busy", busy)

    if not cgroup_cpu.is_root() or cgroup_cpu.backend() is None:
        result["phases"]["load_quota"] = {"skipped": "needs root and a cgroup cpu controller"}
        return spans

    def quota() -> dict[str, Any]:
        period = 100_000
        group = cgroup_cpu.CpuQuota("looplag", int(ns.quota * period), period).create()
        try:
            for pid in pids:
                group.add(pid)
            before = group.stat()
            counts = asyncio.run(load(urls, ns, 200))
            return {
                "cgroup": group.settings(),
                "throttled": cgroup_cpu.stat_delta(before, group.stat()),
                "requests": counts,
            }
        finally:
            group.remove()

    phase("load_quota", quota)
    return spans


if __name__ == "__main__":
    sys.exit(main())
