"""Markdown tables from the benchmark result files, written between markers, never by hand.

Reads the published results of bench/catalogue.py and replaces the blocks between
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` (NAME: one of :data:`BLOCKS`) in
docs/benchmarks.md, docs/design.md, docs/coldstart.md, docs/deploy.md (its cold start table),
README.md (its headline block) and bench/README.md (the catalogue: one row per published result);
nothing else in those files changes. Prints the tables too. The output
depends only on the JSON and the git history: the same files at one commit give the same bytes.

Each table's caption says the commit its result measured and, when the code the result
measures (the catalogue's ``measures``) changed after that commit, where. A result whose stored
command holds an absolute path cannot be rerun elsewhere: it is refused (its tables are not
regenerated), named on stderr, and the exit status is 1.

    python -m bench report
    python -m bench report --print-only --overshoot /tmp/overshoot.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.catalogue import published
from bench.lib.freshness import check
from bench.lib.report_catalogue import catalogue_table
from bench.lib.report_coldstart import coldstart_now
from bench.lib.report_coldstart_phases import RUNS as PHASE_RUNS
from bench.lib.report_coldstart_phases import coldstart_phases_table
from bench.lib.report_coldstart_server import coldstart_server_table
from bench.lib.report_coldstart_transports import coldstart_transports_table
from bench.lib.report_cut_charge import cut_charge_fanout_table, cut_charge_table
from bench.lib.report_failover import failover_table
from bench.lib.report_format import before_refusal, failed, ms, num, pct, queue_wait
from bench.lib.report_goals import goals_table
from bench.lib.report_headline import headline_table
from bench.lib.report_input_estimate import input_estimate_table
from bench.lib.report_lambda import lambda_share_table
from bench.lib.report_ledger import RUNS as LEDGER_RUNS
from bench.lib.report_ledger import ledger_runs_table
from bench.lib.report_loop_lag import SHED_RUNS, loop_lag_table
from bench.lib.report_meter_starved import METERS, meter_starved_table
from bench.lib.report_pipe_ab import pipe_ab_table
from bench.lib.report_propagation import propagation_table
from bench.lib.report_realistic import realistic_tables
from bench.lib.report_redis_clients import redis_clients_table
from bench.lib.report_speed import levers_table, speed_goals_table, wrk_tables
from bench.lib.report_tokenizer import tokenizer_table
from bench.lib.report_tpm import LIMITERS as TPM_RUNS
from bench.lib.report_tpm import tpm_table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
# Every generated block, by marker name: the result files it is made from. A marker in the docs
# without an entry here, or an entry without a marker, fails bench/tests/test_markers.py.
BLOCKS = {
    "goals": "overshoot.json, overhead.json",
    "overshoot": "overshoot.json",
    "overshoot-realistic": "overshoot-realistic.json",
    "tpm-window": "tpm-window.json, tpm-window-before.json",
    "live-config-propagation": "live-config-propagation.json",
    "wrk": "wrk-overhead.json",
    "speed-goals": "wrk-overhead.json",
    "levers": "levers.json",
    "lambda-share": "lambda-share.json",
    "ledger": "ledger.json",
    "ledger-runs": "ledger*.json",
    "overhead": "overhead.json",
    "failover": "failover.json",
    "headline": "overshoot.json, wrk-overhead.json, lambda-share.json, failover.json",
    "coldstart-now": "coldstart-artifact-head.json",
    "tokenizer-cost": "tokenizer-cost.json",
    "redis-clients": "redis-clients.json",
    "pipe-ab": "wrk-pipe-ab.json",
    "coldstart-phases": "coldstart-phases.json, coldstart-phases-before.json",
    "coldstart-transports": "coldstart-transports.json",
    "coldstart-server": "coldstart-server.json",
    "input-estimate": "input-estimate.json",
    "meter-starved": "overshoot-starved.json, -time-only.json, -before.json",
    "cut-charge": "cut-charge.json",
    "cut-charge-fanout": "cut-charge-fanout.json",
    "cut-charge-fanout-starved": "cut-charge-fanout-starved.json, -starved-before.json",
    "loop-lag": "loop-lag.json, loop-lag-shed-500.json, loop-lag-shed-1000.json",
    "catalogue": "bench/catalogue.py and every result file",
}
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


def measured(path: Path) -> str:
    """The caption line saying which commit ``path`` measured and whether its code changed since."""
    bench = published().get(path.name)
    measures = bench.measures if bench else ("hardcap_core",)
    return f"_{_rel(path)}: {check(path, measures).caption()}._"


def refused(path: Path) -> bool:
    """True if ``path``'s stored command holds an absolute path (so it cannot be rerun as is)."""
    bench = published().get(path.name)
    return check(path, bench.measures if bench else ("hardcap_core",)).absolute


def build(
    overshoot: Path | None,
    overhead: Path | None,
    ledger: Path | None = None,
    wrk: Path | None = None,
    levers: Path | None = None,
    realistic: Path | None = None,
    lambda_share: Path | None = None,
    refuse: list[Path] | None = None,
    failover: Path | None = None,
    tpm: Path | None = None,
    propagation: Path | None = None,
    coldstart: Path | None = None,
    tokenizer: Path | None = None,
    redis_clients: Path | None = None,
    pipe_ab: Path | None = None,
    phases: Path | None = None,
    transports: Path | None = None,
    servers: Path | None = None,
    input_estimate: Path | None = None,
    starved: Path | None = None,
    cut_charge: Path | None = None,
    loop_lag: Path | None = None,
) -> dict[str, str]:
    """The blocks by marker name; a result in ``refuse`` (or refused now) makes no block."""
    refusals = refuse if refuse is not None else []

    def read(path: Path | None) -> dict[str, Any] | None:
        if not path or not path.exists():
            return None
        if refused(path):
            refusals.append(path)
            return None
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def stamp(block: str, path: Path) -> str:
        return f"{block}\n\n{measured(path)}"

    blocks = {}
    headline: dict[str, dict[str, Any]] = {}
    if realistic and (data := read(realistic)):
        blocks["overshoot-realistic"] = stamp(realistic_tables(data, _rel(realistic)), realistic)
    if levers and (data := read(levers)):
        blocks["levers"] = stamp(levers_table(data, _rel(levers)), levers)
    if wrk and (data := read(wrk)):
        blocks["wrk"] = stamp(wrk_tables(data, _rel(wrk)), wrk)
        blocks["speed-goals"] = stamp(speed_goals_table(data), wrk)
        headline["wrk-overhead.json"] = data
    if ledger and (data := read(ledger)):
        blocks["ledger"] = stamp(ledger_tables(data, _rel(ledger)), ledger)
        runs = {name: read(ledger.with_name(name)) for name, _ in LEDGER_RUNS}
        present = {name: data for name, data in runs.items() if data}
        blocks["ledger-runs"] = stamp(ledger_runs_table(present), ledger)
    if failover and (data := read(failover)):
        blocks["failover"] = stamp(failover_table(data), failover)
        headline["failover.json"] = data
    if lambda_share and (data := read(lambda_share)):
        blocks["lambda-share"] = stamp(lambda_share_table(data), lambda_share)
        headline["lambda-share.json"] = data
    if tpm:
        tpm_runs: dict[str, dict[str, Any]] = {}
        for name, _ in TPM_RUNS:
            if data := read(tpm.with_name(name)):
                tpm_runs[name] = data
        if tpm_runs:
            captions = "  \n".join(measured(tpm.with_name(name)) for name in tpm_runs)
            blocks["tpm-window"] = f"{tpm_table(tpm_runs)}\n\n{captions}"
    if propagation and (data := read(propagation)):
        blocks["live-config-propagation"] = stamp(propagation_table(data), propagation)
    if coldstart and (data := read(coldstart)):
        blocks["coldstart-now"] = stamp(coldstart_now(data), coldstart)
    if tokenizer and (data := read(tokenizer)):
        blocks["tokenizer-cost"] = stamp(tokenizer_table(data), tokenizer)
    if redis_clients and (data := read(redis_clients)):
        blocks["redis-clients"] = stamp(redis_clients_table(data), redis_clients)
    if pipe_ab and (data := read(pipe_ab)):
        blocks["pipe-ab"] = stamp(pipe_ab_table(data), pipe_ab)
    if phases:
        phase_runs: dict[str, dict[str, Any]] = {}
        for name in dict.fromkeys(n for n, _, _ in PHASE_RUNS):
            if run := read(phases.with_name(name)):
                phase_runs[name] = run
        if phase_runs:
            captions = "  \n".join(measured(phases.with_name(name)) for name in phase_runs)
            blocks["coldstart-phases"] = f"{coldstart_phases_table(phase_runs)}\n\n{captions}"
    if transports and (data := read(transports)):
        blocks["coldstart-transports"] = stamp(coldstart_transports_table(data), transports)
    if servers and (data := read(servers)):
        blocks["coldstart-server"] = stamp(coldstart_server_table(data), servers)
    if input_estimate and (data := read(input_estimate)):
        blocks["input-estimate"] = stamp(input_estimate_table(data), input_estimate)
    if starved:
        meters = {name: data for name, _ in METERS if (data := read(starved.with_name(name)))}
        if meters:
            captions = "  \n".join(measured(starved.with_name(name)) for name in meters)
            blocks["meter-starved"] = f"{meter_starved_table(meters)}\n\n{captions}"
    if cut_charge and (data := read(cut_charge)):
        blocks["cut-charge"] = stamp(cut_charge_table(data), cut_charge)
    fanout = cut_charge.with_name("cut-charge-fanout.json") if cut_charge else None
    if fanout and (data := read(fanout)):
        blocks["cut-charge-fanout"] = stamp(cut_charge_fanout_table(data), fanout)
    starved = {
        label: (path, data)
        for label, name in (("before", "-starved-before"), ("now", "-starved"))
        if fanout and (data := read(path := fanout.with_name(f"cut-charge-fanout{name}.json")))
    }
    if starved:
        tables = [f"{label}:\n\n{cut_charge_fanout_table(d)}" for label, (_, d) in starved.items()]
        captions = "  \n".join(measured(path) for path, _ in starved.values())
        blocks["cut-charge-fanout-starved"] = "\n\n".join([*tables, captions])
    if loop_lag and (data := read(loop_lag)):
        shed = {name: run for name in SHED_RUNS if (run := read(loop_lag.with_name(name)))}
        captions = "  \n".join(
            measured(loop_lag.with_name(name)) for name in [loop_lag.name, *shed]
        )
        blocks["loop-lag"] = f"{loop_lag_table(data, shed)}\n\n{captions}"
    shoot = read(overshoot)
    head = read(overhead)
    if shoot and overshoot:
        blocks["overshoot"] = stamp(overshoot_tables(shoot, _rel(overshoot)), overshoot)
        headline["overshoot.json"] = shoot
    if head and overhead:
        blocks["overhead"] = stamp(overhead_tables(head, _rel(overhead)), overhead)
    if shoot or head:
        sources = [path for path, data in ((overshoot, shoot), (overhead, head)) if path and data]
        stamps = "  \n".join(measured(path) for path in sources)
        blocks["goals"] = goals_table(shoot, head) + "\n\n" + stamps
    if headline:
        sources = {"overshoot.json": overshoot, "wrk-overhead.json": wrk}
        sources |= {"lambda-share.json": lambda_share, "failover.json": failover}
        stamps = [measured(path) for name, path in sources.items() if path and name in headline]
        blocks["headline"] = headline_table(headline) + "\n\n" + "  \n".join(stamps)
    return blocks


def _rel(path: Path) -> str:
    try:
        return f"`{path.resolve().relative_to(ROOT)}`"
    except ValueError:
        return f"`{path.name}`"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--results", type=Path, default=RESULTS, help="where the result files are")
    p.add_argument("--overshoot", type=Path, help="default RESULTS/overshoot.json")
    p.add_argument("--overhead", type=Path, help="default RESULTS/overhead.json")
    p.add_argument("--ledger", type=Path, help="default RESULTS/ledger.json")
    p.add_argument("--wrk", type=Path, help="default RESULTS/wrk-overhead.json")
    p.add_argument("--levers", type=Path, help="default RESULTS/levers.json")
    p.add_argument("--realistic", type=Path, help="default RESULTS/overshoot-realistic.json")
    p.add_argument("--lambda-share", type=Path, help="default RESULTS/lambda-share.json")
    p.add_argument("--failover", type=Path, help="default RESULTS/failover.json")
    p.add_argument("--tpm", type=Path, help="default RESULTS/tpm-window.json (and -before beside)")
    p.add_argument("--propagation", type=Path, help="default RESULTS/live-config-propagation.json")
    p.add_argument("--coldstart", type=Path, help="default RESULTS/coldstart-artifact-head.json")
    p.add_argument("--tokenizer", type=Path, help="default RESULTS/tokenizer-cost.json")
    p.add_argument("--redis-clients", type=Path, help="default RESULTS/redis-clients.json")
    p.add_argument("--pipe-ab", type=Path, help="default RESULTS/wrk-pipe-ab.json")
    p.add_argument("--input-estimate", type=Path, help="default RESULTS/input-estimate.json")
    p.add_argument("--starved", type=Path, help="default RESULTS/overshoot-starved.json (+ beside)")
    p.add_argument("--cut-charge", type=Path, help="default RESULTS/cut-charge.json (+ -fanout)")
    p.add_argument("--loop-lag", type=Path, help="default RESULTS/loop-lag.json (+ -shed-* beside)")
    p.add_argument("--phases", type=Path, help="default RESULTS/coldstart-phases.json (+ before)")
    p.add_argument("--transports", type=Path, help="default RESULTS/coldstart-transports.json")
    p.add_argument("--servers", type=Path, help="default RESULTS/coldstart-server.json")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md")
    p.add_argument("--readme", type=Path, default=ROOT / "README.md")
    p.add_argument("--coldstart-doc", type=Path, default=ROOT / "docs" / "coldstart.md")
    p.add_argument("--deploy-doc", type=Path, default=ROOT / "docs" / "deploy.md")
    p.add_argument("--design-doc", type=Path, default=ROOT / "docs" / "design.md")
    p.add_argument("--catalogue", type=Path, default=ROOT / "bench" / "README.md")
    p.add_argument("--print-only", action="store_true")
    ns = p.parse_args(argv)
    res: Path = ns.results

    def given(path: Path | None, name: str) -> Path:
        return path if path is not None else res / name

    refusals: list[Path] = []
    blocks = build(
        given(ns.overshoot, "overshoot.json"), given(ns.overhead, "overhead.json"),
        given(ns.ledger, "ledger.json"), given(ns.wrk, "wrk-overhead.json"),
        given(ns.levers, "levers.json"), given(ns.realistic, "overshoot-realistic.json"),
        given(ns.lambda_share, "lambda-share.json"), refuse=refusals,
        failover=given(ns.failover, "failover.json"), tpm=given(ns.tpm, "tpm-window.json"),
        propagation=given(ns.propagation, "live-config-propagation.json"),
        coldstart=given(ns.coldstart, "coldstart-artifact-head.json"),
        tokenizer=given(ns.tokenizer, "tokenizer-cost.json"),
        redis_clients=given(ns.redis_clients, "redis-clients.json"),
        pipe_ab=given(ns.pipe_ab, "wrk-pipe-ab.json"),
        phases=given(ns.phases, "coldstart-phases.json"),
        transports=given(ns.transports, "coldstart-transports.json"),
        servers=given(ns.servers, "coldstart-server.json"),
        input_estimate=given(ns.input_estimate, "input-estimate.json"),
        starved=given(ns.starved, "overshoot-starved.json"),
        cut_charge=given(ns.cut_charge, "cut-charge.json"),
        loop_lag=given(ns.loop_lag, "loop-lag.json"),
    )  # fmt: skip
    catalogue = {"catalogue": catalogue_table(res, check)}
    refusals += [
        res / name
        for name, bench in published().items()
        if (res / name).exists() and check(res / name, bench.measures).absolute
    ]
    for name, block in {**blocks, **catalogue}.items():
        print(f"<!-- bench:{name} -->\n{block}\n<!-- /bench:{name} -->\n")
    if not ns.print_only:
        docs = (ns.doc, ns.readme, ns.coldstart_doc, ns.deploy_doc, ns.design_doc)
        for path, wanted in (*((d, blocks) for d in docs), (ns.catalogue, catalogue)):
            if update(path, wanted):
                print(f"updated {path}", file=sys.stderr)
    for path in sorted(set(refusals)):
        print(f"refused {_rel(path)}: its stored command holds an absolute path", file=sys.stderr)
    return 1 if refusals else 0


if __name__ == "__main__":
    sys.exit(main())
