"""The README's headline numbers: a few rows, each from the same result file as the long tables
in docs/benchmarks.md, so the front door and the details cannot disagree."""

from __future__ import annotations

from typing import Any

from bench.lib.report_format import num, pct


def _overshoot(data: dict[str, Any]) -> list[str]:
    cells = data.get("cells") or []
    if not cells:
        return []
    top = max(c["concurrency"] for c in cells)
    truncate = [c for c in cells if c["mode"] == "p95_truncate" and c["concurrency"] == top]
    if not truncate:
        return []
    s = truncate[0]["summary"]
    return [
        f"| Worst overshoot past a budget, default mode, {top} streams per tenant "
        f"| {pct(s['worst_overshoot_ground_truth'])} "
        "| `bench/results/overshoot.json` |"
    ]


def _wrk(data: dict[str, Any]) -> list[str]:
    g = (data.get("summary") or {}).get("gateway") or {}
    if g.get("added_p50_ms") is None:
        return []
    return [
        f"| Added latency p50 / p99, one worker, not streamed "
        f"| +{g['added_p50_ms']:.2f} / +{g['added_p99_ms']:.2f} ms "
        "| `bench/results/wrk-overhead.json` |",
        "| Gateway CPU per request, one worker "
        f"| {num(g.get('sat_target_cpu_us_per_request'), 0)} µs "
        "| `bench/results/wrk-overhead.json` |",
    ]


def _lambda_share(data: dict[str, Any]) -> list[str]:
    """Two rows: an environment that is not busy (a request after an idle pause: the CPU quota
    has refilled), then one serving requests back to back (the quota runs out)."""
    summary = data.get("summary") or {}
    p = data.get("parameters") or {}
    rows = []
    for kind, who in (
        ("non_stream_after_idle", "an environment that is not busy"),
        ("non_stream", "requests back to back"),
    ):
        s = summary.get(kind) or {}
        if s.get("added_p50_ms") is None:
            continue
        rows.append(
            f"| Added latency p50 / p99 under Lambda's CPU share ({p.get('memory_mb', '?')} MB), "
            f"cache 0.5 ms away, not streamed, {who} "
            f"| +{num(s['added_p50_ms'], 2)} / +{num(s['added_p99_ms'], 2)} ms, "
            f"{num(s.get('gateway_cpu_ms_per_request'), 2)} ms CPU per request "
            "| `bench/results/lambda-share.json` |"
        )
    return rows


def _failover(data: dict[str, Any]) -> list[str]:
    kill = data["phase_kill"]
    return [
        "| Streams failed when the primary upstream is killed under load "
        f"| {kill['all']['failed']:,} of {kill['all']['requests']:,} (all in flight on it); "
        f"{kill['sent_after_kill']['failed']:,} of {kill['sent_after_kill']['requests']:,} sent "
        "after the kill "
        "| `bench/results/failover.json` |"
    ]


def headline_table(results: dict[str, dict[str, Any]]) -> str:
    """``results``: result file name -> its JSON, for the files present and not refused."""
    rows = ["| What | Measured | Result |", "|---|---|---|"]
    for name, make in (
        ("overshoot.json", _overshoot),
        ("wrk-overhead.json", _wrk),
        ("lambda-share.json", _lambda_share),
        ("failover.json", _failover),
    ):
        if name in results:
            rows += make(results[name])
    rows += [
        "",
        "Every number's command, result file and commit: [bench/README.md](bench/README.md); "
        "the full tables: [docs/benchmarks.md](docs/benchmarks.md).",
    ]
    return "\n".join(rows)
