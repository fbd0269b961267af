"""The stream meter's bound on a starved machine, one run per meter (bench/budget/overshoot.py's
``overshoot-starved*.json``), generated so docs/design.md cannot drift from those results."""

from __future__ import annotations

from typing import Any

from bench.lib.report_format import pct

# Which meter each result ran, oldest first: the file names the run, the label what it measured.
METERS = (
    (
        "overshoot-starved-before.json",
        "largest read lately + speed \N{MULTIPLICATION SIGN} 50 ms (until Nov 29)",
    ),
    (
        "overshoot-starved-time-only.json",
        "in hand + speed \N{MULTIPLICATION SIGN} time since the read, no stall margin",
    ),
    ("overshoot-starved.json", "both (current)"),
)


def _commit(data: dict[str, Any]) -> str:
    m = data["machine"]
    dirty = ", uncommitted changes" if m.get("git_dirty") else ""
    return f"`{(m.get('git_commit') or 'unknown')[:7]}`{dirty}"


def meter_starved_table(results: dict[str, dict[str, Any]]) -> str:
    rows = ["| meter | worst | usable | result file |", "|---|---|---|---|"]
    for name, label in METERS:
        data = results.get(name)
        if not data:
            continue
        worst = max(data["cells"], key=lambda c: c["summary"]["worst_overshoot_ground_truth"])
        s = worst["summary"]
        tokens = s["worst_tokens_over_ground_truth"]
        usable = min(s["usable_mean"], 1.0) * 100
        rows.append(
            f"| {label} | {pct(s['worst_overshoot_ground_truth'], 3)} ({tokens:+,} tokens) "
            f"| {usable:.2f}% | `bench/results/{name}` ({_commit(data)}) |"
        )
    return "\n".join(rows)
