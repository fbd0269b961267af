"""The exact input count's cost per request and at cold start (bench/speed/tokenizer_cost.py's
result), generated so docs/benchmarks.md cannot drift from bench/results/tokenizer-cost.json."""

from __future__ import annotations

from typing import Any

from bench.lib.report_format import num

# The exact counters beside the bound, as tokenizer_cost.py names them, with their column label.
COUNTERS = (
    ("o200k_base", "+ o200k_base µs"),
    ("cl100k_base", "+ cl100k_base µs"),
    ("anthropic", "+ anthropic (calibrated) µs"),
)


def _prompt(name: str) -> str:
    """'prose 4000' as 'prose, 4,000 tokens'."""
    kind, _, size = name.partition(" ")
    return f"{kind}, {int(size):,} tokens" if size.isdigit() else name


def tokenizer_table(data: dict[str, Any]) -> str:
    rows = [
        "| prompt | bound µs | " + " | ".join(label for _, label in COUNTERS) + " |",
        "|---|---:|" + "---:|" * len(COUNTERS),
    ]
    for r in data["per_request"]:
        extra = " | ".join(num(r.get(f"{name}_extra_us"), 0) for name, _ in COUNTERS)
        rows.append(f"| {_prompt(r['prompt'])} | {num(r['bound_us'], 0)} | {extra} |")
    cold = data.get("cold_start") or {}
    if cold:
        rows += [
            "",
            "| cold start, CPU ms | import the app | load the vocabulary (first count) "
            "| the first count, once loaded |",
            "|---|---:|---:|---:|",
        ]
        for name, c in cold.items():
            rows.append(
                f"| {name} | {num(c['import_app_ms'], 0)} | {num(c['load_vocabulary_ms'], 0)} "
                f"| {num(c['first_count_ms'])} |"
            )
    return "\n".join(rows)
