"""docs/deploy.md's cold start table comes from coldstart-server.json: a row per artifact and
uvicorn set-up with the ready, first-request and first-response medians, the p90 beside the
first response, and the set-up the build ships marked as shipped."""

from __future__ import annotations

from typing import Any

from bench.lib.report_coldstart_server import coldstart_server_table


def _entry(ready: float, first: float, total: float, p90: float) -> dict[str, Any]:
    return {
        "summary": {
            "ready_ms": {"median": ready, "p90": ready},
            "first_request_ms": {"median": first, "p90": first},
            "first_response_ms": {"median": total, "p90": p90},
        }
    }


def test_each_target_and_server_is_a_row_and_the_shipped_one_is_marked() -> None:
    result = {
        "parameters": {"runs": 30},
        "targets": {
            "artifact-py3.13": {
                "entries": {"uvicorn:uvloop-httptools": _entry(613.3, 100, 715.1, 909.6)}
            },
            "artifact-py3.13-no-bytecode": {
                "entries": {"uvicorn:asyncio-h11": _entry(2632.5, 224.9, 2857.8, 3244.1)}
            },
        },
    }
    lines = coldstart_server_table(result).splitlines()
    assert lines[2:4] == [
        "| shipped bytecode | uvloop + httptools (shipped) | 613 | 100 | **715** (910) |",
        "| no bytecode | asyncio + h11 | 2,632 | 225 | **2,858** (3,244) |",
    ]
    assert lines[-1].startswith("30 cold starts each")
