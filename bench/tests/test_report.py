"""bench/report.py turns result JSON into the same markdown every time, only between markers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import report


def _summary(worst: float, mean: float, usable: float, busy: float, cut: float) -> dict[str, Any]:
    return {
        "tenant_runs": 2,
        "worst_overshoot_ground_truth": worst,
        "mean_overshoot_ground_truth": mean,
        "worst_overshoot_ledger": worst,
        "worst_tokens_over_ground_truth": round(worst * 20_000),
        "usable_mean": usable,
        "usable_min": usable,
        "busy_per_tenant": busy,
        "truncated_per_tenant": cut,
        "reserved_left_max": 0,
        "errors": 0,
    }


def _cell(mode: str, label: str, concurrency: int, summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "mode": mode,
        "label": label,
        "concurrency": concurrency,
        "runs": 1,
        "tenants": 2,
        "summary": summary,
    }


OVERSHOOT: dict[str, Any] = {
    "complete": True,
    "machine": {"git_commit": "0123456789abcdef", "cpu_count": 2},
    "parameters": {"budget_tokens": 20_000, "gateway_processes": 3, "mock_pace_ms": 10.0},
    "cells": [
        _cell(
            "p95_truncate", "Reserve p95, truncate", 128, _summary(0.0003, -0.001, 0.99, 12, 1.5)
        ),
        _cell("count_after", "Count after the fact", 128, _summary(2.343, 2.1, 3.2, 0, 0)),
        _cell("count_after", "Count after the fact", 8, _summary(0.12, 0.1, 1.1, 0, 0)),
        _cell("p95_truncate", "Reserve p95, truncate", 8, _summary(-0.002, -0.003, 0.997, 1, 1)),
    ],
}
OVERHEAD: dict[str, Any] = {
    "complete": True,
    "machine": {"git_commit": "0123456789abcdef"},
    "parameters": {"stream_tokens": 20},
    "added_latency": [
        {
            "kind": "non_stream",
            "rate": 100.0,
            "direct_p50_ms": 1.0,
            "direct_p99_ms": 2.0,
            "gateway_p50_ms": 1.8,
            "gateway_p99_ms": 3.5,
            "added_p50_ms": 0.8,
            "added_p99_ms": 1.5,
        },
    ],
    "parser_hiredis": "_AsyncHiredisParser",
    "server_hiredis": "uvloop + httptools",
    "server_asyncio_h11": "asyncio + h11",
    "added_latency_asyncio_h11": [
        {
            "kind": "non_stream",
            "rate": 100.0,
            "direct_p50_ms": 1.0,
            "direct_p99_ms": 2.0,
            "gateway_p50_ms": 2.5,
            "gateway_p99_ms": 4.0,
            "added_p50_ms": 1.5,
            "added_p99_ms": 2.0,
        },
    ],
    "saturation_hiredis": {
        "sustained_max_rate": 400.0,
        "blocks": [
            {"rate": 400.0, "ok": 4000, "cpu": {"cpu_seconds": {"gateway-1": 8.0, "mock": 2.0}}},
            {
                "rate": 500.0,
                "ok": 3000,
                "achieved_per_second": 300.0,
                "p50_ms": 900.0,
                "failures": {"timeout": 12},
            },
        ],
        "closed_loop": {"requests_per_second": 455.5},
    },
    "round_trips": [
        {
            "route": "p95",
            "stream": False,
            "reply_tokens": 1,
            "round_trips_per_request": 3.0,
            "client_commands_per_request": {"evalsha": 3.0},
        },
    ],
}


def _files(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    shoot, head = tmp_path / "overshoot.json", tmp_path / "overhead.json"
    shoot.write_text(json.dumps(OVERSHOOT))
    head.write_text(json.dumps(OVERHEAD))
    doc, readme = tmp_path / "benchmarks.md", tmp_path / "README.md"
    doc.write_text(
        "# Benchmarks\n\nintro\n\n<!-- bench:overshoot -->\nstale\n<!-- /bench:overshoot -->\n\n"
        "middle\n\n<!-- bench:overhead -->\n<!-- /bench:overhead -->\n\nend\n"
    )
    readme.write_text("# Hardcap\n\nNo benchmark markers here.\n")
    return shoot, head, doc, readme


def _run(shoot: Path, head: Path, doc: Path, readme: Path) -> None:
    args = ["--overshoot", str(shoot), "--overhead", str(head), "--doc", str(doc)]
    # hermetic: the other results and bench/README.md from tmp_path, not the repository's
    args += ["--results", str(doc.parent), "--catalogue", str(doc.with_name("bench-README.md"))]
    assert report.main([*args, "--readme", str(readme)]) == 0


def test_tables_come_from_the_json_and_only_replace_the_marked_blocks(tmp_path: Path) -> None:
    shoot, head, doc, readme = _files(tmp_path)
    _run(shoot, head, doc, readme)
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n\n<!-- bench:overshoot -->\n128 streams")
    assert "stale" not in text
    assert "\n<!-- /bench:overshoot -->\n\nmiddle\n\n<!-- bench:overhead -->\n" in text
    assert text.endswith("<!-- /bench:overhead -->\n\nend\n")
    # Highest concurrency first in the headline table; figures as the JSON has them.
    headline = text.split("\n\n")[3]
    assert headline.index("Count after the fact") < headline.index("Reserve p95, truncate")
    assert "| Count after the fact | **+234.30%** (+46,860 tok) | +210.00% |" in text
    assert "| Reserve p95, truncate | **+0.03%** (+6 tok) |" in text
    assert "| Reserve p95, truncate | -0.20% | +0.03% |" in text  # the sweep, 8 then 128
    assert "| 100 req/s | 1.00 / 2.00 ms | 1.80 / 3.50 ms | +0.80 ms | +1.50 ms |" in text
    plain = text.split("hidden from uvicorn (asyncio + h11):")[1]
    assert "| 100 req/s | 1.00 / 2.00 ms | 2.50 / 4.00 ms | +1.50 ms | +2.00 ms |" in plain
    assert (
        "| as shipped | `_AsyncHiredisParser`, uvloop + httptools | 400 req/s | 2.0 ms "
        "| 500 req/s offered: 300 completed/s, p50 900 ms, 12 failed | 456 req/s |"
    ) in text
    assert readme.read_text() == "# Hardcap\n\nNo benchmark markers here.\n"


def test_regenerating_is_deterministic_and_updates_readme_blocks(tmp_path: Path) -> None:
    shoot, head, doc, readme = _files(tmp_path)
    readme.write_text("top\n<!-- bench:overshoot -->\nold\n<!-- /bench:overshoot -->\nbottom\n")
    _run(shoot, head, doc, readme)
    first_doc, first_readme = doc.read_bytes(), readme.read_bytes()
    _run(shoot, head, doc, readme)
    assert doc.read_bytes() == first_doc
    assert readme.read_bytes() == first_readme
    block = report.overshoot_tables(OVERSHOOT, "`overshoot.json`")
    block += "\n\n" + report.measured(shoot)
    assert (
        readme.read_text()
        == f"top\n<!-- bench:overshoot -->\n{block}\n<!-- /bench:overshoot -->\nbottom\n"
    )


def _issue_14_cells() -> list[dict[str, Any]]:
    """A p95 + truncate / max_tokens sweep whose p95 cells carry the new columns."""
    new = {
        "usable_before_refusal_mean": 0.962,
        "usable_before_refusal_min": 0.9,
        "queue_wait_p50_ms": 12.0,
        "queue_wait_p99_ms": 1840.0,
        "failed_per_tenant": 0.5,
    }
    cells = []
    for conc, busy, ref in ((128, 30, 4000), (8, 20, 100)):
        p95 = _cell(
            "p95_truncate",
            "Reserve p95, truncate",
            conc,
            _summary(-0.001, -0.002, 0.995, busy, 1.2),
        )
        p95["summary"].update(new)
        p95["client"] = "sdk"
        cells.append(p95)
        cells.append(
            _cell(
                "max_tokens", "Reserve max_tokens", conc, _summary(-0.0004, -0.001, 0.999, ref, 1)
            )
        )
    return cells


def test_new_columns_show_their_values_and_a_dash_where_an_older_file_lacks_them() -> None:
    data = {**OVERSHOOT, "cells": [*OVERSHOOT["cells"][1:2], *_issue_14_cells()]}
    text = report.overshoot_tables(data, "`overshoot.json`")
    p95 = next(line for line in text.splitlines() if line.startswith("| Reserve p95, truncate |"))
    assert p95.endswith("| 96.2% / 90.0% | 12 / 1,840 ms | 0.5 |")
    old = next(line for line in text.splitlines() if line.startswith("| Count after the fact |"))
    assert old.endswith("| — | — | — |")
    assert "Budget spent before the first refusal of any kind" in text


def test_goals_say_met_or_missed_with_the_worst_cell_measured() -> None:
    table = report.goals_table({"cells": _issue_14_cells()}, None)
    rows = {line.split(" | ")[0][2:]: line for line in table.splitlines()[2:]}
    assert rows["Worst ground-truth overshoot, every truncating cell"].endswith("| met |")
    busy = rows["budget_busy per tenant, p95 + truncate vs max_tokens mode, same concurrency"]
    assert "0.20x worst (20 vs 100, 8 streams)" in busy and busy.endswith("| **missed** |")
    before = rows["Budget spent before the first refusal, p95 + truncate, every concurrency (mean)"]
    assert "96.2% lowest mean" in before and before.endswith("| met |")
    assert rows["Cut (truncated) streams per tenant, p95 + truncate, 128 streams"].endswith(
        "| <= 1.5 | 1.2 | met |"
    )
    assert "Not measured in this result file: budget spent before the first refusal" in (
        report.overshoot_tables(OVERSHOOT, "`overshoot.json`")
    )
    old = report.goals_table(OVERSHOOT, None)
    assert "| — (not measured in this run) | — |" in old
