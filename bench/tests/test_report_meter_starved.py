"""The starved-machine meter table comes from the overshoot-starved*.json results: a row per
meter in the order they were built, its worst overshoot against ground truth, the budget used,
and the commit it ran (a run from uncommitted changes says so); a missing result is no row."""

from __future__ import annotations

from typing import Any

from bench.lib.report_meter_starved import meter_starved_table


def _run(commit: str, dirty: bool, worst: float, tokens: int, usable: float) -> dict[str, Any]:
    return {
        "machine": {"git_commit": commit, "git_dirty": dirty},
        "cells": [
            {
                "summary": {
                    "worst_overshoot_ground_truth": worst,
                    "worst_tokens_over_ground_truth": tokens,
                    "usable_mean": usable,
                }
            }
        ],
    }


def test_each_meter_is_a_row_with_its_commit() -> None:
    results = {
        "overshoot-starved.json": _run("25ebbd3774da", True, -0.00045, -9, 0.998547),
        "overshoot-starved-before.json": _run("87af4443c03c", False, 0.0089, 178, 0.999616),
    }
    assert meter_starved_table(results).splitlines()[2:] == [
        "| largest read lately + speed \N{MULTIPLICATION SIGN} 50 ms (until Nov 29) "
        "| +0.890% (+178 tokens) | 99.96% "
        "| `bench/results/overshoot-starved-before.json` (`87af444`) |",
        "| both (current) | -0.045% (-9 tokens) | 99.85% "
        "| `bench/results/overshoot-starved.json` (`25ebbd3`, uncommitted changes) |",
    ]
