"""bench/cost/lambda_cost.py's A/B side: a gateway from another commit measured beside the first in
the same run (``--base-tree REV``, rounds alternating which goes first), latency read by wrk (a
C load generator) at one connection beside the raw-socket client's (``--wrk-seconds``), and the
figures each gateway adds over the direct call, medians over rounds (:func:`ab_summary`)."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from bench.cost.lambda_cost_requests import body_bytes
from bench.lib.wrk_run import Target, problems, run_wrk
from bench.speed.wrk_overhead import export_tree, tree_env

SHAPES = ("non_stream", "stream")


def variants(
    ns: argparse.Namespace, tmp: Path
) -> list[tuple[str, dict[str, str], dict[str, str] | None]]:
    """(name, environment, tree) of each gateway to measure: ``gateway`` (the checkout, or
    ``--gateway-tree``'s export) and, with ``--base-tree``, ``gateway_base``."""
    out: list[tuple[str, dict[str, str], dict[str, str] | None]] = []
    for name, rev in (("gateway", ns.gateway_tree), ("gateway_base", ns.base_tree)):
        if rev:
            tree = export_tree(rev, tmp / f"{name}-tree")
            out.append((name, tree_env(tree), tree))
        elif name == "gateway":
            out.append((name, {}, None))
    return out


def write_bodies(tmp: Path, tokens: int) -> dict[tuple[str, str], Path]:
    """wrk's request bodies: (model, shape) -> file; a 1-token reply, a ``tokens`` stream."""
    out = {}
    for model in ("cost", "mock-small"):
        for shape, n, stream in (("non_stream", 1, False), ("stream", tokens, True)):
            path = tmp / f"wrk-{model}-{shape}.json"
            path.write_bytes(body_bytes(model, n, stream))
            out[(model, shape)] = path
    return out


def wrk_latency(
    url: str,
    pid: int,
    key: str | None,
    model: str,
    bodies: dict[tuple[str, str], Path],
    seconds: float,
) -> dict[str, Any]:
    """``wrk -c1 -t1`` for ``seconds`` per shape, requests back to back: latency to the last
    byte (ms) and every error wrk saw."""
    out: dict[str, Any] = {}
    for shape in SHAPES:
        target = Target(model, f"{url}/v1/chat/completions", pid, model, model, key)
        res = run_wrk(target, bodies[(model, shape)], connections=1, threads=1, seconds=seconds)
        lat = res.get("latency_us") or {}
        out[shape] = {
            "requests": res.get("requests"),
            "problems": problems(res),
            **{f"{n}_ms": round(lat[q] / 1000, 3) for q, n in
               (("50", "p50"), ("90", "p90"), ("99", "p99"), ("mean", "mean")) if q in lat},
        }  # fmt: skip
    return out


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return round(statistics.median(got), 3) if got else None


def _get(row: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        row = row[key]
    return row


# name in the summary: a dotted path into a memory size's row, and into the run's "direct"
# (which has no requests after idle: its back-to-back ones stand for them; the direct call
# waits for no quota). ttlb_s_median is in seconds.
ADDED = {
    "non_streamed_back_to_back_added_p50_ms": "non_streamed.wall_ms_p50",
    "non_streamed_back_to_back_added_p99_ms": "non_streamed.wall_ms_p99",
    "non_streamed_after_idle_added_p50_ms": "non_streamed_isolated.wall_ms_p50",
    "non_streamed_after_idle_added_p99_ms": "non_streamed_isolated.wall_ms_p99",
    "stream_short_added_first_byte_p50_ms": "stream_short.ttfb_ms_p50",
    "stream_short_added_last_byte_p50_ms": "stream_short.wall_ms_p50",
    "paced_added_first_byte_ms": "paced.ttfb_ms_median",
    "paced_added_last_byte_ms": "paced.ttlb_s_median",
    "paced_added_gap_p99_ms": "paced.gap_ms_p99",
    "paced_fast_added_first_byte_ms": "paced_fast.ttfb_ms_median",
    "paced_fast_added_last_byte_ms": "paced_fast.ttlb_s_median",
    "paced_fast_added_gap_p99_ms": "paced_fast.gap_ms_p99",
}
OWN = {
    "cpu_ms_per_request": "non_streamed.cpu_ms_per_request",
    "cpu_us_per_relayed_token": "cpu_us_per_relayed_token",
    "seconds_to_healthz": "start.seconds_to_healthz",
}
CHECKED = ("non_streamed", "non_streamed_isolated", "stream_short", "stream_long", "paced",
           "paced_fast")  # fmt: skip


def ab_summary(result: dict[str, Any]) -> dict[str, Any]:
    """Per gateway and memory size, medians over rounds: what it adds over the direct call
    (the raw-socket client's figures against its direct blocks, pooled; wrk's against wrk's
    direct blocks, their median), its CPU and its start."""
    d, dw = result["direct"], result.get("direct_wrk") or []
    out: dict[str, Any] = {}
    for m0 in result["memory_sizes"]:
        key = f"{m0['variant']}@{m0['memory_mb']}MB"
        if key in out:
            continue
        rows = [m for m in result["memory_sizes"]
                if (m["variant"], m["memory_mb"]) == (m0["variant"], m0["memory_mb"])]  # fmt: skip
        s: dict[str, Any] = {"rounds": len(rows), "tree": m0.get("tree")}
        s["client"] = "tests/load/http1.py (raw sockets, one request in flight)"
        for name, path in ADDED.items():
            scale = 1e3 if path.endswith("_s_median") else 1.0
            base = _get(d, path.replace("non_streamed_isolated", "non_streamed")) * scale
            s[name] = _median([_get(r, path) * scale - base for r in rows])
        for name, path in OWN.items():
            s[name] = _median([_get(r, path) for r in rows])
        s["failures"] = sum(r[k]["failures"] for r in rows for k in CHECKED)
        if dw and all("wrk" in r for r in rows):
            s["wrk_client"] = "wrk -c1 -t1, back to back, to the last byte"
            for shape in SHAPES:
                for q in ("p50", "p99", "mean"):
                    base = _median([b[shape].get(f"{q}_ms") for b in dw])
                    s[f"wrk_{shape}_added_{q}_ms"] = (
                        None if base is None
                        else _median([r["wrk"][shape][f"{q}_ms"] - base for r in rows])
                    )  # fmt: skip
            s["wrk_problems"] = [r["wrk"][k]["problems"] for r in rows for k in SHAPES
                                 if r["wrk"][k]["problems"]]  # fmt: skip
        out[key] = s
    return out


def print_ab(ab: dict[str, Any]) -> None:
    skip = ("tree", "client", "wrk_client", "wrk_problems")
    keys = list(dict.fromkeys(k for s in ab.values() for k in s if k not in skip))
    names = list(ab)
    print(f"\n{'':46}" + "".join(f"{n:>24}" for n in names))
    for k in keys:
        print(f"{k:46}" + "".join(f"{ab[n].get(k)!s:>24}" for n in names))
