"""The event loop's lateness under load and what shedding would have refused
(bench/speed/loop_lag.py's results), generated so docs/design.md's shedding default cannot drift
from bench/results/loop-lag.json and the runs with shedding on (loop-lag-shed-*.json)."""

from __future__ import annotations

from typing import Any

# The runs with shedding on, by file; each names its threshold in its parameters.
SHED_RUNS = ("loop-lag-shed-500.json", "loop-lag-shed-1000.json")
THRESHOLDS_MS = ("250", "500", "1000")


def _phases(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The phases in run order with the page's label (the cgroup's share from the parameters)."""
    labels = {
        "idle": "idle",
        "load": "load (both cores busy with gateways, mock and clients)",
        "load_busy": "load + a busy loop per core",
        "load_quota": f"load, gateways in a {data['parameters']['quota']:g}-core cgroup",
    }
    return [(labels.get(k, k), v) for k, v in data["phases"].items()]


def _ms(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:,.0f}"


def _lag(phase: dict[str, Any]) -> str:
    a = phase["all_gateways"]
    keys = ("lag_p50_ms", "lag_p99_ms", "lag_p999_ms", "lag_max_ms")
    return " / ".join(_ms(a[k]) for k in keys) + " ms"


def _share(x: float) -> str:
    if x == 0:
        return "0"
    return f"{x * 100:.1f}%" if x < 0.1 else f"{x * 100:.0f}%"


def loop_lag_table(data: dict[str, Any], shed: dict[str, dict[str, Any]] | None = None) -> str:
    heads = " / ".join(THRESHOLDS_MS)
    rows = [
        f"| phase | lag p50 / p99 / p99.9 / max | shedding at {heads} ms |",
        "|---|---|---|",
    ]
    for label, phase in _phases(data):
        would = phase["would_shed"]
        shares = " / ".join(_share(would[t]["shedding_share_mean"]) for t in THRESHOLDS_MS)
        rows.append(f"| {label} | {_lag(phase)} | {shares} |")
    if shed:
        rows += [
            "",
            "The same run with shedding on:",
            "",
            "| shedding at | phase | lag p50 / p99 / p99.9 / max "
            "| requests failed (503 when shed) |",
            "|---|---|---|---:|",
        ]
        for run in shed.values():
            at = f"{run['parameters']['shed_ms']:g} ms"
            for label, phase in _phases(run):
                failed = (phase.get("requests") or {}).get("errors")
                rows.append(
                    f"| {at} | {label} | {_lag(phase)} | {'—' if failed is None else failed} |"
                )
    return "\n".join(rows)
