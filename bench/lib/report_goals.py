"""The report's goals table: the published goals against what the result files say.

The budget goals are the project's, over every cell of the overshoot sweep (each row names the
worst cell it found): worst ground-truth overshoot <= +0.03% in every truncating cell, >= 99%
of the budget usable and >= 95% spent before the first refusal, budget_busy <= 0.1x the
max_tokens mode at the same concurrency, <= 1.5 cut streams per tenant at the top
concurrency. A value an older result file lacks shows as a dash.
"""

from __future__ import annotations

from typing import Any

from bench.lib.report_format import failed, ms, num, pct, queue_wait, share

TRUNCATING = ("max_tokens", "max_tokens_whole", "p95_truncate", "p95_truncate_whole")
HEAD_MODE = "p95_truncate"  # the mode the budget goals are about (the product's default)
Goal = tuple[str, str, str, bool | None]


def goals_table(shoot: dict[str, Any] | None, head: dict[str, Any] | None) -> str:
    """The published goals against what the result files say, met or missed."""
    rows: list[Goal] = []
    if shoot:
        rows += budget_goals(shoot["cells"])
    if head and head.get("added_latency"):
        sat = (head.get("saturation_hiredis") or {}).get("sustained_max_rate") or 0
        below = [a for a in head["added_latency"] if a["kind"] == "non_stream" and a["rate"] < sat]
        p50 = max((a["added_p50_ms"] for a in below), default=None)
        p99 = max((a["added_p99_ms"] for a in below), default=None)
        rows += [
            (
                "Added p50 below saturation (not streamed, worst rate)",
                "<= 1 ms",
                ms(p50),
                None if p50 is None else p50 <= 1.0,
            ),
            (
                "Added p99 below saturation (not streamed, worst rate)",
                "<= 2 ms",
                ms(p99),
                None if p99 is None else p99 <= 2.0,
            ),
            ("Saturation of one worker (hiredis)", "stated", f"{sat:,.0f} req/s sustained", None),
        ]
    lines = ["| Goal | Target | Measured | |", "|---|---|---|---|"]
    for goal, target, got, ok in rows:
        mark = "—" if ok is None else ("met" if ok else "**missed**")
        lines.append(f"| {goal} | {target} | {got} | {mark} |")
    return "\n".join(lines)


def budget_goals(cells: list[dict[str, Any]]) -> list[Goal]:
    """Issue 14's goals over the sweep: each row names the worst cell it found."""
    mine = sorted((c for c in cells if c["mode"] == HEAD_MODE), key=lambda c: c["concurrency"])
    top = max(c["concurrency"] for c in cells)
    rows = [_overshoot_goal(cells), _ledger_goal(cells)]
    if mine:
        rows += [_usable_goal(mine), _before_refusal_goal(mine), _busy_goal(cells, mine)]
        rows.append(_cut_goal(mine, top))
        rows += _stated_rows(mine)
    left = max(c["summary"]["reserved_left_max"] for c in cells)
    rows.append(("Reserved tokens left after traffic stops, every cell", "0", str(left), left == 0))
    return rows


def _where(c: dict[str, Any]) -> str:
    return f"{c['label']}, {c['concurrency']} streams"


def _overshoot_goal(cells: list[dict[str, Any]]) -> Goal:
    cut = [c for c in cells if _truncates(c)]
    t = max(cut, key=lambda c: c["summary"]["worst_overshoot_ground_truth"])
    w = t["summary"]["worst_overshoot_ground_truth"]
    return (
        "Worst ground-truth overshoot, every truncating cell",
        "<= +0.03%",
        f"{pct(w, 3)} ({t['summary']['worst_tokens_over_ground_truth']:+,} tok; {_where(t)})",
        w <= 0.0003,
    )


def _ledger_goal(cells: list[dict[str, Any]]) -> Goal:
    cut = [c for c in cells if _truncates(c)]
    t = max(cut, key=lambda c: c["summary"]["worst_overshoot_ledger"])
    w = t["summary"]["worst_overshoot_ledger"]
    where = f" ({_where(t)})" if w > 0 else " at most, every cell"
    return ("Ledger overshoot, every truncating cell", "0", f"{pct(w, 3)}{where}", w <= 0)


def _usable_goal(mine: list[dict[str, Any]]) -> Goal:
    t = min(mine, key=lambda c: c["summary"]["usable_mean"])
    s = t["summary"]
    low = min(c["summary"]["usable_min"] for c in mine)
    return (
        "Budget usable, p95 + truncate, every concurrency (mean per cell)",
        ">= 99%",
        f"{s['usable_mean'] * 100:.2f}% lowest mean ({t['concurrency']} streams); "
        f"worst tenant-run {low * 100:.2f}%",
        s["usable_mean"] >= 0.99,
    )


def _before_refusal_goal(mine: list[dict[str, Any]]) -> Goal:
    goal = "Budget spent before the first refusal, p95 + truncate, every concurrency (mean)"
    have = [c for c in mine if c["summary"].get("usable_before_refusal_mean") is not None]
    if not have:
        return (goal, ">= 95%", "— (not measured in this run)", None)
    t = min(have, key=lambda c: c["summary"]["usable_before_refusal_mean"])
    s = t["summary"]
    low = min(c["summary"]["usable_before_refusal_min"] for c in have)
    missing = "" if len(have) == len(mine) else f"; {len(mine) - len(have)} cells not measured"
    return (
        goal,
        ">= 95%",
        f"{share(s['usable_before_refusal_mean'])} lowest mean ({t['concurrency']} streams); "
        f"worst tenant-run {share(low)}{missing}",
        s["usable_before_refusal_mean"] >= 0.95 if not missing else None,
    )


def _busy_goal(cells: list[dict[str, Any]], mine: list[dict[str, Any]]) -> Goal:
    """p95 + truncate's budget_busy against max_tokens mode's at the same concurrency."""
    goal = "budget_busy per tenant, p95 + truncate vs max_tokens mode, same concurrency"
    ref = {
        c["concurrency"]: c["summary"]["busy_per_tenant"]
        for c in cells
        if c["mode"] == "max_tokens"
    }
    pairs = [(c, ref[c["concurrency"]]) for c in mine if c["concurrency"] in ref]
    if not pairs:
        return (goal, "<= 0.1x", "— (no max_tokens cell)", None)

    def ratio(busy: float, base: float) -> float:
        return busy / base if base > 0 else (0.0 if busy == 0 else float("inf"))

    c, base = max(pairs, key=lambda p: ratio(p[0]["summary"]["busy_per_tenant"], p[1]))
    busy = c["summary"]["busy_per_tenant"]
    r = ratio(busy, base)
    shown = "∞" if r == float("inf") else f"{r:.2f}x"
    return (
        goal,
        "<= 0.1x",
        f"{shown} worst ({num(busy, 0)} vs {num(base, 0)}, {c['concurrency']} streams)",
        r <= 0.1,
    )


def _cut_goal(mine: list[dict[str, Any]], top: int) -> Goal:
    goal = f"Cut (truncated) streams per tenant, p95 + truncate, {top} streams"
    at = [c for c in mine if c["concurrency"] == top]
    if not at:
        return (goal, "<= 1.5", "— (no cell)", None)
    cut = at[0]["summary"]["truncated_per_tenant"]
    return (goal, "<= 1.5", num(cut), cut <= 1.5)


def _stated_rows(mine: list[dict[str, Any]]) -> list[Goal]:
    """No target in the issue, but what a client lives with: stated, not judged."""
    rows: list[Goal] = []
    sdk = [c for c in mine if c.get("client") == "sdk"]
    if sdk:
        t = max(sdk, key=lambda c: c["summary"].get("failed_per_tenant", 0))
        rows.append(
            (
                "Requests failed per tenant, SDK-like client (max_retries 2), p95 + truncate",
                "stated",
                f"{failed(t)} worst ({t['concurrency']} streams)",
                None,
            )
        )
    waits = [c for c in mine if c["summary"].get("queue_wait_p99_ms") is not None]
    if waits:
        t = max(waits, key=lambda c: c["summary"]["queue_wait_p99_ms"])
        rows.append(
            (
                "Admission queue wait p50 / p99, p95 + truncate",
                "stated",
                f"{queue_wait(t['summary'])} worst p99 ({t['concurrency']} streams)",
                None,
            )
        )
    return rows


def _truncates(c: dict[str, Any]) -> bool:
    return bool(c.get("truncates", c["mode"] in TRUNCATING))
