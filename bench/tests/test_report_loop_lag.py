"""The loop-lag table comes from loop-lag.json: a row per phase with the lag percentiles and the
share of the phase shedding would have been on at each threshold; the runs with shedding on add
a row per phase with the requests they refused."""

from __future__ import annotations

from typing import Any

from bench.lib.report_loop_lag import loop_lag_table


def _phase(p50: float, p99: float, share: float, errors: int | None) -> dict[str, Any]:
    phase: dict[str, Any] = {
        "all_gateways": {
            "lag_p50_ms": p50,
            "lag_p99_ms": p99,
            "lag_p999_ms": p99 * 2,
            "lag_max_ms": p99 * 3,
        },
        "would_shed": {t: {"shedding_share_mean": share} for t in ("250", "500", "1000")},
    }
    if errors is not None:
        phase["requests"] = {"errors": errors}
    return phase


def _run(shed_ms: float | None, errors: int) -> dict[str, Any]:
    params: dict[str, Any] = {"quota": 0.5}
    if shed_ms is not None:
        params["shed_ms"] = shed_ms
    return {
        "parameters": params,
        "phases": {
            "idle": _phase(0.19, 3.27, 0.0, None),
            "load_quota": _phase(51.0, 553.4, 0.043, errors),
        },
    }


def test_each_phase_is_a_row_with_its_lag_and_would_be_shedding() -> None:
    lines = loop_lag_table(_run(None, 1)).splitlines()
    assert lines[2:4] == [
        "| idle | 0.2 / 3.3 / 6.5 / 9.8 ms | 0 / 0 / 0 |",
        "| load, gateways in a 0.5-core cgroup | 51 / 553 / 1,107 / 1,660 ms "
        "| 4.3% / 4.3% / 4.3% |",
    ]
    assert "shedding on" not in "\n".join(lines)


def test_a_run_with_shedding_on_shows_what_it_refused() -> None:
    text = loop_lag_table(_run(None, 1), {"loop-lag-shed-500.json": _run(500.0, 187)})
    assert (
        "| 500 ms | load, gateways in a 0.5-core cgroup | 51 / 553 / 1,107 / 1,660 ms | 187 |"
        in (text.splitlines())
    )
    assert "| 500 ms | idle | 0.2 / 3.3 / 6.5 / 9.8 ms | — |" in text.splitlines()
