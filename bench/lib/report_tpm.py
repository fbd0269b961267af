"""The tokens-per-minute table (bench/budget/tpm_window.py's result, and the run of the checkout
before the sliding window), generated so docs/benchmarks.md cannot drift from the JSON."""

from __future__ import annotations

from typing import Any

from bench.lib.report_format import num, pct

# What each file measured: the limiter of the checkout it ran against (its commit is in the JSON).
LIMITERS = (
    ("tpm-window-before.json", "token bucket"),
    ("tpm-window.json", "sliding window over reservations"),
)


def _row(name: str, limiter: str, data: dict[str, Any]) -> str:
    g, client = data["ground_truth"], data["client"]
    commit = (data["parameters"].get("gateway_commit") or "unknown")[:7]
    over = pct(g["worst_60s_over_limit"])
    if g["worst_60s_over_limit"] > data["goal"]["max_over_limit"]:
        over = f"**{over}**"
    return (
        f"| {limiter} (`{commit}`, `bench/results/{name}`) | {num(g['worst_60s_tokens'], 0)} "
        f"| {over} | {num(g['first_60s_tokens'], 0)} | {num(data['ledger']['used'], 0)} "
        f"| {num(client['rate_limited'], 0)} | {num(client['truncated'], 0)} |"
    )


def tpm_table(results: dict[str, dict[str, Any]]) -> str:
    """``results``: result file name -> its JSON (the files present and not refused); a row each,
    then the run's average against the limit for the newest."""
    rows = [
        "| | worst 60 s window (mock) | vs the limit | first 60 s | ledger total | rate_limited "
        "| cut streams |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    rows += [_row(name, label, results[name]) for name, label in LIMITERS if name in results]
    now = results.get("tpm-window.json")
    if now:
        p, g = now["parameters"], now["ground_truth"]
        per_minute = g["total_tokens"] / p["seconds"] * 60
        rows += [
            "",
            f"Over the whole run the {LIMITERS[1][1]} let the tenant through "
            f"{num(g['total_tokens'], 0)} tokens: {per_minute / p['tokens_per_minute'] * 100:.0f}% "
            "of its limit on average.",
        ]
    return "\n".join(rows)
