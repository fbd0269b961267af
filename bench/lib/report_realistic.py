"""The report's ``overshoot-realistic`` block: the realistic-prompt overshoot run
(:mod:`bench.budget.overshoot_realistic`), each tokenizer side by side, with its goals met or
missed.

Goals, judged per workload and budget over the measured mode's cells (p95 + truncate): never
over (the provider's bill, by ground truth, at most the budget, every level), >= 99 % of the
budget usable (the lowest cell mean), >= 95 % of the budget spent before the first refusal at
the top concurrency (the cell mean); budget_busy per tenant is stated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.lib.report_format import before_refusal, num, pct, queue_wait, share

HEAD_MODE = "p95_truncate"
USABLE_GOAL = 0.99
BEFORE_REFUSAL_GOAL = 0.95
BUDGET_NAMES = {"cost_usd": "cost", "total_tokens": "tokens"}
Judged = tuple[str, bool | None]


def realistic_tables(data: dict[str, Any], source: str) -> str:
    """The workloads, the goals per tokenizer side by side, then every cell."""
    p, cells = data["parameters"], data["cells"]
    tokenizers = list(dict.fromkeys(c["tokenizer"] for c in cells))
    top = max(c["concurrency"] for c in cells)
    m = data["machine"]
    load = [round(x, 1) for x in m.get("load_average") or []]
    end = [round(x, 1) for x in data.get("load_average_end") or []]
    dirty = " with local changes" if m.get("git_dirty") else ""
    lines = [
        f"{p['gateway_processes']} gateway processes, the SDK-like client (max_retries "
        f"{p['client_max_retries']}), the default queue wait ({p['queue_wait_seconds']:g} s), "
        f"mock pace {p['mock_pace_ms']:g} ms/token, prices ${_price(p, 'input')} / "
        f"${_price(p, 'output')} per million input / output tokens; each budget pays for "
        f"{p['requests_per_budget']} of its workload's mean requests ({source}, "
        f"{'complete' if data.get('complete') else 'INCOMPLETE'} run"
        f"{_minutes(data)}, commit `{(m.get('git_commit') or 'unknown')[:10]}`{dirty}; "
        f"load average {load} before, {end or '—'} at the end: other work shared the machine).",
        "",
        "| Workload | Prompt tokens p50 / mean / max | Output asked, mean | Tool schemas "
        "| Bound / billed input | Cost budget | Token budget |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, w in p["workloads"].items():
        pt, tools = w["prompt_tokens"], w.get("tool_schemas")
        schemas = f"{tools['min']}-{tools['max']}" if tools else "—"
        lines.append(
            f"| {name} | {pt['p50']:,} / {pt['mean']:,.0f} / {pt['max']:,} "
            f"| {w['output_tokens_asked']['mean']:,.0f} | {schemas} "
            f"| {w['bound_over_billed_input']['mean']:.2f}x "
            f"| ${w['cost_usd_budget_usd']:,.3f} | {w['budgets']['total_tokens']:,.0f} |"
        )
    lines += [
        "",
        f"Goals, {_label(cells)}, per workload and budget ({', '.join(tokenizers)} side by side):",
        "",
        "| Workload, budget | Goal | " + " | ".join(f"`{t}`" for t in tokenizers) + " |",
        "|---|---|" + "---|" * len(tokenizers),
    ]
    groups = list(dict.fromkeys((c["workload"], c["dimension"]) for c in cells))
    for workload, dimension in groups:
        mine = {
            t: [
                c
                for c in cells
                if (c["workload"], c["dimension"], c["mode"], c["tokenizer"])
                == (workload, dimension, HEAD_MODE, t)
            ]
            for t in tokenizers
        }
        if not any(mine.values()):
            continue
        rows: list[tuple[str, Callable[[list[dict[str, Any]]], Judged]]] = [
            ("Never over: ground truth <= budget, every level", _never_over),
            (f"Usable >= {USABLE_GOAL:.0%}, lowest cell mean", _usable),
            (
                f"Spent before the first refusal >= {BEFORE_REFUSAL_GOAL:.0%}, {top} streams "
                "(mean / worst)",
                lambda cs: _before_refusal(cs, top),
            ),
            ("budget_busy per tenant, by streams", _busy),
        ]
        for goal, judge in rows:
            shown = [_mark(*judge(mine[t])) if mine[t] else "—" for t in tokenizers]
            where = f"{workload}, {BUDGET_NAMES.get(dimension, dimension)}"
            lines.append(f"| {where} | {goal} | " + " | ".join(shown) + " |")
    lines += [
        "",
        "Every cell (a row per workload, budget, mode and tokenizer at a concurrency):",
        "",
        "| Streams | Workload | Budget | Mode | Tokenizer | Worst overshoot (ground truth) "
        "| Usable (mean) | Spent before the first refusal (mean / worst) "
        "| budget_busy per tenant | Failed requests per tenant | Queue wait p50 / p99 "
        "| Tenant-runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(cells, key=_order):
        s = c["summary"]
        lines.append(
            f"| {c['concurrency']} | {c['workload']} | {BUDGET_NAMES.get(c['dimension'])} "
            f"| {c['label']} | `{c['tokenizer']}` | {_over(s['worst_overshoot_ground_truth'])} "
            f"| {share(s['usable_mean'])} | {before_refusal(s)} "
            f"| {num(s['busy_per_tenant'], 0)} | {num(s['failed_per_tenant'])} "
            f"| {queue_wait(s)} | {s['tenant_runs']} |"
        )
    left = max(c["summary"]["reserved_left_max"] for c in cells)
    errors = sum(c["summary"]["errors"] for c in cells)
    lines += [
        "",
        f"Reserved budget left after traffic stopped, across every cell: {left}. Client "
        f"errors: {errors}. Bound / billed input: the gateway's upper-bound input estimate "
        "over the prompt tokens the mock bills (tiktoken cl100k_base).",
    ]
    return "\n".join(lines)


def _price(p: dict[str, Any], which: str) -> str:
    return f"{p['prices_usd_per_million'][which]:g}"


def _minutes(data: dict[str, Any]) -> str:
    seconds = data.get("seconds")
    return "" if seconds is None else f" of {seconds / 60:.0f} min"


def _label(cells: list[dict[str, Any]]) -> str:
    return next((c["label"] for c in cells if c["mode"] == HEAD_MODE), HEAD_MODE)


def _order(c: dict[str, Any]) -> tuple[int, str, str, bool, str]:
    return (
        -c["concurrency"],
        c["workload"],
        c["dimension"],
        c["mode"] != HEAD_MODE,
        c["tokenizer"],
    )


def _mark(text: str, ok: bool | None) -> str:
    return text if ok is None else f"{text} {'met' if ok else '**missed**'}"


def _over(worst: float) -> str:
    return f"never over ({pct(worst)})" if worst <= 0 else f"**{pct(worst)}**"


def _never_over(cells: list[dict[str, Any]]) -> Judged:
    worst = max(c["summary"]["worst_overshoot_ground_truth"] for c in cells)
    return _over(worst), worst <= 0


def _usable(cells: list[dict[str, Any]]) -> Judged:
    low = min(cells, key=lambda c: c["summary"]["usable_mean"])
    mean = low["summary"]["usable_mean"]
    return f"{share(mean)} ({low['concurrency']} streams)", mean >= USABLE_GOAL


def _before_refusal(cells: list[dict[str, Any]], top: int) -> Judged:
    at = [c for c in cells if c["concurrency"] == top]
    if not at or at[0]["summary"].get("usable_before_refusal_mean") is None:
        return "— (not measured)", None
    s = at[0]["summary"]
    return before_refusal(s), s["usable_before_refusal_mean"] >= BEFORE_REFUSAL_GOAL


def _busy(cells: list[dict[str, Any]]) -> Judged:
    ordered = sorted(cells, key=lambda c: c["concurrency"])
    shown = " / ".join(f"{num(c['summary']['busy_per_tenant'], 0)}" for c in ordered)
    return f"{shown} ({' / '.join(str(c['concurrency']) for c in ordered)})", None
