"""The pipe A/B table comes from wrk-pipe-ab.json: one column per gateway tree, headed by the
revision it ran, each row a figure of the run's summary, so a rerun changes the page."""

from __future__ import annotations

from typing import Any

from bench.lib.report_pipe_ab import pipe_ab_table


def _side(
    cpu16: float, rps: float, cpu1: float, p50: float, p99: float, stream: float
) -> dict[str, Any]:
    return {
        "sat_target_cpu_us_per_request": cpu16,
        "sat_requests_per_second": rps,
        "target_cpu_us_per_request": cpu1,
        "added_p50_ms": p50,
        "added_p99_ms": p99,
        "stream_added_p50_ms": stream,
        "stream_target_cpu_us_per_token": 55.87,
    }


RESULT: dict[str, Any] = {
    "parameters": {"connections": 8, "stream_tokens": 50, "rounds": 3},
    "gateway_tree": {"rev": "HEAD", "commit": "81f0e2aeed126b02ea2a91feef5cefda52c519e3"},
    "base_tree": {"rev": "5694e91", "commit": "5694e918f417d476e508ace37316a18d973688aa"},
    "summary": {
        "gateway": _side(1221.2, 654.4, 2413.6, 3.429, 8.851, 3.179),
        "gateway_base": _side(1211.7, 622.1, 2403.4, 3.494, 6.581, 3.396),
    },
}


def test_each_tree_is_a_column_and_each_figure_a_row() -> None:
    lines = pipe_ab_table(RESULT).splitlines()
    assert lines[0] == "| | the pipe (HEAD) | redis-py (5694e91) |"
    assert lines[2:8] == [
        "| CPU µs per request, 8 connections | 1,221 | 1,212 |",
        "| req/s, 8 connections | 654 | 622 |",
        "| CPU µs per request, 1 connection | 2,414 | 2,403 |",
        "| added p50 / p99, 1 connection | +3.43 / +8.85 ms | +3.49 / +6.58 ms |",
        "| 50-token stream, added p50 | +3.18 ms | +3.40 ms |",
        "| CPU µs per streamed token | 55.9 | 55.9 |",
    ]
    assert lines[-1] == "Medians of 3 rounds (gateway at `81f0e2a`, base at `5694e91`)."
