"""How soon a config change reaches the gateways (bench/budget/live_config_propagation.py's
result), generated so docs/benchmarks.md cannot drift from the JSON."""

from __future__ import annotations

from typing import Any

from bench.lib.report_format import num

CHANGES = (
    ("new_key", "a new key: until its first 200"),
    ("disabled_tenant", "the tenant disabled: until the first 403"),
    ("reenabled_tenant", "the tenant enabled again: until the first 200"),
    ("emptied_routes", "the tenant's routes emptied: until the first 403"),
    ("restored_routes", "the tenant's routes restored: until the first 200"),
    ("lowered_budget", "a lowered budget: until the first 429"),
    ("revoked_key", "a revoked key: until the first 401"),
)


def propagation_table(data: dict[str, Any]) -> str:
    p, summary = data["parameters"], data["summary"]
    goal_ms = p["goal_s"] * 1000
    rows = [
        f"{p['instances']} gateway instances, {p['rounds']} rounds; from the admin call's return "
        f"to the first request that sees the change, per instance (goal: {p['goal_s']:g} s):",
        "",
        "| Change | Median | Max | Instances x rounds | Within the goal |",
        "|---|---:|---:|---:|---|",
    ]
    for key, label in CHANGES:
        s = summary.get(key)
        if not s:
            continue
        within = "yes" if s["max_ms"] <= goal_ms else "**no**"
        rows.append(
            f"| {label} | {num(s['median_ms'], 0)} ms | {num(s['max_ms'], 0)} ms "
            f"| {s['instances_x_rounds']} | {within} |"
        )
    return "\n".join(rows)
