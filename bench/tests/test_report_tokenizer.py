"""The exact-count cost table comes from tokenizer-cost.json: each prompt of the result is a row
with its bound and each counter's extra CPU, and the cold start's vocabulary load is shown per
tokenizer, so a rerun changes the page and nothing is left typed by hand."""

from __future__ import annotations

from typing import Any

from bench.lib.report_tokenizer import tokenizer_table


def _prompt(
    name: str, bound: float, o200k: float, cl100k: float, anthropic: float
) -> dict[str, Any]:
    return {
        "prompt": name,
        "bound_us": bound,
        "o200k_base_extra_us": o200k,
        "cl100k_base_extra_us": cl100k,
        "anthropic_extra_us": anthropic,
    }


RESULT: dict[str, Any] = {
    "per_request": [
        _prompt("prose 500", 76.243, 86.824, 141.155, 191.399),
        _prompt("code 16000", 2126.028, 4159.4, 6075.6, 7590.2),
    ],
    "cold_start": {
        "o200k_base": {"import_app_ms": 317.7, "load_vocabulary_ms": 309.1, "first_count_ms": 0.2},
    },
}


def test_each_prompt_is_a_row_of_rounded_microseconds() -> None:
    lines = tokenizer_table(RESULT).splitlines()
    assert lines[2:4] == [
        "| prose, 500 tokens | 76 | 87 | 141 | 191 |",
        "| code, 16,000 tokens | 2,126 | 4,159 | 6,076 | 7,590 |",
    ]


def test_the_cold_start_row_names_the_vocabulary_load() -> None:
    text = tokenizer_table(RESULT)
    assert "| o200k_base | 318 | 309 | 0.2 |" in text.splitlines()
    assert "cold start" not in tokenizer_table({"per_request": RESULT["per_request"]})
