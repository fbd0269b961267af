"""The input bound against a real bill, per request shape (bench/budget/input_estimate.py's
result), generated so docs/design.md cannot drift from bench/results/input-estimate.json."""

from __future__ import annotations

from typing import Any

from bench.lib.report_format import num


def input_estimate_table(data: dict[str, Any]) -> str:
    rows = [
        "| shape | body bytes | estimate | billed | ratio | parse + estimate ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        rows.append(
            f"| {r['shape']} | {num(r['body_bytes'], 0)} | {num(r['estimate'], 0)} "
            f"| {num(r['billed'], 0)} | {r['ratio']:.2f} | {num(r['parse_ms'], 2)} |"
        )
    below = data.get("below_one") or []
    rows += [
        "",
        f"Billed with {data['tokenizer']}. Ratio (estimate / billed): lowest "
        f"{data['ratio_min']:.2f}, highest {data['ratio_max']:.2f}; "
        + (f"**below 1: {', '.join(map(str, below))}**." if below else "none below 1."),
    ]
    return "\n".join(rows)
