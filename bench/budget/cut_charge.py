"""What the ledger charges a stream the gateway cut, against what the provider generated for it.

A cut stream (truncate policy: the budget could not grow, so the gateway ended it with
finish_reason "length" and closed the upstream) is charged what it forwarded and held, plus
the meter's in-flight estimate up to its hold. The provider meanwhile generated what it had
made by the time the close reached it. This measures, per cut stream,

    error = charged - generated

where *charged* is the ``completion_tokens`` of the gateway's closing usage chunk (the gateway
shows the client the settled charge) and *generated* is what the mock upstream recorded for
that very request (GET /mock/requests, keyed by the request's ``metadata.hardcap_bench_id``).
A stream counts as cut when the client saw finish_reason "length" AND the mock recorded the
request aborted (so the model's own max_tokens cap, which the mock finishes, is excluded).

Scenarios are (route, streams per tenant): a p95 + truncate route and a max_tokens (truncate)
route; several tenants with a small total_tokens budget each spend it at once through
``--gateways`` ``hardcap serve`` processes sharing one private Valkey. Clients retry
``budget_busy`` after Retry-After (capped at ``--max-pause``) until ``budget_exceeded``.
Each run starts from fresh budgets (every Valkey key but the p95 estimators' deleted) and a
reset mock; the p95 route is warmed once with non-streamed replies on a separate tenant.

Each run also sums what the mock billed each tenant (prompt and completion tokens of every
request it recorded for it, cut or not): the share of the budget spent on billed tokens, and
whether any tenant was billed past its budget. ``--fanout`` is the lease-sized case of
tests/e2e/test_leases.py: one tenant, a 20,000-token budget, 100 streams at once over the two
gateways, a provider of 500 tokens a second (2 ms a token), three runs. ``--starve N`` runs N
busy-loop processes beside each scenario's runs (bench/lib/starve.py), so the gateways' loops
run late as on a loaded machine: the case where the old charge paid for the lag.

    python -m bench cut_charge            # < 3 min
    python -m bench cut_charge --quick    # about 1 min
    python -m bench cut_charge --fanout   # about 1 min
    python -m bench cut_charge --fanout --starve 2   # the same, beside 2 busy processes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis
from tqdm import tqdm  # type: ignore[import-untyped]

from bench.budget.budget_runs import (
    MAX_TOKENS,
    MODES,
    Mode,
    choose_window,
    flush_tenants,
    warm_up,
    warmup_entries,
)
from bench.lib import stack, starve
from bench.lib.machine import CpuWatch, machine_info, pids_of, write_json
from hardcap_core.local.valkey import LocalValkey
from tests.load.harness import REQUEST_TIMEOUT_S, chat_body, retry_after_s
from tests.load.http1 import Client, ProtocolError

RESULTS = Path(__file__).resolve().parents[1] / "results"
SCENARIO_MODES = ("p95_truncate", "max_tokens")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="about 1 minute: 32 streams only")
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/cut-charge.json)")
    p.add_argument("--concurrency", default="8,32,64", help="streams per tenant")
    p.add_argument("--tenants", type=int, default=8, help="tenants spending at once")
    p.add_argument("--budget", type=int, default=3000, help="total_tokens budget per tenant")
    p.add_argument("--runs", type=int, default=1, help="fresh-budget runs per scenario")
    p.add_argument("--pace-ms", type=float, default=10.0, help="mock ms per token")
    p.add_argument("--gateways", type=int, default=2, help="gateway processes")
    p.add_argument("--warmup", type=int, default=300, help="replies that warm the p95 route")
    p.add_argument("--max-pause", type=float, default=1.0, help="longest budget_busy pause, s")
    p.add_argument("--time-limit", type=float, default=30.0, help="s per run, at most")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--fanout", action="store_true", help="one tenant, 20,000 tokens, 100 streams, 2 ms"
    )
    p.add_argument(
        "--starve", type=int, default=0, help="busy-loop processes (nice 0) beside every scenario"
    )
    ns = p.parse_args(argv)
    if ns.quick:
        ns.concurrency, ns.runs = "32", 1
    if ns.fanout:
        ns.tenants, ns.budget, ns.concurrency, ns.pace_ms, ns.runs = 1, 20_000, "100", 2.0, 3
    return ns


def build_config(
    mock_url: str, redis_url: str, modes: list[Mode], tenants: list[str], budget: int, window: str
) -> dict[str, Any]:
    """One route per mode, each tenant with one total_tokens budget, and the warm-up tenant."""
    data = stack.base_config(mock_url, redis_url, reservation_ttl_seconds=120)
    data["routes"] = [
        stack.mock_route(m.name, max_output_tokens=MAX_TOKENS, **m.route) for m in modes
    ]
    data["tenants"] = [stack.tenant_entry(t, budget, window) for t in tenants]
    data["tenants"] += warmup_entries(window)
    return data


async def stream(client: Client, key: str, body: bytes) -> dict[str, Any]:
    """One streamed request: its status, the 429 code and headers, or the finish reason and
    the usage of the closing chunk (the charge)."""
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    async with client.stream("POST", "/chat/completions", body, headers) as r:
        if r.status != 200:
            raw = await r.read()
            code = json.loads(raw)["error"]["code"] if r.status == 429 else None
            return {"status": r.status, "code": code, "headers": r.headers}
        buffer = b""
        async for piece in r.chunks():
            buffer += piece
    finish, usage, error = None, None, False
    for event in buffer.split(b"\n\n"):
        if not event.startswith(b"data: ") or event == b"data: [DONE]":
            continue
        chunk = json.loads(event[6:])
        error = error or "error" in chunk
        for choice in chunk.get("choices") or ():
            finish = choice.get("finish_reason") or finish
        usage = chunk.get("usage") or usage
    return {"status": 200, "finish": finish, "usage": usage, "error": error}


async def spend(
    urls: list[str], tenant: str, model: str, concurrency: int, ns: argparse.Namespace, seed: int
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """``tenant`` spends its budget with ``concurrency`` streams until budget_exceeded: the
    streams that got a 200 (id, finish, usage) and counts of the other outcomes."""
    rng = random.Random(seed)
    key = stack.tenant_key(tenant)
    clients = [Client(u, max_connections=concurrency) for u in urls]
    done = asyncio.Event()
    started = time.monotonic()
    streams: list[dict[str, Any]] = []
    counts = {"busy": 0, "exceeded": 0, "errors": 0}

    async def worker(i: int) -> None:
        n = 0
        while not done.is_set() and time.monotonic() - started < ns.time_limit:
            bench_id = f"{tenant}-{model}-{concurrency}-{i}-{n}"
            body = chat_body(tenant, model, MAX_TOKENS)
            body["metadata"] = {"hardcap_bench_id": bench_id}
            n += 1
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    got = await stream(clients[n % len(clients)], key, json.dumps(body).encode())
            except (OSError, ProtocolError, asyncio.IncompleteReadError, TimeoutError):
                counts["errors"] += 1
                continue
            if got["status"] == 200:
                streams.append({"id": bench_id, "tenant": tenant, **got})
            elif got["code"] == "budget_busy":
                counts["busy"] += 1
                pause = retry_after_s(got["headers"]) * rng.uniform(1.0, 1.2)
                await asyncio.sleep(min(pause, ns.max_pause))
            elif got["code"] == "budget_exceeded":
                counts["exceeded"] += 1
                done.set()
            else:
                counts["errors"] += 1
                await asyncio.sleep(0.05)

    try:
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    finally:
        for c in clients:
            await c.aclose()
    return streams, counts


def mock_records(mock_url: str, ids: set[str], settle_s: float = 30.0) -> dict[str, Any]:
    """GET /mock/requests once none of ``ids`` is still in flight (bounded wait)."""
    deadline = time.monotonic() + settle_s
    while True:
        records: dict[str, Any] = httpx.get(f"{mock_url}/mock/requests", timeout=30).json()
        busy = [i for i in ids if records.get(i, {}).get("state") == "in_flight"]
        if not busy or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def run_scenario(
    ns: argparse.Namespace,
    mode: Mode,
    conc: int,
    run: int,
    urls: list[str],
    mock_url: str,
    redis_url: str,
    tenants: list[str],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One run: fresh budgets, every tenant spends at once, then join with the mock's record."""
    flush_tenants(redis_url)
    httpx.post(f"{mock_url}/mock/reset", timeout=10).raise_for_status()

    async def drive() -> list[tuple[list[dict[str, Any]], dict[str, int]]]:
        return await asyncio.gather(
            *(
                spend(urls, t, mode.name, conc, ns, ns.seed * 7919 + conc * 101 + run * 13 + i)
                for i, t in enumerate(tenants)
            )
        )

    outcomes = asyncio.run(drive())
    streams = [s for got, _ in outcomes for s in got]
    records = mock_records(mock_url, {s["id"] for s in streams})
    rows: list[dict[str, Any]] = []
    finished_at_length = 0
    for s in streams:
        record = records.get(s["id"])
        if s["finish"] != "length" or record is None or s["usage"] is None:
            continue
        if record["state"] != "aborted":
            finished_at_length += 1  # the model's own cap, or a cut the mock had finished
            continue
        charged = int(s["usage"]["completion_tokens"])
        generated = int(record["completion_tokens"])
        rows.append(
            {
                "scenario": f"{mode.name} x{conc}",
                "run": run,
                "id": s["id"],
                "tenant": s["tenant"],
                "charged": charged,
                "generated": generated,
                "error": charged - generated,
                "charged_prompt": int(s["usage"]["prompt_tokens"]),
                "billed_prompt": int(record["prompt_tokens"]),
            }
        )
    counts = {k: sum(c[k] for _, c in outcomes) for k in ("busy", "exceeded", "errors")}
    billed = {t: 0 for t in tenants}  # the mock's bill per tenant, every request it recorded
    for rid, record in records.items():
        tenant = rid.split("-", 1)[0]
        if tenant in billed:
            billed[tenant] += int(record.get("prompt_tokens") or 0)
            billed[tenant] += int(record.get("completion_tokens") or 0)
    info = {
        "billed_tokens": billed,
        "streams": len(streams),
        "length_not_aborted": finished_at_length,
        "stream_errors": sum(bool(s["error"]) for s in streams),
        "unjoined": sum(s["id"] not in records for s in streams),
        **counts,
    }
    return rows, info


def p95_consensus(redis_url: str, route: str) -> dict[str, Any]:
    """The route's consensus p95 (what tenants without their own sample reserve)."""
    with redis.Redis.from_url(redis_url, decode_responses=True) as r:
        consensus: dict[str, Any] = r.hgetall(f"hc:{{est:{route}}}:consensus")  # type: ignore[assignment]
    return consensus


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(xs)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def spent(infos: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """The share of each tenant's budget the mock billed, over a scenario's runs (least, mean),
    and how many tenants it billed past their budget."""
    shares = [n / budget for info in infos for n in info["billed_tokens"].values()]
    return {
        "billed_share_min": round(min(shares), 4),
        "billed_share_mean": round(statistics.fmean(shares), 4),
        "tenants_billed_over": sum(s > 1 for s in shares),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-scenario error statistics, in tokens and as a fraction of the generated tokens."""
    if not rows:
        return {"cut_streams": 0}
    errors = [float(r["error"]) for r in rows]
    fractions = [r["error"] / r["generated"] for r in rows if r["generated"] > 0]

    def stats(xs: list[float], digits: int) -> dict[str, float]:
        return {
            "mean": round(statistics.fmean(xs), digits),
            "p50": round(percentile(xs, 50), digits),
            "p95": round(percentile(xs, 95), digits),
            "max": round(max(xs), digits),
            "min": round(min(xs), digits),
        }

    return {
        "cut_streams": len(rows),
        "under_charged": sum(e < 0 for e in errors),
        "error_tokens": stats(errors, 2),
        "error_fraction": stats(fractions, 4) if fractions else None,
        "cut_streams_generating_nothing": len(rows) - len(fractions),
        "charged_total": sum(r["charged"] for r in rows),
        "generated_total": sum(r["generated"] for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    out = ns.out or RESULTS / ("cut-charge-quick.json" if ns.quick else "cut-charge.json")
    levels = [int(c) for c in ns.concurrency.split(",")]
    modes = [MODES[m] for m in SCENARIO_MODES]
    plan = [(m, c, r) for m in modes for c in levels for r in range(ns.runs)]
    tenants = [f"t{i}" for i in range(ns.tenants)]
    result: dict[str, Any] = {
        "benchmark": "cut-charge",
        "command": "python -m bench cut_charge " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine_info(),
        "parameters": {
            "quick": ns.quick,
            "fanout": ns.fanout,
            "starve_processes": ns.starve,
            "budget_tokens": ns.budget,
            "budget_dimension": "total_tokens",
            "tenants_at_once": ns.tenants,
            "concurrency": levels,
            "runs_per_scenario": ns.runs,
            "max_tokens": MAX_TOKENS,
            "mock_pace_ms": ns.pace_ms,
            "mock_seed": ns.seed,
            "output_length": {"distribution": "log-normal", "median": 150, "sigma": 1.0},
            "gateway_processes": ns.gateways,
            "gateway_config": {"reservation_ttl_seconds": 120},
            "p95_warmup_replies": ns.warmup,
            "client_busy_pause_max_s": ns.max_pause,
            "time_limit_s_per_run": ns.time_limit,
            "routes": {m.name: {"label": m.label, **m.route} for m in modes},
        },
        "definition": "error = charged - generated, per stream the gateway cut: the client saw "
        "finish_reason length and the mock recorded the request aborted. charged: "
        "completion_tokens of the gateway's closing usage chunk (the settled charge); "
        "generated: the mock's per-request record (GET /mock/requests).",
        "scenarios": [],
        "streams": [],
    }
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hardcap-cut-charge-") as tmp_name:
        tmp = Path(tmp_name)
        with LocalValkey() as valkey:
            mock = stack.start_mock(tmp, pace_ms=ns.pace_ms, seed=ns.seed, nice=-10)
            try:
                window = choose_window(600)
                data = build_config(mock.url, valkey.url, modes, tenants, ns.budget, window)
                with stack.gateways(data, ns.gateways, tmp) as gws:
                    urls = [f"{g.url}/v1" for g in gws]
                    pids = {
                        **pids_of([mock, *gws]),
                        "valkey": valkey.proc.pid if valkey.proc else 0,
                    }
                    for m in modes:
                        if m.learns_p95:
                            asyncio.run(warm_up(urls, m, ns.warmup))
                    bar = tqdm(total=len(plan), unit="run")
                    for mode in modes:
                        for conc in levels:
                            bar.set_postfix_str(f"{mode.name} x{conc}")
                            before = (
                                p95_consensus(valkey.url, mode.name) if mode.learns_p95 else None
                            )
                            rows, infos = [], []
                            with starve.Hogs(ns.starve) as hogs:
                                watch = CpuWatch({**pids, **hogs.pids()}).start()
                                for run in range(ns.runs):
                                    got, info = run_scenario(
                                        ns, mode, conc, run, urls, mock.url, valkey.url, tenants
                                    )
                                    rows += got
                                    infos.append(info)
                                    bar.update(1)
                                cpu = watch.stop()
                            result["streams"] += rows
                            result["scenarios"].append(
                                {
                                    "scenario": f"{mode.name} x{conc}",
                                    "route": mode.name,
                                    "concurrency": conc,
                                    "p95_before": before,
                                    "runs": infos,
                                    "cpu": cpu,
                                    "summary": summarize(rows),
                                    "spent": spent(infos, ns.budget),
                                }
                            )
                            write_json(out, result)
                    bar.close()
            finally:
                mock.stop()
    result["seconds"] = round(time.monotonic() - started, 1)
    write_json(out, result)
    print_table(result, out)
    return 0


def print_table(result: dict[str, Any], out: Path) -> None:
    print(f"\nwrote {out} in {result['seconds']} s")
    print(
        f"{'scenario':<18} {'billed':>7} {'over':>4} {'cut':>4} {'under':>5}  error tokens "
        "mean/p50/p95/max/min   as a fraction of generated mean/p50/p95/max/min"
    )
    for sc in result["scenarios"]:
        s = sc["summary"]
        b = sc["spent"]
        head = f"{sc['scenario']:<18} {b['billed_share_min']:>7.1%} {b['tenants_billed_over']:>4}"
        if not s["cut_streams"]:
            print(f"{head} {0:>4}")
            continue
        e, f = s["error_tokens"], s["error_fraction"] or {}
        tokens = "/".join(f"{e[k]:+.1f}" for k in ("mean", "p50", "p95", "max", "min"))
        share = "/".join(f"{f.get(k, 0):+.1%}" for k in ("mean", "p50", "p95", "max", "min"))
        print(f"{head} {s['cut_streams']:>4} {s['under_charged']:>5}  {tokens:<34} {share}")


if __name__ == "__main__":
    sys.exit(main())
