"""docs/coldstart.md's "Now:" figure: process start to first response for the artifact as built
at its commit (bench/coldstart/coldstart.py's result), generated so the page's current figure
cannot drift from bench/results/coldstart-artifact-head.json; the page's history stays typed."""

from __future__ import annotations

from typing import Any

from bench.lib.report_format import num

# Each entry's two phases before the first response, as coldstart.py names them.
ENTRIES = (
    ("uvicorn", "uvicorn (`run.sh`, streaming)", "ready_ms", "first_request_ms"),
    ("mangum", "Mangum (`buffered.handler`)", "init_ms", "first_invoke_ms"),
)


def coldstart_now(data: dict[str, Any]) -> str:
    runs = data["parameters"]["runs"]
    rows = [
        f"Process start to first response served, {runs} cold starts per entry, milliseconds "
        "(median, with p90 and the slowest):",
        "",
        "| Target | Entry | Ready or init | First request or invoke | First response: median "
        "| p90 | slowest |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for target, t in data["targets"].items():
        python = (t.get("interpreter") or {}).get("python", "?").split(" ")[0]
        for entry, label, start, first in ENTRIES:
            e = (t.get("entries") or {}).get(entry)
            if not e:
                continue
            s = e["summary"]
            total = s["first_response_ms"]
            rows.append(
                f"| {target} (CPython {python}) | {label} | {num(s[start]['median'], 0)} "
                f"| {num(s[first]['median'], 0)} | **{num(total['median'], 0)}** "
                f"| {num(total['p90'], 0)} | {num(total['max'], 0)} |"
            )
    return "\n".join(rows)
