"""Tools counted against what the provider bills, per group: definitions, calls, results.

For each agent-style request of the input corpus (``tests/input_shapes.py``) and each public
encoding (o200k_base, cl100k_base): the exact count of a route with that tokenizer
(:class:`~hardcap_core.tokenize.counters.BpeCounter`) for what each group adds to a request,
and what the mock upstream bills for it (``hardcap_core/local/mock_billing.py``: OpenAI's
cookbook rule or the namespace OpenAI renders tools into, whichever is more). ``before`` is
the same walk counting tools by their JSON, as the gateway did before
:mod:`hardcap_core.wire.openai_tools`. Every ratio must be >= 1; the target is <= 1.10.

    python -m bench tool_counts            # table + result file
    python -m bench tool_counts --check    # exit 1 if a ratio < 1 or > 1.10
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.budget.input_shapes import shape
from bench.lib.machine import ROOT, machine_info, write_json
from hardcap_core.local import mock_billing
from hardcap_core.tokenize import vocabularies
from hardcap_core.tokenize.counters import text_counter
from hardcap_core.wire.openai_input import exact_input_tokens

RESULT = ROOT / "bench" / "results" / "tool-counts.json"
ENCODINGS = ("o200k_base", "cl100k_base")
TARGET = 1.10
SHAPES = (
    "tools + functions",
    "tool-call history",
    "agent: 24 tools, nested schemas and enums",
    "agent: parallel tool calls",
    "agent: long tool results",
)


def groups(body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each group the body has, with the body less that group."""
    if body.get("tools") or body.get("functions"):
        drop = ("tools", "functions", "tool_choice")
        yield "definitions", {k: v for k, v in body.items() if k not in drop}
    messages = body["messages"]
    if any(m.get("tool_calls") for m in messages):
        less = [{k: v for k, v in m.items() if k != "tool_calls"} for m in messages]
        yield "calls", {**body, "messages": less}
    if any(m["role"] == "tool" for m in messages):
        yield "results", {**body, "messages": [m for m in messages if m["role"] != "tool"]}


def measure(name: str, encoding: str) -> list[dict[str, Any]]:
    body = json.loads(shape(name))
    text = text_counter(encoding)
    bill: Callable[[dict[str, Any]], int] = mock_billing.prompt_tokens

    def after(b: dict[str, Any]) -> int:
        return exact_input_tokens(b, text, openai_tools=True)

    def before(b: dict[str, Any]) -> int:
        return exact_input_tokens(b, text)

    rows = []
    for group, less in [("whole request", {"messages": []}), *groups(body)]:
        if group == "whole request":
            counted, old, billed = after(body), before(body), bill(body)
        else:
            counted, old = after(body) - after(less), before(body) - before(less)
            billed = bill(body) - bill(less)
        rows.append({
            "shape": name, "encoding": encoding, "group": group, "billed": billed,
            "counted": counted, "ratio": round(counted / billed, 3),
            "before": old, "before_ratio": round(old / billed, 3),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--check", action="store_true", help="exit 1 if a ratio is off target")
    args = parser.parse_args(argv)

    rows = []
    for encoding in ENCODINGS:
        # The mock bills in cl100k_base; for o200k_base its rules run with that encoding.
        mock_billing._encoding = lambda e=encoding: vocabularies.encoding(e)  # type: ignore[assignment]
        rows += [row for name in SHAPES for row in measure(name, encoding)]
    print(f"{'shape':<42} {'encoding':<12} {'group':<14} {'billed':>7} {'counted':>8} "
          f"{'ratio':>6} {'before':>7}")  # fmt: skip
    for r in rows:
        print(
            f"{r['shape']:<42} {r['encoding']:<12} {r['group']:<14} {r['billed']:>7} "
            f"{r['counted']:>8} {r['ratio']:>6.3f} {r['before_ratio']:>7.3f}"
        )
    ratios = [r["ratio"] for r in rows]
    off = [r for r in rows if not 1 <= r["ratio"] <= TARGET]
    print(f"ratio min {min(ratios):.3f} max {max(ratios):.3f}; off target: {len(off)}")
    write_json(
        args.out,
        {
            "benchmark": "tool-counts",
            "command": "python -m bench tool_counts "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "billed_by": "hardcap_core/local/mock_billing.py (OpenAI's cookbook rule or its "
            "namespace rendering, whichever is more)",
            "machine": machine_info(),
            "rows": rows,
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "off_target": [f"{r['shape']} / {r['encoding']} / {r['group']}" for r in off],
        },
    )
    print(f"wrote {args.out}")
    return 1 if args.check and off else 0


if __name__ == "__main__":
    raise SystemExit(main())
