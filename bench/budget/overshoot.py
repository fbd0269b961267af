"""How far over its budget a tenant gets, per enforcement mode and streams per tenant.

The seed's experiment: tenants with a 20,000-token total budget each spend it through 3
gateway processes (``hardcap serve``) sharing one Valkey, with ``concurrency`` streams per
tenant, max_tokens 1024, log-normal output lengths (median 150, sigma 1.0) from the mock
upstream pacing tokens at ``--pace-ms``. Ground truth is what the mock generated for each
tenant, never the gateway's ledger. Modes are routes of one generated config:

* ``count_after`` — the usual implementation (route policy count_after), the baseline;
* ``max_tokens`` — reserve max_tokens, truncate; ``p95_allow`` / ``p95_truncate`` — reserve
  the shared rolling p95 and let a stream finish, or cut it, when the budget cannot grow.

Each batch starts from fresh budgets: every Valkey key is deleted except the shared p95
estimators', and the mock's ground truth is reset. Before every cell of a p95 mode, the
route's sample is emptied and refilled with ``--warmup`` non-streamed replies on a separate
warm-up tenant; within the cell it keeps learning from the runs' completed (not truncated)
streams, as it would in production (the JSON records the p95 before and after each cell).
Cells run in descending concurrency (the 128-stream headline first) and the JSON is
rewritten after every cell.

The clients retry as the official openai SDK does (``--client sdk``, ``--max-retries`` 2):
a request refused on every attempt is counted as failed and the client goes on with a new one;
``--client patient`` keeps the earlier clients, which wait what Retry-After says and try again
for as long as it takes. Per cell, besides overshoot and usable budget: the share of the
budget spent when a tenant's clients met their first refusal of any kind, the admission queue's
wait (``x-hardcap-queue-wait-ms``) p50 / p99 over every answer, and failed requests per tenant.
``--starve N`` runs N busy processes beside each cell, ``--gateway-cpu F`` puts the gateways
in a cgroup limited to F cores (bench/lib/starve.py, which says how the earlier starved results
were made).

    python -m bench overshoot --quick --check   # < 3 min, CI
    python -m bench overshoot > /tmp/overshoot.log 2>&1 &
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

from bench.budget.budget_runs import (
    BUDGET,
    DEFAULT_MODES,
    MAX_TOKENS,
    MODES,
    Mode,
    build_config,
    check_cells,
    choose_window,
    finish,
)
from bench.budget.overshoot_cells import Target, batches_of, run_cell
from bench.lib import stack, starve
from bench.lib.machine import machine_info, pids_of, write_json
from bench.lib.stack import LogWatch
from hardcap_core.local.valkey import LocalValkey

RESULTS = Path(__file__).resolve().parents[1] / "results"
QUICK_CELLS = (("p95_truncate", 128), ("p95_truncate", 8), ("count_after", 128))
CHECK_MAX_OVERSHOOT = 0.005


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 2 tenants x 1 run, 3 cells")
    p.add_argument("--check", action="store_true", help="exit 1 on overshoot or leftover holds")
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/overshoot.json)")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"of {', '.join(MODES)}")
    p.add_argument("--concurrency", default="128,64,32,8,1", help="streams per tenant")
    p.add_argument("--tenants", type=int, default=8, help="tenants per run")
    p.add_argument("--runs", type=int, default=3, help="runs per cell")
    p.add_argument("--runs-at", default="", help="per-concurrency runs, e.g. '32:1,64:1'")
    p.add_argument("--pace-ms", type=float, default=10.0, help="mock ms per token (10 = 100/s)")
    p.add_argument("--mock-nice", type=int, default=-10, help="mock CPU priority (0: as others)")
    p.add_argument("--gateways", type=int, default=3, help="gateway processes")
    p.add_argument(
        "--max-streams",
        type=int,
        default=256,
        help="tenant-runs go together while "
        "their streams add up to at most this many (at least one tenant at a time)",
    )
    p.add_argument("--warmup", type=int, default=1000, help="replies that warm each p95 route")
    p.add_argument("--guard", type=int, help="gateway.truncate_guard_tokens (default: 4)")
    p.add_argument("--headroom", type=int, help="gateway.extend_headroom_tokens (default: 48)")
    p.add_argument(
        "--queue-wait",
        type=float,
        default=60.0,
        help="gateway.queue_wait_seconds: how long a request waits for holds in flight "
        "(the gateway's default is 5 s; at 128 streams a tenant's budget admits about 3 "
        "requests a second, so the back of the line waits tens of seconds)",
    )
    p.add_argument("--time-limit", type=float, default=900.0, help="s per tenant-run, at most")
    p.add_argument("--seed", type=int, default=7, help="mock seed and client seeds")
    p.add_argument("--resume", action="store_true", help="keep the cells --out already has")
    p.add_argument("--keep-logs", type=Path, help="copy the gateways' and mock's logs here")
    p.add_argument(
        "--busy-pause",
        type=_pause,
        default=None,
        help="seconds a client waits after budget_busy, uniform in LOW,HIGH "
        "(default: what Retry-After says, plus 0-20%% jitter, as the SDKs do)",
    )
    p.add_argument(
        "--client",
        choices=("sdk", "patient"),
        default=None,
        help="sdk: retry as the official openai SDK (default); patient: wait Retry-After "
        "and try again until served (the default with --busy-pause)",
    )
    p.add_argument("--max-retries", type=int, default=2, help="the SDK-like client's max_retries")
    p.add_argument(
        "--starve", type=int, default=0, help="busy-loop processes (nice 0) beside every cell"
    )
    p.add_argument(
        "--gateway-cpu",
        type=float,
        default=None,
        help="cores the gateways get between them (a cgroup CPU quota; needs root)",
    )
    p.add_argument(
        "--contended-retries",
        type=int,
        default=2,
        help="runs of a batch again "
        "while other processes took more than a quarter of the machine meanwhile",
    )
    ns = p.parse_args(argv)
    if ns.client is None:
        ns.client = "patient" if ns.busy_pause else "sdk"
    if ns.client == "sdk" and ns.busy_pause:
        p.error("--busy-pause applies to --client patient (the SDK waits what it waits)")
    if ns.quick:
        ns.tenants, ns.runs, ns.warmup = 2, 1, 500
    return ns


def _pause(text: str) -> tuple[float, float]:
    low, high = (float(x) for x in text.split(","))
    return low, high


def plan_cells(ns: argparse.Namespace) -> list[tuple[Mode, int, int]]:
    """(mode, concurrency, runs) in the order they run: highest concurrency first."""
    if ns.quick:
        return [(MODES[m], c, 1) for m, c in QUICK_CELLS]
    modes = [MODES[m] for m in ns.modes.split(",") if m]
    runs_at = {int(k): int(v) for k, v in (x.split(":") for x in ns.runs_at.split(",") if x)}
    levels = sorted({int(c) for c in ns.concurrency.split(",")}, reverse=True)
    return [(m, c, runs_at.get(c, ns.runs)) for c in levels for m in modes]


def resumable_cells(out: Path, parameters: dict[str, Any]) -> list[dict[str, Any]]:
    """Cells of an interrupted run in ``out`` made with the same parameters (else none)."""
    if not out.exists():
        return []
    old = json.loads(out.read_text())
    volatile = {"budget_window", "mock_nice"}
    same = {k: v for k, v in old.get("parameters", {}).items() if k not in volatile} == {
        k: v for k, v in parameters.items() if k not in volatile
    }
    if not same or old.get("complete"):
        print(f"not resuming {out}: other parameters, or already complete", file=sys.stderr)
        return []
    cells: list[dict[str, Any]] = old["cells"]
    print(f"resuming {out}: {len(cells)} cells done", file=sys.stderr)
    return cells


def check(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The CI gate: truncate modes within 0.5 % of budget, no reservation left anywhere."""
    return check_cells(cells, CHECK_MAX_OVERSHOOT)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop every child process
    out = ns.out or RESULTS / ("overshoot-quick.json" if ns.quick else "overshoot.json")
    cells_plan = plan_cells(ns)
    modes = list({m.name: m for m, _, _ in cells_plan}.values())
    all_batches = [(b, runs) for m, c, runs in cells_plan for b in batches_of(m, c, runs, ns)]
    gateway_cfg: dict[str, Any] = {
        "reservation_ttl_seconds": 120,
        "queue_wait_seconds": ns.queue_wait,
    }
    if ns.guard is not None:
        gateway_cfg["truncate_guard_tokens"] = ns.guard
    if ns.headroom is not None:
        gateway_cfg["extend_headroom_tokens"] = ns.headroom
    window = choose_window(ns.time_limit * len(all_batches))
    result: dict[str, Any] = {
        "benchmark": "overshoot",
        "command": "python -m bench overshoot " + " ".join(sys.argv[1:] if argv is None else argv),
        "complete": False,
        "machine": machine_info(),
        "parameters": {
            "quick": ns.quick,
            "budget_tokens": BUDGET,
            "budget_dimension": "total_tokens",
            "budget_window": window,
            "max_tokens": MAX_TOKENS,
            "output_length": {
                "distribution": "log-normal",
                "median": 150,
                "sigma": 1.0,
                "cap": "max_tokens (the mock truncates with finish_reason length)",
            },
            "mock_pace_ms": ns.pace_ms,
            "mock_seed": ns.seed,
            "gateway_processes": ns.gateways,
            "gateway_config": gateway_cfg,
            "tenants_per_run": ns.tenants,
            "runs_per_cell": ns.runs,
            "runs_at": ns.runs_at,
            "max_streams_together": ns.max_streams,
            "p95_warmup_replies": ns.warmup,
            "time_limit_s_per_tenant_run": ns.time_limit,
            "client_busy_pause_s": list(ns.busy_pause) if ns.busy_pause else "retry-after",
            "client": ns.client,
            "client_max_retries": ns.max_retries if ns.client == "sdk" else None,
            "starve_processes": ns.starve,
            "gateway_cpu_cores": ns.gateway_cpu,
            "routes": {m.name: {"label": m.label, **m.route} for m in modes},
        },
        "notes": [
            "Per batch: all Valkey keys deleted except the shared p95 estimator keys "
            "(hc:{est:<route>}:*), and the mock's ground truth reset.",
            f"Before every cell of a p95 mode the route's shared sample is emptied and refilled "
            f"with {ns.warmup} non-streamed replies (mock pace 0, same length distribution and "
            "cap) on a separate warm-up tenant; within the cell it keeps learning from the "
            "runs' completed (not truncated) streams. p95_before / p95_after show the drift.",
            "The mock runs at a higher CPU priority (mock_nice) so that, like a provider on "
            "its own hardware, it keeps its pace when the gateways load the machine; falling "
            "behind would make it send tokens in bursts when it catches up.",
            "A batch during which other processes took more than 25% of the machine is run "
            "again (at most --contended-retries times; the p95 sample keeps what the discarded "
            "attempt taught it); each tenant-run records other_processes_share and "
            "contended_retries.",
            "Tenant-runs of a cell go together while their clients' streams add up to at most "
            f"{ns.max_streams} (each run has its own tenants); otherwise one at a time. Clients "
            "that honour Retry-After keep far fewer streams flowing than they hold open: a "
            "tenant's budget fits about 30 p95 reservations at once.",
            "Clients (client): 'sdk' retries each request as the official openai SDK does "
            "(Retry-After / retry-after-ms when in (0, 120 s], else 0.5 s x 2^n capped at 8 s "
            "less 0-25%; 408/409/429/5xx and connection errors; x-should-retry obeyed) at most "
            "client_max_retries times, then counts it failed and sends a new one; 'patient' "
            "waits Retry-After (+0-20%) after every refusal and tries again. budget_exceeded "
            "ends a tenant-run either way.",
            "usable_before_first_refusal: the mock's prompt + completion tokens for the tenant, "
            "fetched (in the background) when any of its clients first got budget_busy, "
            "rate_limited, budget_exceeded or overloaded, over the budget. Queue wait: the "
            "x-hardcap-queue-wait-ms header of every answer (absent: 0), pooled per cell.",
        ],
        "cells": [],
    }
    if ns.resume:
        result["cells"] = resumable_cells(out, result["parameters"])
    done = {(c["mode"], c["concurrency"]) for c in result["cells"]}
    cells_plan = [c for c in cells_plan if (c[0].name, c[1]) not in done]
    all_batches = [(b, runs) for m, c, runs in cells_plan for b in batches_of(m, c, runs, ns)]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hardcap-overshoot-") as tmp_name:
        tmp = Path(tmp_name)
        with LocalValkey() as valkey:
            mock = stack.start_mock(tmp, pace_ms=ns.pace_ms, seed=ns.seed, nice=ns.mock_nice)
            result["parameters"]["mock_nice"] = stack.get_nice(mock.proc.pid)
            try:
                tenants = ns.tenants * max((runs for _, _, runs in cells_plan), default=1)
                data = build_config(mock.url, valkey.url, modes, tenants, window, gateway_cfg)
                with stack.gateways(data, ns.gateways, tmp) as gws, contextlib.ExitStack() as cx:
                    urls = [f"{g.url}/v1" for g in gws]
                    quota = None
                    if ns.gateway_cpu:
                        gw_pids = [g.proc.pid for g in gws]
                        quota = cx.enter_context(starve.gateway_quota(gw_pids, ns.gateway_cpu))
                        result["parameters"]["gateway_cgroup"] = quota.settings()
                    pids = {
                        **pids_of([mock, *gws]),
                        "valkey": valkey.proc.pid if valkey.proc else 0,
                    }
                    bar = tqdm(total=sum(len(b.tenants) for b, _ in all_batches), unit="tenant-run")
                    logs = LogWatch([g.log for g in gws])
                    target = Target(urls, mock.url, valkey.url, pids, bar)
                    for mode, conc, runs in cells_plan:
                        cell = run_cell(ns, mode, conc, runs, target)
                        cell["gateway_log"] = logs.new_entries()
                        if quota is not None:
                            cell["gateway_cgroup_throttling"] = quota.mark()
                        result["cells"].append(cell)
                        write_json(out, result)
                    bar.close()
            finally:
                mock.stop()
                if ns.keep_logs:
                    ns.keep_logs.mkdir(parents=True, exist_ok=True)
                    for log in tmp.glob("*.log"):
                        shutil.copy(log, ns.keep_logs / log.name)
    return finish(result, out, started, check, print_summary, ns.check)


def print_summary(result: dict[str, Any], out: Path) -> None:
    print(f"\nwrote {out} in {result['seconds']} s")
    for c in result["cells"]:
        s = c["summary"]
        print(
            f"{c['mode']:>20} x{c['concurrency']:<4}"
            f" worst {s['worst_overshoot_ground_truth']:+.4%}"
            f" mean {s['mean_overshoot_ground_truth']:+.4%}"
            f" ledger {s['worst_overshoot_ledger']:+.4%}"
            f" usable {s['usable_mean']:.2%} busy {s['busy_per_tenant']:.0f}"
            f" truncated {s['truncated_per_tenant']:.1f} left {s['reserved_left_max']}"
            f" errors {s['errors']}"
            f" before-refusal {_share(s.get('usable_before_refusal_mean'))}"
            f" (min {_share(s.get('usable_before_refusal_min'))})"
            f" failed {s.get('failed_per_tenant', 0):.1f}"
            f" queue p50/p99 {s.get('queue_wait_p50_ms')}/{s.get('queue_wait_p99_ms')} ms"
        )
    print("check:", result["check"])


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.2%}"


if __name__ == "__main__":
    sys.exit(main())
