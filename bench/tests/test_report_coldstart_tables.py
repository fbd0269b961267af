"""docs/coldstart.md's phase and HTTP-client tables come from their result JSON: each phase row
is the run's median (a row summing several probe phases adds them), a server set-up the result
lacks is no column, and each client row is its import and build medians with the fastest run."""

from __future__ import annotations

from typing import Any

from bench.lib.report_coldstart_phases import coldstart_phases_table
from bench.lib.report_coldstart_transports import coldstart_transports_table

PHASES = (
    "interpreter",
    "probe_stdlib",
    "import_uvicorn",
    "import_app",
    "config_load",
    "uvicorn_config",
    "event_loop_import",
    "server_startup",
    "first_request",
    "first_request.http_client",
    "second_request",
)


def _phases(ms: float, first: float, fastest: float) -> dict[str, Any]:
    summary = {p: {"median": ms} for p in PHASES}
    summary["first_response_ms"] = {"median": first, "min": fastest}
    return {"servers": {"uvloop-httptools": {"summary": summary}}}


def test_phase_rows_are_medians_and_the_first_response_is_bold() -> None:
    results = {
        "coldstart-phases-before.json": _phases(10.4, 870.0, 828.6),
        "coldstart-phases.json": _phases(2.0, 506.1, 408.3),
    }
    lines = coldstart_phases_table(results).splitlines()
    assert lines[0] == "| phase | before | after |"
    assert "| import the app (`hardcap_core.gateway.app`) | 10 | 2 |" in lines
    # uvicorn's config, the event loop and server start are one row: three phases summed.
    assert any(line.endswith("server start | 31 | 6 |") for line in lines)
    assert "| **first response** | **870** | **506** |" in lines
    assert lines[-1] == "| first response, fastest run | 829 | 408 |"


def test_client_rows_carry_the_recorded_versions_and_medians() -> None:
    result = {
        "parameters": {"runs": 20},
        "versions": {"httpx": "0.28.1"},
        "candidates": {
            "httpx": {
                "median_ms": {"import_ms": 45.13, "client_ms": 48.13},
                "min_ms": {"import_ms": 43.69, "client_ms": 47.19},
            },
            "newclient": {
                "statement": "import newclient",
                "median_ms": {"import_ms": 8.88, "client_ms": 0.38},
                "min_ms": {"import_ms": 8.4, "client_ms": 0.35},
            },
        },
    }
    lines = coldstart_transports_table(result).splitlines()
    assert lines[2:4] == [
        "| httpx 0.28.1 | 45 (44) | 48 (47) | 93 |",
        "| `import newclient` | 8.9 (8.4) | 0.4 (0.3) | 9.3 |",
    ]
    assert lines[-1].startswith("Median (fastest) of 20 runs")
