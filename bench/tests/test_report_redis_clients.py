"""The Redis clients table comes from redis-clients.json: each client's cell is the median of its
rounds' client CPU, the page's clients come first under the page's names, and a client the
result adds is shown under its own name rather than dropped."""

from __future__ import annotations

from typing import Any

from bench.lib.report_redis_clients import redis_clients_table


def _run(client: str, call: str, inflight: int, cpu: float) -> dict[str, Any]:
    return {"client": client, "call": call, "inflight": inflight, "client_cpu_us_per_unit": cpu}


RESULT: dict[str, Any] = {
    "parameters": {"rounds": 2, "duration_s": 2.0},
    "machine": {"cpu_model": "AMD EPYC", "cpu_count": 2},
    "results": [
        _run("valkey-glide", "admit+settle", 1, 998.1),
        _run("valkey-glide", "admit+settle", 1, 1374.0),
        _run("hardcap pipe", "admit+settle", 1, 619.5),
        _run("hardcap pipe", "admit+settle", 1, 346.6),
        _run("hardcap pipe", "return 1", 16, 40.4),
        _run("hardcap pipe", "return 1", 16, 31.7),
        _run("some new client", "return 1", 1, 300.0),
    ],
}


def test_cells_are_medians_over_rounds_in_the_pages_order() -> None:
    lines = redis_clients_table(RESULT).splitlines()
    assert lines[0] == (
        "| client | admit + settle, 1 in flight | 16 in flight | `return 1`, 1 in flight "
        "| 16 in flight |"
    )
    assert lines[2:5] == [
        "| the pipe (`ledger/pipe.py`) | 483 µs | — | — | 36 µs |",
        "| valkey-glide | 1,186 µs | — | — | — |",
        "| some new client | — | — | 300 µs | — |",
    ]
    assert "the median of 2 rounds of 2 s (AMD EPYC, 2 cores" in lines[-1]
