"""The gateway with the ledger's pipe against the commit before it, in one wrk run
(bench/speed/wrk_overhead.py with ``--base-tree``; bench/results/wrk-pipe-ab.json), generated so
docs/benchmarks.md cannot drift from the JSON. Each figure is the run's median over rounds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.lib.report_format import ms, num

# What each gateway tree ran: the checkout under test (``gateway``) and the base (``gateway_base``).
SIDES = (("gateway", "gateway_tree", "the pipe"), ("gateway_base", "base_tree", "redis-py"))


def pipe_ab_table(data: dict[str, Any]) -> str:
    p, summary = data["parameters"], data["summary"]
    conns, tokens = p["connections"], p["stream_tokens"]
    figures: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        (
            f"CPU µs per request, {conns} connections",
            lambda s: num(s["sat_target_cpu_us_per_request"], 0),
        ),
        (f"req/s, {conns} connections", lambda s: num(s["sat_requests_per_second"], 0)),
        ("CPU µs per request, 1 connection", lambda s: num(s["target_cpu_us_per_request"], 0)),
        (
            "added p50 / p99, 1 connection",
            lambda s: f"{ms(s['added_p50_ms'])[:-3]} / {ms(s['added_p99_ms'])}",
        ),
        (f"{tokens}-token stream, added p50", lambda s: ms(s["stream_added_p50_ms"])),
        ("CPU µs per streamed token", lambda s: num(s["stream_target_cpu_us_per_token"])),
    ]
    sides = [(summary[key], label, data[tree]["rev"]) for key, tree, label in SIDES]
    rows = [
        "| | " + " | ".join(f"{label} ({rev})" for _, label, rev in sides) + " |",
        "|---|" + "---:|" * len(sides),
    ]
    for title, fmt in figures:
        rows.append(f"| {title} | " + " | ".join(fmt(s) for s, _, _ in sides) + " |")
    rows += [
        "",
        f"Medians of {p['rounds']} rounds (gateway at "
        f"`{data['gateway_tree']['commit'][:7]}`, base at `{data['base_tree']['commit'][:7]}`).",
    ]
    return "\n".join(rows)
