"""Whether a tokens-per-minute limit holds a minute: the worst sliding 60 s window of one tenant.

One tenant with ``rate_limits.tokens_per_minute`` (default 20,000) and a budget far above what
it can spend runs ``--streams`` streams (default 128) round-robin over ``--gateways`` gateway
processes (default 3) sharing one Valkey, for ``--seconds`` (default 180; ``--quick`` 70). Its
clients retry a 429 after its Retry-After, as the official SDKs do. Ground truth is the mock's
timeline (GET /mock/timeline: the tenant's prompt tokens when each request was received and
its completion tokens as they were generated, per 100 ms): the most tokens in any 60 s of
consecutive slots, against the limit (goal: at most +1%).

``--gateway-root`` runs the gateways from another checkout (its code and Lua scripts) while the
mock and the load generator stay this one's: the 'before' of a change to the limit.

    python -m bench tpm_window --quick
    python -m bench tpm_window \
        --gateway-root /work/main --out bench/results/tpm-window-before.json
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.budget.budget_runs import (
    MAX_TOKENS,
    MODES,
    build_config,
    choose_window,
    reset_estimator,
    warm_up,
)
from bench.lib import stack
from bench.lib.machine import machine_info, write_json
from hardcap_core.local import stack as local_stack
from hardcap_core.local.valkey import LocalValkey
from tests.load.harness import drive_tenant, usage_rows

RESULTS = Path(__file__).resolve().parents[1] / "results"
TENANT = "t0"
BUDGET = 10**10  # far above what the tenant can spend: only the rate limit refuses
GOAL = 0.01


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a 70 s run")
    p.add_argument("--seconds", type=float, default=180.0, help="how long the clients run")
    p.add_argument("--tpm", type=int, default=20_000, help="the tenant's tokens_per_minute")
    p.add_argument("--streams", type=int, default=128, help="the tenant's streams at once")
    p.add_argument("--gateways", type=int, default=3, help="gateway processes")
    p.add_argument("--mode", default="p95_truncate", choices=sorted(MODES), help="the route")
    p.add_argument("--warmup", type=int, default=500, help="replies that warm a p95 route")
    p.add_argument("--pace-ms", type=float, default=10.0, help="mock ms per token (10 = 100/s)")
    p.add_argument("--seed", type=int, default=14)
    p.add_argument("--mock-nice", type=int, default=-10, help="mock CPU priority (0: as others)")
    p.add_argument("--gateway-root", type=Path, help="run the gateways from this checkout")
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/tpm-window.json)")
    ns = p.parse_args(argv)
    if ns.quick:
        ns.seconds = 70.0
    return ns


def _commit(root: Path) -> str:
    """The commit the gateways run (they may run from another checkout than the bench)."""
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True)
    return done.stdout.decode().strip()


def windows(timeline: dict[str, Any], tpm: int, started_ms: int) -> dict[str, Any]:
    """The worst window (and the first minute's tokens) of the mock's timeline, against tpm."""
    worst = timeline["worst_60s"]
    rows = timeline["rows"]
    first = sum(p + c for t, p, c in rows if started_ms <= t < started_ms + 60_000)
    return {
        "worst_60s_tokens": worst["tokens"],
        "worst_60s_start_s": round((worst["start_ms"] - started_ms) / 1000, 1),
        "worst_60s_over_limit": round(worst["tokens"] / tpm - 1, 6),
        "worst_60s_upper_bound_tokens": worst["bound"],
        "first_60s_tokens": first,
        "total_tokens": sum(p + c for _, p, c in rows),
        "slot_ms": timeline["slot_ms"],
    }


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop every child process
    out = ns.out or RESULTS / ("tpm-window-quick.json" if ns.quick else "tpm-window.json")
    mode = MODES[ns.mode]
    gateway_cfg: dict[str, Any] = {"reservation_ttl_seconds": 120}
    window = choose_window(ns.seconds + 600)
    result: dict[str, Any] = {
        "benchmark": "tpm_window",
        "command": "python -m bench tpm_window " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine_info(),
        "parameters": {
            "tokens_per_minute": ns.tpm,
            "budget_tokens": BUDGET,
            "budget_window": window,
            "streams": ns.streams,
            "gateway_processes": ns.gateways,
            "gateway_root": str(ns.gateway_root or stack.ROOT),
            "gateway_commit": _commit(ns.gateway_root or stack.ROOT),
            "seconds": ns.seconds,
            "route": {"name": mode.name, "label": mode.label, **mode.route},
            "max_tokens": MAX_TOKENS,
            "p95_warmup_replies": ns.warmup if mode.learns_p95 else 0,
            "mock_pace_ms": ns.pace_ms,
            "mock_seed": ns.seed,
            "client_retry": "Retry-After (retry-after-ms) x uniform(1.0, 1.2)",
        },
        "notes": [
            "Ground truth: the mock's per-tenant timeline in 100 ms slots (prompt tokens when a "
            "request is received, completion tokens as generated). worst_60s_tokens is the most "
            "in any 600 consecutive slots; worst_60s_upper_bound_tokens the most in 601, which "
            "bounds a window starting anywhere inside a slot. worst_60s_start_s is the start of "
            "the first such window, in seconds after the clients started (negative: it began "
            "before the first tokens).",
            "The tenant's budget is far above what it can spend; the warm-up tenants (a p95 "
            "route's sample) have no rate limit and run before the measured window.",
        ],
    }
    with tempfile.TemporaryDirectory(prefix="hardcap-tpm-") as tmp_name:
        tmp = Path(tmp_name)
        with LocalValkey() as valkey:
            mock = stack.start_mock(tmp, pace_ms=ns.pace_ms, seed=ns.seed, nice=ns.mock_nice)
            result["parameters"]["mock_nice"] = stack.get_nice(mock.proc.pid)
            try:
                data = build_config(mock.url, valkey.url, [mode], 1, window, gateway_cfg)
                data["tenants"][0]["budgets"][0]["limit"] = BUDGET
                data["tenants"][0]["rate_limits"] = {"tokens_per_minute": ns.tpm}
                launch = stack._gateway_launch(hiredis=True, fast_server=True, log_level="WARNING")
                if ns.gateway_root:
                    root = ns.gateway_root.resolve()
                    launch["env"] = {**launch["env"], "PYTHONPATH": str(root)}
                    launch["cwd"] = root
                with local_stack.gateways(data, ns.gateways, tmp, **launch) as gws:
                    urls = [f"{g.url}/v1" for g in gws]
                    if mode.learns_p95:
                        reset_estimator(valkey.url, mode.name)
                        asyncio.run(warm_up(urls, mode, ns.warmup))
                    httpx.post(f"{mock.url}/mock/reset", timeout=10).raise_for_status()
                    started_ms = int(time.time() * 1000)
                    run = asyncio.run(
                        drive_tenant(
                            urls,
                            stack.tenant_key(TENANT),
                            TENANT,
                            concurrency=ns.streams,
                            model=mode.name,
                            max_tokens=MAX_TOKENS,
                            time_limit_s=ns.seconds,
                            seed=ns.seed,
                        )
                    )
                    timeline = httpx.get(
                        f"{mock.url}/mock/timeline", params={"tenant": TENANT}, timeout=30
                    ).json()
                    ledger = [
                        r
                        for r in usage_rows(urls[0], stack.tenant_key(TENANT))
                        if r["id"] == TENANT
                    ]
            finally:
                mock.stop()
    truth = windows(timeline, ns.tpm, started_ms)
    result["ground_truth"] = truth
    result["ledger"] = {"used": ledger[0]["used"], "reserved": ledger[0]["reserved"]}
    result["client"] = run.as_json()
    result["goal"] = {"max_over_limit": GOAL, "met": truth["worst_60s_over_limit"] <= GOAL}
    result["timeline"] = timeline["rows"]
    write_json(out, result)
    print(
        f"worst 60 s: {truth['worst_60s_tokens']} tokens of {ns.tpm} "
        f"({truth['worst_60s_over_limit']:+.2%}); first 60 s: {truth['first_60s_tokens']}; "
        f"rate_limited {run.rate_limited}, completed {run.completed}, truncated {run.truncated}"
        f" -> {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
