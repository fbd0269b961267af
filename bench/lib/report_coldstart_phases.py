"""Where a cold start's time goes, phase by phase (bench/coldstart/coldstart_phases.py's results
for the artifact before and after the lazy imports), generated so docs/coldstart.md cannot drift
from bench/results/coldstart-phases-before.json and coldstart-phases.json."""

from __future__ import annotations

from typing import Any

from bench.lib.report_format import num

# The runs compared, by file: the column each makes, and the server set-up it is read for.
RUNS = (
    ("coldstart-phases-before.json", "before", "uvloop-httptools"),
    ("coldstart-phases.json", "after", "uvloop-httptools"),
    ("coldstart-phases.json", "after, asyncio + h11", "asyncio-h11"),
)
# Each row: its label and the probe's phases it sums (median ms of each).
PHASES = (
    ("interpreter start (spawn to the first statement)", ("interpreter",)),
    ("asyncio, json (the probe's own first imports)", ("probe_stdlib",)),
    (
        "`import uvicorn.main` (click, multiprocessing, email, http: what `python -m uvicorn` "
        "loads)",
        ("import_uvicorn",),
    ),
    ("import the app (`hardcap_core.gateway.app`)", ("import_app",)),
    ("load the config", ("config_load",)),
    (
        "uvicorn's config (imports httptools or h11), event loop (uvloop or asyncio's), "
        "server start",
        ("uvicorn_config", "event_loop_import", "server_startup"),
    ),
    ("first request", ("first_request",)),
    ("of which the HTTP client and its TLS context", ("first_request.http_client",)),
)


def _median(summary: dict[str, Any], phases: tuple[str, ...]) -> str:
    if any(p not in summary for p in phases):
        return "—"
    return num(sum(summary[p]["median"] for p in phases), 0)


def coldstart_phases_table(results: dict[str, dict[str, Any]]) -> str:
    columns = []
    for name, label, server in RUNS:
        summary = ((results.get(name) or {}).get("servers") or {}).get(server, {}).get("summary")
        if summary:
            columns.append((label, summary))
    rows = [
        "| phase | " + " | ".join(label for label, _ in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for label, phases in PHASES:
        rows.append(f"| {label} | " + " | ".join(_median(s, phases) for _, s in columns) + " |")
    first = " | ".join(f"**{_median(s, ('first_response_ms',))}**" for _, s in columns)
    rows.append(f"| **first response** | {first} |")
    rows.append(
        "| (a second request, for comparison) | "
        + " | ".join(_median(s, ("second_request",)) for _, s in columns)
        + " |"
    )
    fastest = " | ".join(num(s["first_response_ms"]["min"], 0) for _, s in columns)
    rows.append(f"| first response, fastest run | {fastest} |")
    return "\n".join(rows)
