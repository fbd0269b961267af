"""Cold start of the shipped artifact by uvicorn's server set-up, with and without the shipped
bytecode (bench/coldstart/coldstart.py's ``--servers`` result), generated so docs/deploy.md
cannot drift from bench/results/coldstart-server.json."""

from __future__ import annotations

from typing import Any

from bench.lib.report_format import num

# coldstart.py's target names: what the page calls each (the no-bytecode target reads the
# sources, as a build without compileall would).
TARGETS = {"artifact-py3.13": "shipped bytecode", "artifact-py3.13-no-bytecode": "no bytecode"}
SERVERS = {"asyncio-h11": "asyncio + h11", "uvloop-httptools": "uvloop + httptools"}
SHIPPED = ("artifact-py3.13", "uvloop-httptools")  # what run.sh and the build ship


def coldstart_server_table(data: dict[str, Any]) -> str:
    rows = [
        "| artifact, CPython 3.13 | uvicorn on | ready | first request "
        "| process start to first response |",
        "|---|---|---|---|---|",
    ]
    for target, t in data["targets"].items():
        for entry, e in (t.get("entries") or {}).items():
            server = entry.partition(":")[2]
            label = SERVERS.get(server, server)
            if (target, server) == SHIPPED:
                label += " (shipped)"
            s = e["summary"]
            first = s["first_response_ms"]
            rows.append(
                f"| {TARGETS.get(target, target)} | {label} | {num(s['ready_ms']['median'], 0)} "
                f"| {num(s['first_request_ms']['median'], 0)} "
                f"| **{num(first['median'], 0)}** ({num(first['p90'], 0)}) |"
            )
    rows += [
        "",
        f"{data['parameters']['runs']} cold starts each, median (p90 for the first response), "
        "milliseconds.",
    ]
    return "\n".join(rows)
