"""Ledger throughput from one process, and what each script costs the server per call.

Client phases: admit + settle pairs per second from ONE asyncio process, with 1 pair in flight
and with N in flight, through the gateway's own client: the script calls go over the ledger's
pipe (hardcap_core/ledger/pipe.py), parsed by hiredis, whatever parser redis-py would pick, so
there is one row per in-flight count (bench/speed/redis_clients.py compares clients). The
client process and the server share the machine, so on a small box the client's CPU is
usually the limit: ``client_cpu_us_per_pair`` shows where it goes.

Server phases: one script kind per phase (admit, extend, settle, usage, estimator_record),
``CONFIG RESETSTAT`` before and ``INFO commandstats`` after, so ``cmdstat_evalsha``'s
``usec_per_call`` is that script's own time inside the server: no network, no client. A last
phase calls a script that only does ``return 1``: the floor any EVALSHA pays on this machine.

Every request touches the shape of a real one: three levels (key, tenant, org), four budgets on
day and month windows (tokens, output tokens, cost, input tokens), and rpm + tpm limits on the
key, all far above what the run can spend, so every admission succeeds.

    python -m bench ledger                # about a minute; a private valkey-server
    python -m bench ledger --quick        # seconds; writes ledger-quick.json
    python -m bench ledger --url redis://127.0.0.1:6379 --plot /tmp/ledger.png
    python -m bench ledger --lease        # every pair under a lease: ledger-lease.json

With ``--upstream-limit N`` every admit is also checked against one upstream's budget of N total
tokens a day over every tenant (hardcap_core/ledger/allowances.py): the admit carries one more
budget row, read against the hierarchy's allowance, and an allowance that runs short is topped up
by a grant in the upstream's own slot (at least 5% of N at a time). N must be above what the run
spends (about 350 tokens a pair: 10**9 for a full run); the result adds the grant calls per
1,000 admits. Its file is ledger-upstream.json (with --lease, ledger-lease-upstream.json).

With ``--lease`` the run first opens one lease on the scope (an envelope far above what it can
spend) and every admit carries it, so admit, extend and settle also read and write the lease's
record (lib.lua: leases); the server phases then give their cost per call beside a plain run's.

(``make`` installs hardcap in editable mode into .venv; PYTHONPATH=. is for other environments.)
With ``--url`` the server is shared: CONFIG RESETSTAT clears its command statistics, and the
run's keys (prefix ``hc-bench-<random>``) are deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import shlex
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

from bench.lib.machine import machine_info
from hardcap_core.budgets import (
    Budget,
    Dimension,
    Level,
    LevelKind,
    Prices,
    RateLimit,
    Scope,
    Window,
)
from hardcap_core.ledger import Admitted, Extended, Ledger, Reservation
from hardcap_core.ledger.allowances import SharedLimits, shared_budgets
from hardcap_core.ledger.connection import connect
from hardcap_core.ledger.estimators import SharedP95Estimator
from hardcap_core.ledger.leases import LeaseOpened, LeaseOwner, Leases
from hardcap_core.ledger.replies import ReservationMeta
from hardcap_core.local.valkey import LocalValkey

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
HUGE = 10**15
INPUT_TOKENS, OUTPUT_ESTIMATE, EXTEND_BY = 200, 300, 16
PRICES = Prices.per_million(0.15, 0.60)
# What parses the script calls' replies: the ledger's pipe, with hiredis.
PIPE = "pipe (hiredis)"


def bench_scope() -> Scope:
    key, tenant, org = (
        Level(LevelKind.KEY, "bench-key"),
        Level(LevelKind.TENANT, "bench-tenant"),
        Level(LevelKind.ORG, "bench-org"),
    )
    day, month = Window("day"), Window("month")
    return Scope(
        (key, tenant, org),
        (
            Budget(tenant, Dimension.TOTAL_TOKENS, HUGE, day),
            Budget(key, Dimension.OUTPUT_TOKENS, HUGE, month),
            Budget(org, Dimension.COST_USD, HUGE, month),
            Budget(tenant, Dimension.INPUT_TOKENS, HUGE, day),
        ),
        (RateLimit(key, requests_per_minute=10**9, tokens_per_minute=10**12),),
    )


# -- clients ----------------------------------------------------------------------------------


class LeasedLedger(Ledger):
    """A ledger whose admits all draw from one lease (``--lease``)."""

    def __init__(self, client: Any, lease: str, **kw: Any) -> None:
        super().__init__(client, **kw)
        self.lease = lease

    async def admit(self, scope: Scope, **kw: Any) -> Any:
        kw.setdefault("meta", ReservationMeta(lease=self.lease))
        return await super().admit(scope, **kw)


class LimitedLedger(Ledger):
    """A ledger whose admits are all checked against one upstream's budget over every tenant
    (``--upstream-limit``), under a lease too if ``lease``; counts admits and grant calls."""

    made: list[LimitedLedger] = []  # noqa: RUF012 (every instance of the run, for the totals)

    def __init__(self, client: Any, shared: SharedLimits, lease: str | None, **kw: Any) -> None:
        super().__init__(client, **kw)
        self.shared, self.lease, self.admits = shared, lease, 0
        LimitedLedger.made.append(self)

    async def admit(self, scope: Scope, **kw: Any) -> Any:
        kw.setdefault("shared", self.shared)
        if self.lease:
            kw.setdefault("meta", ReservationMeta(lease=self.lease))
        self.admits += 1
        return await super().admit(scope, **kw)

    @classmethod
    def totals(cls) -> dict[str, Any]:
        admits = sum(lg.admits for lg in cls.made)
        grants = sum(lg.allowances.grants for lg in cls.made)
        per = round(1000 * grants / admits, 3) if admits else None
        return {"admits": admits, "grant_calls": grants, "grant_calls_per_1000_admits": per}


def upstream_limit(tokens: int) -> SharedLimits:
    """One upstream's total-token budget of ``tokens`` a day, over every tenant."""
    day = [(Dimension.TOTAL_TOKENS, tokens, Window("day"))]
    return SharedLimits(shared_budgets("upstream", "bench-up", day))


def ledger_for(
    client: Any, prefix: str, lease: str | None, shared: SharedLimits | None = None
) -> Ledger:
    if shared is not None:
        return LimitedLedger(client, shared, lease, prefix=prefix, reservation_ttl_s=600)
    if lease is None:
        return Ledger(client, prefix=prefix, reservation_ttl_s=600)
    return LeasedLedger(client, lease, prefix=prefix, reservation_ttl_s=600)


async def open_lease(client: Any, prefix: str, scope: Scope) -> str:
    """A lease on ``scope`` for the whole run, its envelope far above what the run spends
    (below 10^14: a lease's record keeps 14 significant digits)."""
    leases = Leases(Ledger(client, prefix=prefix))
    owner = LeaseOwner(next(lv.id for lv in scope.levels if lv.kind is LevelKind.TENANT))
    opened = await leases.open(scope, owner, ttl_s=3600, tokens=10**13, usd_nusd=10**13)
    if not isinstance(opened, LeaseOpened):
        raise RuntimeError(f"the benchmark's lease was refused: {opened}")
    return opened.id


@asynccontextmanager
async def client_for(url: str) -> AsyncIterator[Any]:
    """The gateway's own client (hardcap_core.ledger.connection.connect)."""
    client = await connect(url)
    try:
        yield client
    finally:
        await client.aclose()


async def admitted(ledger: Ledger, scope: Scope) -> Reservation:
    r = await ledger.admit(
        scope, input_tokens=INPUT_TOKENS, output_estimate=OUTPUT_ESTIMATE, prices=PRICES
    )
    if not isinstance(r, Admitted):
        raise RuntimeError(f"the benchmark's budgets are meant never to refuse: {r}")
    return r.reservation


async def pair(ledger: Ledger, scope: Scope) -> None:
    res = await admitted(ledger, scope)
    await ledger.settle(res, input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_ESTIMATE // 2)


# -- progress ---------------------------------------------------------------------------------


class Progress:
    """One tick per phase; the running phase shows its live call rate."""

    def __init__(self, phases: int) -> None:
        from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

        self.bar = tqdm(total=phases, unit="phase", desc="ledger bench", file=sys.stderr)
        self.calls = 0

    def phase(self, name: str) -> None:
        self.name, self.calls, self.started = name, 0, time.perf_counter()
        self.bar.set_postfix_str(name)

    def tick(self) -> None:
        self.calls += 1
        if self.calls % 500 == 0:
            rate = self.calls / (time.perf_counter() - self.started)
            self.bar.set_postfix_str(f"{self.name}: {rate:,.0f}/s")

    def done(self) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


# -- client phases ----------------------------------------------------------------------------


async def throughput(
    ledger: Ledger, scope: Scope, *, inflight: int, seconds: float, progress: Progress
) -> dict[str, Any]:
    """admit+settle pairs for ``seconds`` with ``inflight`` workers, each one pair at a time."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            await pair(ledger, scope)
            latencies.append(time.perf_counter() - t)
            progress.tick()

    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    latencies.sort()
    n = len(latencies)
    return {
        "inflight": inflight,
        "pairs": n,
        "seconds": round(elapsed, 3),
        "pairs_per_s": round(n / elapsed, 1),
        "calls_per_s": round(2 * n / elapsed, 1),
        "pair_ms_p50": round(1000 * statistics.median(latencies), 3),
        "pair_ms_p99": round(1000 * latencies[min(n - 1, int(0.99 * n))], 3),
        "client_cpu_us_per_pair": round(1e6 * cpu / n, 1),
    }


# -- server phases ----------------------------------------------------------------------------


async def evalsha_stats(admin: Any) -> dict[str, float]:
    stats: dict[str, Any] = await admin.info("commandstats")
    row = stats.get("cmdstat_evalsha", {})
    return {
        "calls": int(row.get("calls", 0)),
        "usec": float(row.get("usec", 0)),
        "usec_per_call": float(row.get("usec_per_call", 0.0)),
        "failed_calls": int(row.get("failed_calls", 0)),
    }


async def run_calls(
    calls: Iterable[Callable[[], Awaitable[Any]]], inflight: int, progress: Progress
) -> None:
    """Await every call, at most ``inflight`` at a time."""
    pending = iter(calls)

    async def worker() -> None:
        for call in pending:
            await call()
            progress.tick()

    await asyncio.gather(*(worker() for _ in range(inflight)))


async def server_costs(
    ledger: Ledger, admin: Any, scope: Scope, *, seconds: float, inflight: int, progress: Progress
) -> dict[str, Any]:
    """Server µs per call of each script, each in its own phase of the same number of calls."""
    out: dict[str, Any] = {}

    async def phase(name: str, body: Callable[[], Awaitable[int]]) -> None:
        progress.phase(f"server {name}")
        await admin.config_resetstat()
        started = time.perf_counter()
        n = await body()
        elapsed = time.perf_counter() - started
        out[name] = {**await evalsha_stats(admin), "client_calls": n, "seconds": round(elapsed, 3)}
        progress.done()

    held: list[Reservation] = []

    async def admits() -> int:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                held.append(await admitted(ledger, scope))
                progress.tick()

        await asyncio.gather(*(worker() for _ in range(inflight)))
        return len(held)

    async def extends() -> int:
        async def one(res: Reservation) -> None:
            if not isinstance(await ledger.extend(res, EXTEND_BY), Extended):
                raise RuntimeError("extend refused in the benchmark")

        await run_calls((partial(one, r) for r in held), inflight, progress)
        return len(held)

    async def settles() -> int:
        settle = partial(ledger.settle, input_tokens=INPUT_TOKENS, output_tokens=100)
        await run_calls((partial(settle, r) for r in held), inflight, progress)
        return len(held)

    async def usages() -> int:
        await run_calls((lambda: ledger.usage(scope) for _ in held), inflight, progress)
        return len(held)

    estimator = SharedP95Estimator(ledger, cache_seconds=0)
    rng = random.Random(1)

    async def records() -> int:
        await run_calls(
            (
                lambda: estimator.observe("bench-route", rng.randint(50, 800), truncated=False)
                for _ in held
            ),
            inflight,
            progress,
        )
        return len(held)

    # Loaded up front: a phase's first calls would otherwise count NOSCRIPT replies too.
    for name in ("admit", "extend", "settle", "usage", "estimator_record"):
        script = getattr(ledger.scripts, name)
        # Over the pipes (connection.connect) the script object wraps redis-py's as ``slow``.
        await admin.script_load(getattr(script, "slow", script).script)
    await phase("admit", admits)  # the reservations the next phases extend and settle
    await phase("extend", extends)
    await phase("settle", settles)
    await phase("usage", usages)
    await phase("estimator_record", records)
    noop = admin.register_script("return 1")
    await noop()  # loaded before the phase, so the phase is EVALSHA only

    async def noops() -> int:
        await run_calls((lambda: noop() for _ in held), inflight, progress)
        return len(held)

    await phase("noop (return 1)", noops)
    return out


# -- the run ----------------------------------------------------------------------------------


async def measure(args: argparse.Namespace, url: str, prefix: str) -> dict[str, Any]:
    scope = bench_scope()
    inflights = sorted({1, args.inflight})
    progress = Progress(len(inflights) + 6)
    results: dict[str, Any] = {"throughput": [], "server": {}}
    try:
        async with AsyncExitStack() as stack:
            admin = await stack.enter_async_context(client_for(url))
            results["server_info"] = {
                k: v
                for k, v in (await admin.info("server")).items()
                if k in ("redis_version", "valkey_version", "server_name", "io_threads_active")
            }
            lease = await open_lease(admin, prefix, scope) if args.lease else None
            results["lease"] = lease
            shared = upstream_limit(args.upstream_limit) if args.upstream_limit else None
            client = await stack.enter_async_context(client_for(url))
            ledger = ledger_for(client, prefix, lease, shared)
            for _ in range(50):  # load the scripts, open the connections, warm up
                await pair(ledger, scope)
            for inflight in inflights:
                progress.phase(f"pipe x{inflight}")
                row = await throughput(
                    ledger, scope, inflight=inflight, seconds=args.duration, progress=progress
                )
                results["throughput"].append({"parser": PIPE, **row})
                progress.done()
            ledger = ledger_for(admin, prefix, lease, shared)
            results["server"] = await server_costs(
                ledger,
                admin,
                scope,
                seconds=args.duration / 2,
                inflight=args.inflight,
                progress=progress,
            )
            if shared is not None:
                results["upstream_limit"] = LimitedLedger.totals()
            if args.url:
                keys = [k async for k in admin.scan_iter(match=f"{prefix}:*", count=1000)]
                for i in range(0, len(keys), 500):
                    await admin.delete(*keys[i : i + 500])
    finally:
        progress.close()
    return results


def table(data: dict[str, Any]) -> str:
    lines = [
        "| parser | in flight | admit+settle pairs/s | pair p50 ms | pair p99 ms "
        "| client CPU µs/pair |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in data["results"]["throughput"]:
        lines.append(
            f"| {r['parser']} | {r['inflight']} | {r['pairs_per_s']:,.0f} | {r['pair_ms_p50']} "
            f"| {r['pair_ms_p99']} | {r['client_cpu_us_per_pair']:,.0f} |"
        )
    lines += ["", "| script | calls | server µs/call |", "|---|---:|---:|"]
    for name, s in data["results"]["server"].items():
        lines.append(f"| {name} | {s['calls']:,} | {s['usec_per_call']:.2f} |")
    limit = data["results"].get("upstream_limit")
    if limit:
        lines += ["", f"upstream limit: {limit['grant_calls_per_1000_admits']} grant calls per "
                  f"1,000 admits ({limit['grant_calls']:,} in {limit['admits']:,})"]  # fmt: skip
    return "\n".join(lines)


def plot(data: dict[str, Any], path: Path) -> None:
    """Pairs per second per configuration, and server µs per call per script."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["results"]["throughput"]
    server = data["results"]["server"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.bar([f"{r['parser']}\nx{r['inflight']}" for r in rows], [r["pairs_per_s"] for r in rows])
    left.set_ylabel("admit+settle pairs / s (one process)")
    right.bar(list(server), [s["usec_per_call"] for s in server.values()])
    right.set_ylabel("server µs per call (INFO commandstats)")
    right.tick_params(axis="x", rotation=20)
    fig.suptitle(
        f"Hardcap ledger ({data['machine']['cpu_model']}, {data['machine']['cores']} cores)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv: Iterable[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--url", help="an existing server (default: start a private one)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per client phase")
    parser.add_argument("--inflight", type=int, default=16, help="pairs in flight, second run")
    parser.add_argument("--quick", action="store_true", help="1 s phases, to ledger-quick.json")
    parser.add_argument("--out", help="result file (default bench/results/ledger.json)")
    parser.add_argument("--plot", help="also draw the results into this PNG (matplotlib)")
    parser.add_argument("--lease", action="store_true", help="every admit under one lease")
    parser.add_argument(
        "--upstream-limit", type=int, default=0, metavar="TOKENS",
        help="every admit also under one upstream's day budget of TOKENS over every tenant",
    )  # fmt: skip
    args = parser.parse_args(None if argv is None else list(argv))
    if args.quick:
        args.duration = 1.0
    name = "ledger" + ("-lease" if args.lease else "")
    name += ("-upstream" if args.upstream_limit else "") + ("-quick" if args.quick else "")
    args.out = args.out or str(RESULTS / f"{name}.json")
    return args


def main(argv: Iterable[str] | None = None) -> int:
    args = parse_args(argv)
    prefix = f"hc-bench-{uuid.uuid4().hex[:8]}"
    data: dict[str, Any] = {
        "bench": "ledger",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "bench", "ledger", *sys.argv[1:]]),
        "parameters": {
            "url": args.url or "private LocalValkey",
            "duration_s": args.duration,
            "inflight": args.inflight,
            "quick": args.quick,
            "lease": args.lease,
            "upstream_limit_tokens": args.upstream_limit or None,
            "server_phase_s": args.duration / 2,
            "input_tokens": INPUT_TOKENS,
            "output_estimate": OUTPUT_ESTIMATE,
            "settled_output": OUTPUT_ESTIMATE // 2,
            "extend_by": EXTEND_BY,
            "prices_nusd": [PRICES.input_nusd, PRICES.output_nusd],
            "scope": {
                "levels": [lvl.tag for lvl in bench_scope().levels],
                "budgets": [b.field for b in bench_scope().budgets],
                "rate_limits": ["k:bench-key rpm+tpm"],
            },
        },
        "machine": machine_info(),
        "load_average_before": list(os.getloadavg()),
    }
    if args.url:
        data["results"] = asyncio.run(measure(args, args.url, prefix))
    else:
        with LocalValkey() as server:
            data["results"] = asyncio.run(measure(args, server.url, prefix))
    data["load_average_after"] = list(os.getloadavg())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(table(data))
    print(f"\nwrote {out}")
    if args.plot:
        plot(data, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
