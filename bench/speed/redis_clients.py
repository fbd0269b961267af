"""Redis clients side by side on the ledger's own script calls: client CPU per call, throughput.

The same admit + settle pair the gateway sends (the real ``lua/`` scripts, the keys and
arguments :class:`hardcap_core.ledger.Ledger` builds for a 3-level, 4-budget scope with rpm +
tpm on the key, a fresh reservation id per pair), sent by:

- ``hardcap pipe``: the gateway's path (``hardcap_core/ledger/pipe.py``): ``connect()``'s
  client, each script a ``PipedScript`` over one pipelined connection, as the ledger calls it;
- ``redis-py+hiredis``: the same client through redis-py's script objects (EVALSHA, NOSCRIPT
  reload): the gateway's path before the pipe;
- ``redis-py+hiredis evalsha``: the same client, ``EVALSHA`` called directly (no script object);
- ``redis-py+hiredis ConnectionPool``: redis-py's default (non-blocking) pool instead of the
  ``BlockingConnectionPool`` the gateway's client uses;
- ``redis-py (python parser)``: the same, with redis-py's pure-Python reply parser;
- ``valkey-glide``: ``GlideClient.invoke_script`` (a Rust core on its own threads: its CPU is
  counted, ``time.process_time`` covers every thread of the process);
- ``raw asyncio + hiredis``: a 40-line asyncio protocol that writes RESP and parses with
  ``hiredis.Reader``, no pool, no retries, no timeouts: the floor of a Python asyncio client.

Each with 1 pair in flight and with N in flight, for a fixed time; the reply is not decoded into
the ledger's dataclasses (that cost is the same whichever client). A ``return 1`` script gives
each client's cost of a bare call.

    python -m bench redis_clients            # about 2 minutes; private valkey-server
    python -m bench redis_clients --quick    # 1 s phases, redis-clients-quick.json

valkey-glide is optional (``pip install valkey-glide``): without it its rows are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import hashlib
import shlex
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser

from bench.lib.machine import machine_info, write_json
from bench.speed.ledger import INPUT_TOKENS, OUTPUT_ESTIMATE, PRICES, bench_scope
from hardcap_core.ledger import Ledger
from hardcap_core.ledger.connection import SOCKET_TIMEOUT_S, connect
from hardcap_core.ledger.pipe import PipedScript
from hardcap_core.ledger.scripts import SCRIPTS, source
from hardcap_core.local.valkey import LocalValkey

ROOT = Path(__file__).resolve().parents[2]
# redis-py's parsers; the pure-Python one picks RESP2/RESP3 from the connection's protocol.
PARSERS: dict[str, Any] = {"hiredis": _AsyncHiredisParser, "python": _AsyncRESP2Parser}
RESULTS = ROOT / "bench" / "results"
NOOP = "return 1"

# (script source, keys, args) -> reply
Call = Callable[[str, Sequence[str], Sequence[Any]], Awaitable[Any]]


class _Captured(Exception):
    pass


class _Recorder:
    """Stands in for a registered script: records what the ledger sends, then stops it."""

    def __init__(self, name: str, calls: dict[str, tuple[list[str], list[Any]]]) -> None:
        self.name, self.calls = name, calls

    def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> Awaitable[Any]:
        self.calls[self.name] = (list(keys), list(args))
        raise _Captured


class _RecordingClient:
    def __init__(self) -> None:
        self.calls: dict[str, tuple[list[str], list[Any]]] = {}
        # Each script known by its source, whatever order Scripts.register takes them in.
        self._names = {source(name): name for name in SCRIPTS}

    def register_script(self, src: str) -> _Recorder:
        return _Recorder(self._names[src], self.calls)


async def ledger_calls(prefix: str) -> tuple[str, dict[str, tuple[list[str], list[Any]]]]:
    """The reservation id and the (keys, args) the ledger sends for one admit, an extend of it
    by 16 and its settle."""
    from hardcap_core.ledger import Reservation

    rec = _RecordingClient()
    # A "not after" far away: the captured admit is replayed for minutes.
    ledger = Ledger(rec, prefix=prefix, reservation_ttl_s=600, call_timeout_s=10**6)
    rid = uuid.uuid4().hex
    scope = bench_scope()
    for call in (
        ledger.admit(
            scope, input_tokens=INPUT_TOKENS, output_estimate=OUTPUT_ESTIMATE, prices=PRICES,
            reservation_id=rid,
        ),
        ledger.extend(Reservation(rid, scope, PRICES, INPUT_TOKENS, OUTPUT_ESTIMATE), 16),
        ledger.settle(
            Reservation(rid, scope, PRICES, INPUT_TOKENS, OUTPUT_ESTIMATE),
            input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_ESTIMATE // 2,
        ),
    ):  # fmt: skip
        with contextlib.suppress(_Captured):
            await call
    return rid, rec.calls


def with_id(call: tuple[list[str], list[Any]], old: str, new: str) -> tuple[list[str], list[Any]]:
    keys, args = call
    return (
        [k.replace(old, new) for k in keys],
        [a.replace(old, new) if isinstance(a, str) else a for a in args],
    )


# -- clients ----------------------------------------------------------------------------------


class RedisPyScripts:
    """redis-py through its script objects, as the ledger calls it."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.scripts: dict[str, Any] = {}

    async def __call__(self, src: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = self.scripts.get(src)
        if script is None:
            script = self.scripts[src] = self.client.register_script(src)
        return await script(keys=keys, args=args)


class PipeScripts(RedisPyScripts):
    """The gateway's path: each script a PipedScript over the client's pipes."""

    async def __call__(self, src: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = self.scripts.get(src)
        if script is None:
            slow = self.client.register_script(src)
            script = self.scripts[src] = PipedScript(slow, self.client.pipes)
        return await script(keys=keys, args=args)


class RedisPyEvalsha:
    """redis-py, EVALSHA called directly."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.shas: dict[str, str] = {}

    async def __call__(self, src: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        sha = self.shas.get(src)
        if sha is None:
            sha = self.shas[src] = await self.client.script_load(src)
        return await self.client.evalsha(sha, len(keys), *keys, *args)


class Glide:
    def __init__(self, client: Any) -> None:
        from glide import Script

        self.client = client
        self.script_class = Script
        self.scripts: dict[str, Any] = {}

    async def __call__(self, src: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = self.scripts.get(src)
        if script is None:
            script = self.scripts[src] = self.script_class(src)
        return await self.client.invoke_script(script, keys=list(keys), args=[str(a) for a in args])


class RawProtocol(asyncio.Protocol):
    """RESP over one connection, replies parsed by hiredis, requests pipelined in order."""

    def __init__(self) -> None:
        import hiredis

        self.reader = hiredis.Reader()
        self.waiting: list[asyncio.Future[Any]] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while True:
            reply = self.reader.gets()
            if reply is False:
                return
            self.waiting.pop(0).set_result(reply)

    def send(self, *parts: Any) -> asyncio.Future[Any]:
        out = [b"*%d\r\n" % len(parts)]
        for p in parts:
            b = p if isinstance(p, bytes) else str(p).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        assert self.transport is not None
        self.transport.write(b"".join(out))
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        return fut


class Raw:
    def __init__(self, protocol: RawProtocol) -> None:
        self.protocol = protocol
        self.shas: dict[str, str] = {}

    async def __call__(self, src: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        sha = self.shas.get(src)
        if sha is None:
            sha = self.shas[src] = hashlib.sha1(src.encode()).hexdigest()
            await self.protocol.send("SCRIPT", "LOAD", src)
        return await self.protocol.send("EVALSHA", sha, len(keys), *keys, *args)


async def open_client(kind: str, url: str, port: int) -> tuple[Call, Callable[[], Awaitable[Any]]]:
    """A caller of kind ``kind`` and how to close it."""
    if kind.startswith("redis-py"):
        client = await connect(url)
        parser = "python" if "python" in kind else "hiredis"
        client.connection_pool.connection_kwargs["parser_class"] = PARSERS[parser]
        if "ConnectionPool" in kind:  # redis-py's default pool instead of the blocking one
            await client.aclose()
            client = aioredis.Redis.from_url(
                url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S
            )
        call: Call = RedisPyEvalsha(client) if "evalsha" in kind else RedisPyScripts(client)
        return call, client.aclose
    if kind == "hardcap pipe":
        client = await connect(url)
        return PipeScripts(client), client.aclose
    if kind == "valkey-glide":
        from glide import GlideClient, GlideClientConfiguration, NodeAddress

        config = GlideClientConfiguration([NodeAddress("127.0.0.1", port)], request_timeout=2000)
        glide = await GlideClient.create(config)
        return Glide(glide), glide.close
    if kind == "raw asyncio + hiredis":
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(RawProtocol, "127.0.0.1", port)

        async def close() -> None:
            transport.close()

        return Raw(protocol), close
    raise ValueError(kind)


KINDS = (
    "hardcap pipe",
    "redis-py+hiredis",
    "redis-py+hiredis evalsha",
    "redis-py+hiredis ConnectionPool",
    "redis-py (python parser)",
    "valkey-glide",
    "raw asyncio + hiredis",
)


def available(kind: str) -> bool:
    try:
        metadata.version("valkey-glide" if kind == "valkey-glide" else "redis")
    except metadata.PackageNotFoundError:
        return False
    return True


# -- phases -----------------------------------------------------------------------------------


async def timed(
    unit: Callable[[int], Awaitable[None]],
    *,
    inflight: int,
    seconds: float,
) -> dict[str, Any]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**9))

    async def worker() -> None:
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            await unit(next(counter))
            latencies.append(time.perf_counter() - t)

    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    latencies.sort()
    n = len(latencies)
    return {
        "inflight": inflight,
        "units": n,
        "seconds": round(elapsed, 3),
        "units_per_s": round(n / elapsed, 1),
        "ms_p50": round(1000 * statistics.median(latencies), 3),
        "ms_p99": round(1000 * latencies[min(n - 1, int(0.99 * n))], 3),
        "client_cpu_us_per_unit": round(1e6 * cpu / n, 1),
    }


async def measure(args: argparse.Namespace, url: str, port: int) -> list[dict[str, Any]]:
    from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

    prefix = f"hc-rc-{uuid.uuid4().hex[:8]}"
    rid0, calls = await ledger_calls(prefix)
    admit_src, settle_src = source("admit"), source("settle")
    kinds = [k for k in KINDS if available(k)]
    # The hierarchy's counters "restored" (a new cache answers 'hydrate' until then): one real
    # admit through the ledger does it.
    client = await connect(url)
    try:
        ledger = Ledger(client, prefix=prefix)
        await ledger.admit(bench_scope(), input_tokens=1, output_estimate=1)
    finally:
        await client.aclose()
    inflights = sorted({1, args.inflight})
    bar = tqdm(total=len(kinds) * len(inflights) * 2, unit="phase", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    # Interleaved runs per kind (a, b, a, b, ...) would need every client open at once; instead
    # the whole set runs `--rounds` times and each row is kept, so noise shows as spread.
    for round_ in range(args.rounds):
        for kind in kinds:
            call, close = await open_client(kind, url, port)
            try:

                async def pair(i: int, call: Call = call, kind: str = kind) -> None:
                    rid = f"{kind[:3]}-{i}-{uuid.uuid4().hex[:12]}"
                    keys, a = with_id(calls["admit"], rid0, rid)
                    reply = await call(admit_src, keys, a)
                    status = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
                    if status != "ok":
                        raise RuntimeError(f"{kind}: admit replied {reply[:2]}")
                    keys, a = with_id(calls["settle"], rid0, rid)
                    await call(settle_src, keys, a)

                async def noop(i: int, call: Call = call) -> None:
                    await call(NOOP, [], [])

                for _ in range(50):  # load the scripts, open connections, warm up
                    await pair(-1 - _)
                    await noop(0)
                for name, unit in (("admit+settle", pair), ("return 1", noop)):
                    for inflight in inflights:
                        bar.set_postfix_str(f"{kind} {name} x{inflight}")
                        row = await timed(unit, inflight=inflight, seconds=args.duration)
                        rows.append({"client": kind, "call": name, "round": round_, **row})
                        bar.update(1 / args.rounds)
            finally:
                await close()
    bar.close()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| client | call | in flight | per s | p50 ms | client CPU µs per call/pair |",
        "|---|---|---:|---:|---:|---:|",
    ]
    keyed: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        keyed.setdefault((r["client"], r["call"], r["inflight"]), []).append(r)
    for (client, call, inflight), rs in keyed.items():
        cpu = statistics.median(r["client_cpu_us_per_unit"] for r in rs)
        rate = statistics.median(r["units_per_s"] for r in rs)
        p50 = statistics.median(r["ms_p50"] for r in rs)
        lines.append(f"| {client} | {call} | {inflight} | {rate:,.0f} | {p50:.3f} | {cpu:,.0f} |")
    return "\n".join(lines)


def parse_args(argv: Iterable[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per phase")
    parser.add_argument("--inflight", type=int, default=16, help="calls in flight, second run")
    parser.add_argument("--rounds", type=int, default=2, help="times the whole set runs")
    parser.add_argument("--quick", action="store_true", help="1 s phases, one round")
    parser.add_argument("--out", help="result file (default bench/results/redis-clients.json)")
    args = parser.parse_args(None if argv is None else list(argv))
    if args.quick:
        args.duration, args.rounds = 1.0, 1
    name = "redis-clients-quick.json" if args.quick else "redis-clients.json"
    args.out = args.out or str(RESULTS / name)
    return args


def main(argv: Iterable[str] | None = None) -> int:
    args = parse_args(argv)
    info = machine_info()
    for package in ("valkey-glide", "hiredis", "redis"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            info.setdefault("packages", {})[package] = metadata.version(package)
    data: dict[str, Any] = {
        "bench": "redis-clients",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "bench", "redis_clients", *sys.argv[1:]]),
        "parameters": {
            "duration_s": args.duration,
            "inflight": args.inflight,
            "rounds": args.rounds,
            "quick": args.quick,
            "calls": "admit.lua + settle.lua as Ledger sends them (bench/speed/ledger.py's scope); "
            "'return 1'",
        },
        "machine": info,
    }
    with LocalValkey() as server:
        data["results"] = asyncio.run(measure(args, server.url, server.port))
    write_json(Path(args.out), data)
    print(table(data["results"]))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
