"""Markdown tables from the benchmark result files, written between markers, never by hand.

Reads bench/results/{overshoot,overhead,ledger,wrk-transport-ab}.json and replaces the blocks
between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` (NAME: ledger, overshoot, overhead,
wrk, speed-goals, levers, goals, overshoot-realistic)
in docs/benchmarks.md, and in README.md where those markers exist (nothing else in either file
changes). Prints the tables too. The output depends only on the JSON: the same files always
give the same bytes.

    PYTHONPATH=. /tmp/venv/bin/python bench/report.py
    PYTHONPATH=. /tmp/venv/bin/python bench/report.py --print-only \
        --overshoot bench/results/overshoot-quick.json --overhead bench/results/overhead-quick.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report_format import before_refusal, failed, ms, num, pct, queue_wait
from bench.report_goals import goals_table
from bench.report_realistic import realistic_tables
from bench.report_speed import levers_table, speed_goals_table, wrk_tables

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODE_ORDER = (
    "count_after",
    "max_tokens",
    "max_tokens_whole",
    "p95_allow",
    "p95_truncate",
    "p95_truncate_whole",
)


def over(worst: float, tokens: int) -> str:
    """A worst overshoot: the share and the tokens, or 'never over' with the closest approach."""
    if worst <= 0:
        return f"never over ({pct(worst)})"
    return f"**{pct(worst)}** (+{tokens:,} tok)"


def _cells(data: dict[str, Any]) -> list[dict[str, Any]]:
    order = {m: i for i, m in enumerate(MODE_ORDER)}
    return sorted(data["cells"], key=lambda c: (-c["concurrency"], order.get(c["mode"], 99)))


def overshoot_tables(data: dict[str, Any], source: str) -> str:
    """The headline table at the highest concurrency, then the sweep."""
    cells = _cells(data)
    p = data["parameters"]
    top = max(c["concurrency"] for c in cells)
    lines = [
        f"{top} streams per tenant, {p['gateway_processes']} gateway processes, "
        f"{p['budget_tokens']:,}-token budget, mock pace {p['mock_pace_ms']:g} ms/token "
        f"({source}, {'complete' if data.get('complete') else 'INCOMPLETE'} run, "
        f"commit `{(data['machine'].get('git_commit') or 'unknown')[:10]}`):",
        "",
        "| Mode | Worst overshoot (ground truth) | Mean | Ledger, worst | Budget usable "
        "| budget_busy per tenant | Truncated streams per tenant | Reserved left | Tenant-runs "
        "| Usable before the first refusal (mean / worst) | Queue wait p50 / p99 "
        "| Failed requests per tenant (SDK client) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        if c["concurrency"] != top:
            continue
        s = c["summary"]
        worst = over(s["worst_overshoot_ground_truth"], s["worst_tokens_over_ground_truth"])
        lines.append(
            f"| {c['label']} | {worst} "
            f"| {pct(s['mean_overshoot_ground_truth'])} | {pct(s['worst_overshoot_ledger'])} "
            f"| {min(s['usable_mean'], 1.0) * 100:.1f}%{'+' if s['usable_mean'] > 1 else ''} "
            f"| {num(s['busy_per_tenant'], 0)} | {num(s['truncated_per_tenant'])} "
            f"| {s['reserved_left_max']} | {s['tenant_runs']} "
            f"| {before_refusal(s)} | {queue_wait(s)} | {failed(c)} |"
        )
    levels = sorted({c["concurrency"] for c in cells})
    modes = [m for m in MODE_ORDER if any(c["mode"] == m for c in cells)]
    by = {(c["mode"], c["concurrency"]): c for c in cells}
    labels = {c["mode"]: c["label"] for c in cells}
    header = "| Mode | " + " | ".join(f"{n} streams" for n in levels) + " |"
    rule = "|---|" + "---|" * len(levels)
    sweeps: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        (
            "Worst overshoot against ground truth",
            lambda c: pct(c["summary"]["worst_overshoot_ground_truth"]),
        ),
        (
            "Budget usable (mean; ground truth / budget, capped at 100%)",
            lambda c: f"{min(c['summary']['usable_mean'], 1.0) * 100:.1f}%",
        ),
        ("budget_busy rejections per tenant", lambda c: num(c["summary"]["busy_per_tenant"], 0)),
        ("Truncated streams per tenant", lambda c: num(c["summary"]["truncated_per_tenant"])),
        (
            "Budget spent before the first refusal of any kind (mean / worst tenant-run; "
            "ground truth when the refusal came)",
            lambda c: before_refusal(c["summary"]),
        ),
        ("Admission queue wait, p50 / p99 over every answer", lambda c: queue_wait(c["summary"])),
        (
            "Requests failed per tenant by a client retrying as the openai SDK (max_retries 2)",
            failed,
        ),
    ]
    absent = []
    for title, fmt in sweeps:
        if all(fmt(c) == "—" for c in cells):
            name = title.split(" (")[0]
            absent.append(name[0].lower() + name[1:])  # a column an older run did not have
            continue
        lines += ["", f"{title}:", "", header, rule]
        for m in modes:
            row = [fmt(by[(m, n)]) if (m, n) in by else "—" for n in levels]
            lines.append(f"| {labels[m]} | " + " | ".join(row) + " |")
    if absent:
        lines += ["", f"Not measured in this result file: {'; '.join(absent)}."]
    runs = sorted({(c["concurrency"], c["runs"], c["tenants"]) for c in cells})
    lines += [
        "",
        "Tenant-runs per cell: "
        + ", ".join(f"{n} streams: {r} run{'s' if r > 1 else ''} x {t} tenants" for n, r, t in runs)
        + ". Reserved tokens left after traffic stopped, across every cell: "
        f"{max(c['summary']['reserved_left_max'] for c in cells)}. Client errors: "
        f"{sum(c['summary']['errors'] for c in cells)}.",
    ]
    return "\n".join(lines)


def overhead_tables(data: dict[str, Any], source: str) -> str:
    """Added latency per load, saturation of one worker, Redis round trips per request."""
    lines = [
        f"One gateway worker process, open-loop, latency from each request's scheduled send "
        f"time ({source}, {'complete' if data.get('complete') else 'INCOMPLETE'} run, "
        f"commit `{(data['machine'].get('git_commit') or 'unknown')[:10]}`):",
        "",
        *_latency_rows(data, data.get("added_latency", [])),
    ]
    plain = data.get("added_latency_asyncio_h11")
    if plain:
        lines += [
            "",
            f"The same worker with uvloop and httptools hidden from uvicorn "
            f"({data.get('server_asyncio_h11', 'asyncio + h11')}):",
            "",
            *_latency_rows(data, plain),
        ]
    lines += [
        "",
        "| Saturation of one worker | Redis parser, server | Highest sustained rate "
        "| Gateway CPU per request there | Next rate tried | Closed-loop capacity |",
        "|---|---|---|---|---|---|",
    ]
    for label, name in SET_UPS:
        s = data.get(f"saturation_{label}")
        if not s:
            continue
        server = data.get(f"server_{label}")
        rate = s["sustained_max_rate"]
        at = [b for b in s.get("blocks", []) if b.get("rate") == rate]
        after = [b for b in s.get("blocks", []) if rate is not None and b.get("rate", 0) > rate]
        lines.append(
            f"| {name} | `{data.get(f'parser_{label}', '?')}`"
            f"{f', {server}' if server else ''} | "
            f"{'none of the rates tried' if rate is None else f'{rate:,.0f} req/s'} "
            f"| {_cpu_per_request(at[0]) if at else '—'} | {_collapse(after[0]) if after else '—'} "
            f"| {s['closed_loop']['requests_per_second']:,.0f} req/s |"
        )
    lines += [
        "",
        "| Redis round trips per request | Reply | Round trips | Of which EVALSHA |",
        "|---|---|---|---|",
    ]
    for rt in data.get("round_trips", []):
        what = f"{rt['route']}, {'streamed' if rt['stream'] else 'not streamed'}"
        lines.append(
            f"| {what} | {rt['reply_tokens']} tokens | {rt['round_trips_per_request']:.2f} "
            f"| {rt['client_commands_per_request'].get('evalsha', 0):.2f} |"
        )
    return "\n".join(lines)


SET_UPS = (
    ("hiredis", "as shipped"),
    ("no_hiredis", "without hiredis"),
    ("asyncio_h11", "without uvloop and httptools"),
)


def _latency_rows(data: dict[str, Any], added: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| Load | Direct p50 / p99 | Through Hardcap p50 / p99 | Added p50 | Added p99 |",
        "|---|---|---|---|---|",
    ]
    for a in added:
        kind = "" if a["kind"] == "non_stream" else f", streaming ({_tokens(data, a)} tokens)"
        lines.append(
            f"| {a['rate']:,.0f} req/s{kind} | {num(a['direct_p50_ms'], 2)} / "
            f"{num(a['direct_p99_ms'], 2)} ms | {num(a['gateway_p50_ms'], 2)} / "
            f"{num(a['gateway_p99_ms'], 2)} ms | {ms(a['added_p50_ms'])} "
            f"| {ms(a['added_p99_ms'])} |"
        )
    return lines


def _cpu_per_request(b: dict[str, Any]) -> str:
    cpu = sum(v for k, v in b.get("cpu", {}).get("cpu_seconds", {}).items() if "gateway" in k)
    return f"{cpu / b['ok'] * 1000:.1f} ms" if b.get("ok") else "—"


def _collapse(b: dict[str, Any]) -> str:
    """What the first rate past the sustained one did: completions/s, p50, failures."""
    fails = sum(b.get("failures", {}).values())
    return (
        f"{b['rate']:,.0f} req/s offered: {num(b.get('achieved_per_second'), 0)} completed/s, "
        f"p50 {num(b.get('p50_ms'), 0)} ms, {fails} failed"
    )


def _tokens(data: dict[str, Any], a: dict[str, Any]) -> int:
    return int(data["parameters"].get("stream_tokens", 0))


def replace_block(text: str, name: str, block: str) -> str:
    """``text`` with the part between the ``name`` markers replaced; unchanged if absent."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    return pattern.sub(lambda _: f"{start}\n{block}\n{end}", text)


def update(path: Path, blocks: dict[str, str]) -> bool:
    """Rewrite ``path``'s marked blocks; True if the file changed."""
    if not path.exists():
        return False
    old = path.read_text()
    new = old
    for name, block in blocks.items():
        new = replace_block(new, name, block)
    if new != old:
        path.write_text(new)
    return new != old


def ledger_tables(data: dict[str, Any], source: str) -> str:
    """Admit+settle throughput from one process, and the server's own cost per script call."""
    rows = [
        "| parser | calls in flight | admit+settle pairs/s | pair p50 ms | pair p99 ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for t in data["results"]["throughput"]:
        rows.append(
            f"| {t['parser']} | {t['inflight']} | {t['pairs_per_s']:.0f} "
            f"| {t['pair_ms_p50']:.2f} | {t['pair_ms_p99']:.2f} |"
        )
    rows += ["", "| script | server µs per call |", "|---|---:|"]
    for name, v in data["results"]["server"].items():
        rows.append(f"| {name} | {v['usec_per_call']:.0f} |")
    m = data["machine"]
    cpu = m.get("cpu_model") or m.get("cpu") or "?"
    rows += [
        "",
        f"From {source}, made by `{data['command']}` on {data['created'][:10]} "
        f"({cpu}, {m.get('cores', m.get('cpu_count', '?'))} cores; load average "
        f"{[round(x, 1) for x in data.get('load_average_before') or []]}: a shared machine, so "
        "read these as rough).",
    ]
    return "\n".join(rows)


def build(
    overshoot: Path | None,
    overhead: Path | None,
    ledger: Path | None = None,
    wrk: Path | None = None,
    levers: Path | None = None,
    realistic: Path | None = None,
) -> dict[str, str]:
    blocks = {}
    if realistic and realistic.exists():
        data = json.loads(realistic.read_text())
        blocks["overshoot-realistic"] = realistic_tables(data, _rel(realistic))
    if levers and levers.exists():
        blocks["levers"] = levers_table(json.loads(levers.read_text()), _rel(levers))
    if wrk and wrk.exists():
        data = json.loads(wrk.read_text())
        blocks["wrk"] = wrk_tables(data, _rel(wrk))
        blocks["speed-goals"] = speed_goals_table(data)
    if ledger and ledger.exists():
        blocks["ledger"] = ledger_tables(json.loads(ledger.read_text()), _rel(ledger))
    shoot = json.loads(overshoot.read_text()) if overshoot and overshoot.exists() else None
    head = json.loads(overhead.read_text()) if overhead and overhead.exists() else None
    if shoot and overshoot:
        blocks["overshoot"] = overshoot_tables(shoot, _rel(overshoot))
    if head and overhead:
        blocks["overhead"] = overhead_tables(head, _rel(overhead))
    if shoot or head:
        blocks["goals"] = goals_table(shoot, head)
    return blocks


def _rel(path: Path) -> str:
    try:
        return f"`{path.resolve().relative_to(ROOT)}`"
    except ValueError:
        return f"`{path.name}`"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--overshoot", type=Path, default=RESULTS / "overshoot.json")
    p.add_argument("--overhead", type=Path, default=RESULTS / "overhead.json")
    p.add_argument("--ledger", type=Path, default=RESULTS / "ledger.json")
    p.add_argument("--wrk", type=Path, default=RESULTS / "wrk-transport-ab.json")
    p.add_argument("--levers", type=Path, default=RESULTS / "levers.json")
    p.add_argument("--realistic", type=Path, default=RESULTS / "overshoot-realistic.json")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md")
    p.add_argument("--readme", type=Path, default=ROOT / "README.md")
    p.add_argument("--print-only", action="store_true")
    ns = p.parse_args(argv)
    blocks = build(ns.overshoot, ns.overhead, ns.ledger, ns.wrk, ns.levers, ns.realistic)
    for name, block in blocks.items():
        print(f"<!-- bench:{name} -->\n{block}\n<!-- /bench:{name} -->\n")
    if not ns.print_only:
        for path in (ns.doc, ns.readme):
            if update(path, blocks):
                print(f"updated {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
