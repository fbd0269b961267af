"""The tables that were copied by hand (failover, the ledger's runs) and the README's headline
come from the result JSON: a changed result changes the table."""

from __future__ import annotations

from typing import Any

from bench.lib.report_failover import failover_table
from bench.lib.report_headline import headline_table
from bench.lib.report_ledger import ledger_runs_table


def _part(requests: int, failed: int, p99: float = 100.0) -> dict[str, Any]:
    return {"requests": requests, "failed": failed, "ttfb_ms": {"p99": p99}}


FAILOVER: dict[str, Any] = {
    "machine": {"cpu_count": 2},
    "load_average_before": [0.34, 0.9, 1.3],
    "parameters": {"rate": None},
    "rate_search": {"chosen_rate": 100.0},
    "phase_503": {
        "all": _part(2000, 0),
        "before": _part(500, 0, 260.1),
        "during": _part(700, 0, 390.3),
        "after": _part(800, 0, 385.0),
    },
    "phase_kill": {
        "all": _part(2000, 16),
        "in_flight_at_kill": _part(26, 16),
        "in_flight_failed": {"count": 16, "outcomes": {"error_event": 16}},
        "sent_after_kill": _part(990, 0),
    },
    "settled": {"phase_503": {"live_reservations": 0}, "phase_kill": {"live_reservations": 1}},
}


def test_the_failover_row_is_the_result_s_figures() -> None:
    row = failover_table(FAILOVER).splitlines()[3]
    assert row == (
        "| Hardcap (2 cores; load average 0.3 at the start) | **100 streams/s** | **0 of 2,000** "
        "| 260 / 390 / 385 ms | **16 of 2,000** | 16 of 26 in flight (16 error_event) "
        "| 0 of 990 | 1 |"
    )


def _ledger(admit: float, pairs: tuple[float, float], grants: float | None) -> dict[str, Any]:
    server = {s: {"usec_per_call": admit + i} for i, s in enumerate(("admit", "extend", "settle"))}
    results: dict[str, Any] = {
        "server": server,
        "throughput": [
            {"inflight": 1, "pairs_per_s": pairs[0]},
            {"inflight": 16, "pairs_per_s": pairs[1]},
        ],
    }
    if grants is not None:
        results["upstream_limit"] = {"grant_calls_per_1000_admits": grants}
    return {"machine": {"git_commit": "4c61c1159700"}, "results": results}


def test_the_ledger_runs_table_has_a_row_per_result_present() -> None:
    text = ledger_runs_table(
        {
            "ledger.json": _ledger(108.06, (2022.5, 3236.7), None),
            "ledger-upstream.json": _ledger(114.13, (2056.0, 4224.3), 0.09),
        }
    )
    rows = text.splitlines()[2:]
    assert rows == [
        "| no lease, no limit across tenants | `bench/results/ledger.json` | 108.1 | 109.1 "
        "| 110.1 | 2,022 / 3,237 | — | `4c61c11` |",
        "| every admit under an upstream day budget (`--upstream-limit`) "
        "| `bench/results/ledger-upstream.json` | 114.1 | 115.1 | 116.1 | 2,056 / 4,224 | 0.09 "
        "| `4c61c11` |",
    ]


def test_the_headline_names_each_number_s_result_file() -> None:
    text = headline_table({"failover.json": FAILOVER})
    assert (
        "| Streams failed when the primary upstream is killed under load | 16 of 2,000 (all in "
        "flight on it); 0 of 990 sent after the kill | `bench/results/failover.json` |"
    ) in text
    assert "[bench/README.md](bench/README.md)" in text
