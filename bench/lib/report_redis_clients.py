"""The ledger's script calls through each Redis client (bench/speed/redis_clients.py's result),
generated so docs/benchmarks.md cannot drift from bench/results/redis-clients.json. Client CPU is
the median over rounds, per admit+settle pair or per ``return 1`` call."""

from __future__ import annotations

import statistics
from typing import Any

from bench.lib.report_format import num

# The clients as redis_clients.py names them, in the page's order, with the page's label; a
# client the result holds and this list does not is shown after them under its own name.
CLIENTS = (
    ("hardcap pipe", "the pipe (`ledger/pipe.py`)"),
    ("redis-py+hiredis", "redis-py + hiredis, script objects (before)"),
    ("valkey-glide", "valkey-glide"),
    ("raw asyncio + hiredis", "a bare asyncio + hiredis protocol (the floor)"),
)
CALLS = ("admit+settle", "return 1")


def redis_clients_table(data: dict[str, Any]) -> str:
    cpu: dict[tuple[str, str, int], list[float]] = {}
    for r in data["results"]:
        cpu.setdefault((r["client"], r["call"], r["inflight"]), []).append(
            r["client_cpu_us_per_unit"]
        )
    inflight = sorted({n for _, _, n in cpu})
    known = dict(CLIENTS)
    order = [c for c, _ in CLIENTS] + sorted({c for c, _, _ in cpu} - set(known))
    heads = [
        f"{'admit + settle' if call == 'admit+settle' else f'`{call}`'}, {n} in flight"
        if i == 0
        else f"{n} in flight"
        for call in CALLS
        for i, n in enumerate(inflight)
    ]
    rows = ["| client | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for client in order:
        cells = [
            f"{num(statistics.median(v), 0)} µs" if (v := cpu.get((client, call, n))) else "—"
            for call in CALLS
            for n in inflight
        ]
        if all(c == "—" for c in cells):
            continue
        rows.append(f"| {known.get(client, client)} | " + " | ".join(cells) + " |")
    m = data["machine"]
    rows += [
        "",
        f"Client CPU per pair or call, the median of {data['parameters']['rounds']} rounds of "
        f"{data['parameters']['duration_s']:g} s ({m.get('cpu_model', '?')}, "
        f"{m.get('cpu_count', '?')} cores shared with the server).",
    ]
    return "\n".join(rows)
