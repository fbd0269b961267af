"""What a cut stream is charged beyond what the provider generated (bench/budget/cut_charge.py's
result), generated so docs/design.md cannot drift from bench/results/cut-charge.json."""

from __future__ import annotations

from typing import Any

# The route labels of the page; a route the result holds and this does not keeps its own name.
ROUTES = {"p95_truncate": "p95 + truncate", "max_tokens": "max_tokens"}
STATS = ("mean", "p50", "p95", "max", "min")


def _tokens(e: dict[str, float]) -> str:
    return " / ".join(f"{e[k]:+.1f}" if k == "mean" else f"{e[k]:+.0f}" for k in STATS)


def _shares(e: dict[str, float]) -> str:
    return " / ".join(f"{e[k] * 100:+.1f}%" for k in STATS)


def cut_charge_table(data: dict[str, Any]) -> str:
    rows = [
        "| route \N{MULTIPLICATION SIGN} streams per tenant | cut streams | under-charged "
        "| error, tokens: mean / p50 / p95 / max / min "
        "| as a share of generated: mean / p50 / p95 / max / min |",
        "|---|---|---|---|---|",
    ]
    for s in data["scenarios"]:
        summary = s["summary"]
        route = ROUTES.get(s["route"], s["route"])
        under = summary["under_charged"]
        rows.append(
            f"| {route} \N{MULTIPLICATION SIGN} {s['concurrency']} | {summary['cut_streams']} "
            f"| {f'**{under}**' if under else under} | {_tokens(summary['error_tokens'])} "
            f"| {_shares(summary['error_fraction'])} |"
        )
    return "\n".join(rows)


def cut_charge_fanout_table(data: dict[str, Any]) -> str:
    """The lease-sized case (``cut_charge --fanout``): per route, the share of the budget the
    provider billed in each run, whether it billed past it, and the cut streams' error."""
    rows = [
        "| route | budget | streams | billed share of the budget, per run | billed past it "
        "| cut streams | under-charged | error, tokens: mean / max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    budget = data["parameters"]["budget_tokens"]
    for s in data["scenarios"]:
        summary, spent = s["summary"], s["spent"]
        shares = " / ".join(
            f"{n / budget:.1%}" for run in s["runs"] for n in run["billed_tokens"].values()
        )
        under = summary.get("under_charged", 0)
        e = summary.get("error_tokens")
        error = f"{e['mean']:+.1f} / {e['max']:+.0f}" if e else "—"
        rows.append(
            f"| {ROUTES.get(s['route'], s['route'])} | {budget:,} | {s['concurrency']} "
            f"| {shares} | {spent['tenants_billed_over']} | {summary['cut_streams']} "
            f"| {f'**{under}**' if under else under} | {error} |"
        )
    return "\n".join(rows)
