"""The cut-stream charge table comes from cut-charge.json: a row per route and concurrency with
the error in tokens and as a share of what was generated, and an under-charged cut is bold."""

from __future__ import annotations

from typing import Any

from bench.lib.report_cut_charge import cut_charge_table


def _scenario(route: str, concurrency: int, under: int) -> dict[str, Any]:
    return {
        "route": route,
        "concurrency": concurrency,
        "summary": {
            "cut_streams": 8,
            "under_charged": under,
            "error_tokens": {"mean": 15.25, "p50": 13.0, "p95": 25.0, "max": 25.0, "min": -2.0},
            "error_fraction": {
                "mean": 0.0695,
                "p50": 0.05,
                "p95": 0.1475,
                "max": 0.1475,
                "min": -0.01,
            },
        },
    }


def test_each_scenario_is_a_row_and_an_under_charge_is_bold() -> None:
    result = {"scenarios": [_scenario("p95_truncate", 8, 0), _scenario("count_after", 32, 1)]}
    assert cut_charge_table(result).splitlines()[2:4] == [
        "| p95 + truncate \N{MULTIPLICATION SIGN} 8 | 8 | 0 | +15.2 / +13 / +25 / +25 / -2 "
        "| +7.0% / +5.0% / +14.8% / +14.8% / -1.0% |",
        "| count_after \N{MULTIPLICATION SIGN} 32 | 8 | **1** | +15.2 / +13 / +25 / +25 / -2 "
        "| +7.0% / +5.0% / +14.8% / +14.8% / -1.0% |",
    ]
