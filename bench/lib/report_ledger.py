"""docs/benchmarks.md's table of the ledger's runs side by side (no lease, a lease, an upstream
limit, both): server µs per script call and pairs per second, each row from its own result file
(bench/speed/ledger.py), so the comparison is regenerated, not copied."""

from __future__ import annotations

from typing import Any

from bench.lib.report_format import num

RUNS = (
    ("ledger.json", "no lease, no limit across tenants"),
    ("ledger-lease.json", "every admit under a lease (`--lease`)"),
    ("ledger-upstream.json", "every admit under an upstream day budget (`--upstream-limit`)"),
    ("ledger-lease-upstream.json", "both (`--lease --upstream-limit`)"),
)


def _pairs(data: dict[str, Any], inflight: int) -> str:
    rows = [t for t in data["results"]["throughput"] if t["inflight"] == inflight]
    return num(rows[0]["pairs_per_s"], 0) if rows else "—"


def ledger_runs_table(results: dict[str, dict[str, Any]]) -> str:
    """``results``: file name -> JSON for the runs present (and not refused)."""
    rows = [
        "| run | result file | admit µs | extend µs | settle µs | pairs/s, 1 / 16 in flight "
        "| grant calls per 1,000 admits | commit |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, label in RUNS:
        data = results.get(name)
        if data is None:
            continue
        server = data["results"]["server"]
        limit = data["results"].get("upstream_limit") or {}
        grants = limit.get("grant_calls_per_1000_admits")
        commit = str((data.get("machine") or {}).get("git_commit") or "?")[:7]
        rows.append(
            f"| {label} | `bench/results/{name}` "
            + "".join(
                f"| {num(server[s]['usec_per_call'], 1)} " for s in ("admit", "extend", "settle")
            )
            + f"| {_pairs(data, 1)} / {_pairs(data, 16)} | {num(grants, 2)} | `{commit}` |"
        )
    return "\n".join(rows)
