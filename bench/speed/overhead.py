"""What the gateway costs: added latency against calling the mock directly, the saturation point
of ONE gateway worker process (as shipped, and without uvloop and httptools), and
Redis round trips per request.

* Latency: open-loop at fixed rates, measured from each request's scheduled send time (no
  coordinated omission). At every rate, blocks alternate direct -> gateway -> direct ->
  gateway (``--rounds``), so both see the same machine; the first second of a block is not
  counted. Non-streamed replies are 1 token; streamed ones ``--stream-tokens`` tokens at mock
  pace 0 (latency = last byte; time to first byte too). Route: p95 estimator, truncate, the
  tenant with budget and rate limits (the full path: auth, rate limit, reserve, settle, logs).
* Saturation: non-streamed 1-token completions at rising open-loop rates through one worker;
  sustained = completions keep up with the offered rate (>= 97 %) with p99 under
  ``--sustained-p99-ms``. Plus a closed-loop capacity figure, taken first on an idle worker.
  Repeated with uvloop and httptools hidden from
  uvicorn (see bench/lib/stack.py; that set-up's added latency is measured too); the parser and
  server in use are read back from the worker. Every block starts once the worker is idle
  again, and a block during which other processes took more than a quarter of the machine is
  run again.
* Round trips: INFO commandstats deltas over a known number of requests, sequentially, for a
  tenant without rate limits (so no script-internal HMGET); commands our Lua scripts run
  inside EVALSHA are listed apart from client round trips.

    python -m bench overhead            # ~8 min
    python -m bench overhead --quick    # ~2 min smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from tqdm import tqdm  # type: ignore[import-untyped]

from bench.lib import stack
from bench.lib.machine import CpuWatch, machine_info, pids_of, process_cpu_seconds, write_json
from bench.lib.openloop import chat_sender, closed_loop, open_loop, stats
from hardcap_core.ledger.scripts import lua_dir
from hardcap_core.local.valkey import LocalValkey
from tests.load.harness import chat_body
from tests.load.http1 import Client

RESULTS = Path(__file__).resolve().parents[1] / "results"
TENANT, COUNTING = "bench", "counting"
CONTENDED = 0.25  # share of the machine other processes took during a block: repeat it
RETRIES_CONTENDED = 2
# Gateway set-ups measured, in order: the shipped one (hiredis, uvloop, httptools), then
# without uvloop and httptools. Results are keyed by the label ("hiredis": the shipped set-up).
# No set-up without hiredis: the ledger's pipe (hardcap_core/ledger/pipe.py) parses with it,
# so a gateway without it does not start.
VARIANTS: tuple[tuple[str, dict[str, bool]], ...] = (
    ("hiredis", {}),
    ("asyncio_h11", {"fast_server": False}),
)
LATENCY_VARIANTS = ("hiredis", "asyncio_h11")
ROUTES = [
    stack.mock_route("p95", estimator={"kind": "p95", "min_samples": 50}, max_output_tokens=1024),
    stack.mock_route("max", estimator={"kind": "max_tokens"}, max_output_tokens=1024),
    stack.mock_route(
        "fixed16", estimator={"kind": "fixed", "fixed_tokens": 16}, max_output_tokens=1024
    ),
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path)
    p.add_argument("--rates", default="10,25,50,100", help="non-streamed req/s")
    p.add_argument("--stream-rates", default="10,25,50", help="streamed req/s")
    p.add_argument("--stream-tokens", type=int, default=20)
    p.add_argument("--block-seconds", type=float, default=6.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sat-rates", default="25,50,75,100,125,150,200,250,300,400")
    p.add_argument("--sustained-p99-ms", type=float, default=100.0)
    p.add_argument("--log-level", default="INFO", help="gateway POWERTOOLS_LOG_LEVEL")
    p.add_argument("--rt-requests", type=int, default=200)
    p.add_argument("--rt-stream-tokens", type=int, default=200)
    ns = p.parse_args(argv)
    if ns.quick:
        ns.rates, ns.stream_rates, ns.sat_rates = "25,100", "25", "50,100,200"
        ns.block_seconds, ns.rounds, ns.rt_requests = 3.0, 1, 50
    return ns


def config(mock_url: str, redis_url: str) -> dict[str, Any]:
    data = stack.base_config(mock_url, redis_url)
    data["routes"] = ROUTES
    full = stack.tenant_entry(TENANT, 10**15, "30d")
    full["rate_limits"] = {"requests_per_minute": 10**8, "tokens_per_minute": 10**12}
    data["tenants"] = [full, stack.tenant_entry(COUNTING, 10**15, "30d")]
    return data


def script_internal_commands() -> set[str]:
    """Commands our Lua scripts call inside EVALSHA (commandstats counts them too).

    HMGET is left out: the scripts call it only for rate limits, which the counting tenant
    does not have, so every HMGET counted is the p95 estimator's own read.
    """
    found: set[str] = set()
    for path in lua_dir().glob("*.lua"):
        found |= {m.lower() for m in re.findall(r"redis\.call\('([A-Za-z]+)'", path.read_text())}
    return found - {"hmget"}


def commandstats(redis_url: str) -> dict[str, int]:
    with redis.Redis.from_url(redis_url) as r:
        info = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


def count_round_trips(url: str, redis_url: str, ns: argparse.Namespace) -> list[dict[str, Any]]:
    """Redis commands per request, per route and streaming or not, sequential requests."""
    internal = script_internal_commands()
    out = []
    cases = [(route, False, 1) for route in ("p95", "max")]
    cases += [(route, True, ns.rt_stream_tokens) for route in ("p95", "max", "fixed16")]
    for route, stream, tokens in cases:
        body = chat_body(COUNTING, route, 1024, f"Count. [mock:tokens={tokens}]", stream)
        sequential(url, body, 3)  # connections, the estimator cache: not counted
        before = commandstats(redis_url)
        outcomes = sequential(url, body, ns.rt_requests)
        after = commandstats(redis_url)
        delta = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        delta.pop("info", None)  # our own INFO
        n = ns.rt_requests
        trips = {k: v for k, v in delta.items() if k not in internal}
        out.append(
            {
                "route": route,
                "stream": stream,
                "reply_tokens": tokens,
                "requests": n,
                "ok": outcomes.count("ok"),
                "round_trips_per_request": round(sum(trips.values()) / n, 3),
                "client_commands_per_request": {
                    k: round(v / n, 3) for k, v in sorted(trips.items())
                },
                "script_internal_per_request": {
                    k: round(v / n, 3) for k, v in sorted(delta.items()) if k in internal
                },
            }
        )
    return out


def sequential(url: str, body: dict[str, Any], n: int) -> list[str]:
    """``n`` requests one after another on one connection; their outcomes."""

    async def go() -> list[str]:
        client = Client(url, 1)
        send = chat_sender(client, body, stack.tenant_key(COUNTING))
        try:
            return [(await send())[0] for _ in range(n)]
        finally:
            await client.aclose()

    return asyncio.run(go())


def latency(
    urls: dict[str, str], ns: argparse.Namespace, pids: dict[str, int], bar: Any
) -> list[dict[str, Any]]:
    """Alternating direct / gateway blocks at each rate, non-streamed then streamed."""
    rows = []
    plan = [(False, float(r)) for r in ns.rates.split(",")]
    plan += [(True, float(r)) for r in ns.stream_rates.split(",")]
    for stream, rate in plan:
        tokens = ns.stream_tokens if stream else 1
        for rnd in range(ns.rounds):
            for target in ("direct", "gateway"):
                model = "mock-small" if target == "direct" else "p95"
                body = chat_body(TENANT, model, 1024, f"Hi. [mock:tokens={tokens}]", stream)
                key = stack.tenant_key(TENANT) if target == "gateway" else None
                rows.append(block(urls[target], body, key, rate, ns.block_seconds, pids))
                rows[-1].update(
                    kind="stream" if stream else "non_stream",
                    target=target,
                    round=rnd,
                    rate=rate,
                    reply_tokens=tokens,
                )
                bar.update(1)
    return rows


def block(
    url: str,
    body: dict[str, Any],
    key: str | None,
    rate: float,
    seconds: float,
    pids: dict[str, int],
) -> dict[str, Any]:
    """One open-loop block on an idle worker; repeated (up to RETRIES_CONTENDED times) while
    other processes took more than CONTENDED of the machine meanwhile."""

    async def go() -> dict[str, Any]:
        client = Client(url, 4096)
        try:
            samples = await open_loop(chat_sender(client, body, key), rate, seconds)
        finally:
            await client.aclose()
        return stats(samples, skip_s=1.0)

    for attempt in range(RETRIES_CONTENDED + 1):
        drained = drain(pids)
        watch = CpuWatch(pids).start()
        result = asyncio.run(go())
        result["cpu"] = watch.stop()
        result["drain_seconds"] = drained
        result["contended_retries"] = attempt
        if (result["cpu"]["other_share"] or 0.0) <= CONTENDED:
            break
    return result


def drain(pids: dict[str, int], timeout_s: float = 60.0) -> float:
    """Wait until the gateway is idle (an overloaded worker keeps serving abandoned requests)."""
    gateway = [pid for name, pid in pids.items() if name.startswith("gateway")]
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        before = sum(process_cpu_seconds(pid) for pid in gateway)
        time.sleep(0.5)
        if sum(process_cpu_seconds(pid) for pid in gateway) - before < 0.025:  # < 5% of a core
            break
    return round(time.monotonic() - started, 1)


def added(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Gateway minus direct, per kind and rate, on the median over rounds of each figure."""
    out = []
    keys = sorted({(r["kind"], r["rate"]) for r in rows}, key=lambda k: (k[0] != "non_stream", k))
    for kind, rate in keys:
        fig: dict[str, Any] = {"kind": kind, "rate": rate}
        for target in ("direct", "gateway"):
            mine = [r for r in rows if (r["kind"], r["rate"], r["target"]) == (kind, rate, target)]
            for q in ("p50_ms", "p99_ms", "ttfb_p50_ms", "ttfb_p99_ms", "achieved_per_second"):
                vals = sorted(r[q] for r in mine if r.get(q) is not None)
                fig[f"{target}_{q}"] = vals[len(vals) // 2] if vals else None
            fig[f"{target}_failures"] = sum(sum(r["failures"].values()) for r in mine)
        for q in ("p50_ms", "p99_ms", "ttfb_p50_ms"):
            d, g = fig[f"direct_{q}"], fig[f"gateway_{q}"]
            fig[f"added_{q}"] = None if d is None or g is None else round(g - d, 3)
        out.append(fig)
    return out


def saturation(url: str, ns: argparse.Namespace, pids: dict[str, int], bar: Any) -> dict[str, Any]:
    body = chat_body(TENANT, "p95", 1024, "Hi. [mock:tokens=1]", stream=False)
    key = stack.tenant_key(TENANT)

    async def capacity() -> dict[str, Any]:
        client = Client(url, 64)
        try:
            return await closed_loop(chat_sender(client, body, key), 32, ns.block_seconds)
        finally:
            await client.aclose()

    drain(pids)
    closed = asyncio.run(capacity())  # first: afterwards the worker may be digesting overload
    blocks, failing = [], 0
    for rate in (float(r) for r in ns.sat_rates.split(",")):
        if failing >= 2:
            bar.update(1)
            continue
        row = block(url, body, key, rate, ns.block_seconds, pids)
        row["rate"] = rate
        row["sustained"] = bool(
            row.get("achieved_per_second")
            and row["achieved_per_second"] >= 0.97 * rate
            and not row["failures"]
            and (row["p99_ms"] or 1e9) <= ns.sustained_p99_ms
        )
        failing = 0 if row["sustained"] else failing + 1
        blocks.append(row)
        bar.update(1)

    sustained = [b["rate"] for b in blocks if b["sustained"]]
    return {
        "blocks": blocks,
        "sustained_max_rate": max(sustained, default=None),
        "closed_loop": closed,
    }


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = ns.out or RESULTS / ("overhead-quick.json" if ns.quick else "overhead.json")
    n_lat = (len(ns.rates.split(",")) + len(ns.stream_rates.split(","))) * ns.rounds * 2
    n_sat = len(ns.sat_rates.split(","))
    result: dict[str, Any] = {
        "benchmark": "overhead",
        "command": "python -m bench overhead " + " ".join(argv or sys.argv[1:]),
        "complete": False,
        "machine": machine_info(),
        "parameters": {
            **{k: v for k, v in vars(ns).items() if k != "out"},
            "mock_pace_ms": 0,
            "gateway_processes": 1,
            "routes": ROUTES,
            "latency_route": "p95",
            "latency_skip_first_s": 1.0,
        },
    }
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hardcap-overhead-") as tmp_name, LocalValkey() as vk:
        tmp = Path(tmp_name)
        mock = stack.start_mock(tmp, pace_ms=0.0, seed=11)
        bar = tqdm(total=2 * n_lat + len(VARIANTS) * n_sat, unit="block")
        try:
            data = config(mock.url, vk.url)
            for label, options in VARIANTS:
                with stack.gateways(data, 1, tmp, log_level=ns.log_level, **options) as gws:
                    gw = f"{gws[0].url}/v1"
                    pids = {**pids_of([mock, *gws]), "valkey": vk.proc.pid if vk.proc else 0}
                    warm(gw)
                    result[f"parser_{label}"] = stack.parser_in_use(gws[0])
                    result[f"server_{label}"] = stack.server_in_use(gws[0])
                    if label == "hiredis":
                        result["round_trips"] = count_round_trips(gw, vk.url, ns)
                    if label in LATENCY_VARIANTS:
                        bar.set_postfix_str(f"latency {label}")
                        rows = latency({"direct": f"{mock.url}/v1", "gateway": gw}, ns, pids, bar)
                        suffix = "" if label == "hiredis" else f"_{label}"
                        result[f"latency{suffix}"] = rows
                        result[f"added_latency{suffix}"] = added(rows)
                        write_json(out, result)
                    bar.set_postfix_str(f"saturation {label}")
                    result[f"saturation_{label}"] = saturation(gw, ns, pids, bar)
                    write_json(out, result)
        finally:
            bar.close()
            mock.stop()
    result["complete"] = True
    result["seconds"] = round(time.monotonic() - started, 1)
    write_json(out, result)
    print_summary(result, out)
    return 0


def warm(url: str) -> None:
    """Fill the p95 route's sample so it reserves the p95 (and connect, load the scripts)."""
    body = chat_body(TENANT, "p95", 1024, "Warm.", stream=False)  # log-normal lengths

    async def go() -> None:
        client = Client(url, 8)
        send = chat_sender(client, body, stack.tenant_key(TENANT))
        slots = asyncio.Semaphore(8)

        async def one() -> None:
            async with slots:
                await send()

        try:
            await asyncio.gather(*(one() for _ in range(200)))
        finally:
            await client.aclose()

    asyncio.run(go())


def print_summary(result: dict[str, Any], out: Path) -> None:
    print(f"\nwrote {out} in {result['seconds']} s")
    for a in result["added_latency"]:
        print(
            f"{a['kind']:>10} {a['rate']:>6.0f}/s  direct p50 {a['direct_p50_ms']} p99 "
            f"{a['direct_p99_ms']}  gateway p50 {a['gateway_p50_ms']} p99 {a['gateway_p99_ms']}"
            f"  added p50 {a['added_p50_ms']} p99 {a['added_p99_ms']}"
        )
    for label, _ in VARIANTS:
        s = result[f"saturation_{label}"]
        print(
            f"saturation {label} ({result[f'parser_{label}']}): sustained "
            f"{s['sustained_max_rate']} req/s, closed loop {s['closed_loop']}"
        )
    for rt in result["round_trips"]:
        print(
            f"round trips {rt['route']} stream={rt['stream']}: {rt['round_trips_per_request']} "
            f"{rt['client_commands_per_request']}"
        )


if __name__ == "__main__":
    sys.exit(main())
