"""The failover table (bench/failover/failover.py's result beside the seed's published figures),
generated, so the README and docs/benchmarks.md cannot drift from bench/results/failover.json."""

from __future__ import annotations

from typing import Any

from bench.lib.report_format import num

HEAD = (
    "| | Rate | 503 phase: failed | 503 phase p99 TTFB before / during / after "
    "| Kill phase: failed | Failed that were in flight on the killed primary "
    "| Sent after the kill: failed | Reservations left |"
)
SEED = (
    '| Seed (12-thread laptop) | 200 streams/s | 0 of 4,000 | "did not move" | 26 of 4,000 '
    "| 26 (each an SSE error event) | 0 | 0 |"
)


def _failed(part: dict[str, Any]) -> str:
    return f"{num(part['failed'], 0)} of {num(part['requests'], 0)}"


def failover_table(data: dict[str, Any]) -> str:
    a, b = data["phase_503"], data["phase_kill"]
    p99 = " / ".join(f"{a[w]['ttfb_ms']['p99']:.0f}" for w in ("before", "during", "after"))
    in_flight = b["in_flight_at_kill"]
    outcomes = ", ".join(f"{n} {k}" for k, n in sorted(b["in_flight_failed"]["outcomes"].items()))
    left = sum(s.get("live_reservations", 0) for s in (data.get("settled") or {}).values())
    load = data.get("load_average_before") or data["machine"].get("load_average") or ["?"]
    rate = data["rate_search"].get("chosen_rate") or data["parameters"].get("rate")
    rows = [
        HEAD,
        "|---|---|---|---|---|---|---|---|",
        SEED,
        f"| Hardcap ({data['machine'].get('cpu_count', '?')} cores; load average "
        f"{load[0]:.1f} at the start) | **{num(rate, 0)} streams/s** | **{_failed(a['all'])}** "
        f"| {p99} ms | **{_failed(b['all'])}** "
        f"| {b['in_flight_failed']['count']} of {in_flight['requests']} in flight ({outcomes}) "
        f"| {_failed(b['sent_after_kill'])} | {left} |",
    ]
    return "\n".join(rows)
