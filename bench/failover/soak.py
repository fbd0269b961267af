"""A soak: two gateways for N minutes under mixed traffic and faults on a schedule.

Processes of their own: a Valkey with an append-only file (fsync always, so a restart is a
node reboot that keeps its data), moto's server (DynamoDB: the usage table the rollup writes and
the kept settles a gateway leaves when the cache is away), the mock upstream in OpenAI and
Anthropic modes, and two ``hardcap serve`` gateways with Python's fault handler on, one running
the rollup timer. Clients send, round-robin over the gateways: streamed and unary chat
completions, Anthropic messages, Responses-API streams, embeddings and requests under a lease,
from a tenant with room to spare (its ledger is checked against the mock's ground truth) and
from a tenant of the minute with a small budget (its streams are cut, then refused; the mock's
truth must never pass its budget). A few requests ask the mock to drop the connection, stall
or fail (``[mock:...]`` directives).

Every minute, at fixed offsets: the mock answers 503 for a few seconds, Valkey is paused
(SIGSTOP) for 2 s, DynamoDB is paused for 8 s, and every ``--restart-every`` minutes Valkey is
killed and started again on its files. Every minute the benchmark records each gateway's RSS,
open descriptors and the worst ``/healthz`` latency seen (the event loop's lag as a client
sees it). It fails (``--check``) on a gateway that died or logged a fatal error, RSS or
descriptors that grew after the first minute, a ledger below the mock's truth (a lost settle),
a budget the truth passed (an overshoot), or a hold left once traffic stopped.

    python -m bench soak --minutes 60            # the published run
    python -m bench soak --quick --check         # 2 minutes, CI
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.lib import stack
from bench.lib.machine import machine_info, write_json
from hardcap_core import env
from hardcap_core.local.aws import DUMMY_CREDENTIALS, ENDPOINT_VAR, REGION_VAR
from hardcap_core.local.valkey import LocalValkey, free_port

RESULTS = Path(__file__).resolve().parents[1] / "results"
BIG = 10**12
TIGHT = 4_000  # total tokens a tenant of the minute may spend
TABLE = "hardcap-soak-usage"
# Growth allowed between the first minute's sample and the last: a warm process settles.
RSS_GROWTH_MB = 40.0
FD_GROWTH = 24
FAULTS_AT = {"upstream_503": 10.0, "valkey_pause": 22.0, "dynamodb_pause": 34.0, "restart": 46.0}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--quick", action="store_true", help="CI: 2 minutes, a restart in each")
    p.add_argument("--check", action="store_true", help="exit 1 if a goal was missed")
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/soak.json)")
    p.add_argument("--clients", type=int, default=12, help="requests in flight at once")
    p.add_argument("--restart-every", type=int, default=5, help="minutes between restarts")
    p.add_argument("--pace-ms", type=float, default=4.0, help="mock ms per token")
    ns = p.parse_args(argv)
    if ns.quick:
        ns.minutes, ns.restart_every = 2.0, 1
    return ns


class Valkey:
    """valkey-server on a fixed port and directory with an append-only file fsynced on every
    write, so a restart (a kill, then a start) finds every write it acknowledged."""

    def __init__(self, workdir: Path) -> None:
        (workdir / "valkey").mkdir()
        self.server = LocalValkey(
            port=free_port(),
            workdir=str(workdir / "valkey"),
            appendonly=True,
            log_path=str(workdir / "valkey.log"),
        )
        self.restarts = 0

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> None:
        self.server.start()

    def restart(self) -> None:
        proc = self.server.proc
        assert proc is not None
        proc.kill()  # a crash, not a shutdown: the append-only file is all it keeps
        proc.wait(10)
        self.restarts += 1
        self.start()

    def signal(self, sig: signal.Signals) -> None:
        assert self.server.proc is not None
        self.server.proc.send_signal(sig)

    def stop(self) -> None:
        if self.server.proc is not None and self.server.proc.poll() is None:
            self.server.proc.send_signal(signal.SIGCONT)  # a paused server cannot stop
        self.server.stop()


def start_moto(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """moto's DynamoDB in a process of its own (so it can be paused), the usage table made."""
    port = free_port()
    server = Path(sys.executable).with_name("moto_server")
    with log.open("wb") as handle:
        proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port)],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    import boto3

    from hardcap_core.rollup.table import create_table

    client = boto3.client(
        "dynamodb",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    create_table(client, TABLE)
    return proc, url


def build_config(mock: str, redis_url: str, minutes: int) -> dict[str, Any]:
    price = {"input_per_million": 1.0, "output_per_million": 2.0}
    # Breakers that probe again 5 s after they open: the upstream's 503 fault is seconds long.
    breaker = {"failures": 5, "cooldown_seconds": 5.0, "half_open_probes": 1}
    data = stack.base_config(mock, redis_url, breaker=breaker)
    data["upstreams"].append(
        {
            "name": "claude",
            "kind": "anthropic",
            "base_url": f"{mock}/v1",
            "timeout_seconds": 120,
            "api_key_env": "SOAK_UPSTREAM_KEY",
        }
    )
    data["routes"] = [
        stack.mock_route("m", price=price, max_output_tokens=400),
        {**stack.mock_route("c", price=price, max_output_tokens=400), "upstream": "claude"},
        stack.mock_route("e", price=price),
    ]
    tight = [stack.tenant_entry(f"tight-{i}", TIGHT, "day") for i in range(minutes + 1)]
    data["tenants"] = [stack.tenant_entry("big", BIG, "day"), *tight]
    return data


class Traffic:
    """The clients: one loop per client, each sending a request of a random kind as soon as
    its last ended, until told to stop."""

    def __init__(self, urls: list[str], started: float) -> None:
        self.urls = itertools.cycle(urls)
        self.started = started
        self.outcomes: Counter[str] = Counter()
        self.stop = asyncio.Event()
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(20.0, connect=5.0))

    def tight_tenant(self) -> str:
        return f"tight-{int((time.monotonic() - self.started) // 60)}"

    async def client(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            tenant = self.tight_tenant() if rng.random() < 0.25 else "big"
            kind = rng.choices(
                ("chat", "chat_unary", "anthropic", "responses", "embeddings", "lease"),
                weights=(40, 10, 20, 15, 5, 10),
            )[0]
            # A stall: OpenAI mode goes silent for a while; Anthropic mode stops sending until
            # the client gives up (its read timeout), so the gateway sees the client leave.
            stall = "[mock:stall_after=3]" if kind == "anthropic" else "[mock:silent_ms=1500]"
            fault = rng.choices(
                ("", "[mock:die_after=4]", stall, "[mock:status=500]"), weights=(91, 4, 3, 2)
            )[0]
            try:
                outcome = await self.send(next(self.urls), tenant, kind, fault, rng)
            except (httpx.HTTPError, ValueError) as e:
                outcome = f"client_error:{type(e).__name__}"
            self.outcomes[f"{kind}:{outcome}"] += 1

    async def send(self, url: str, tenant: str, kind: str, fault: str, rng: random.Random) -> str:
        key = {"authorization": f"Bearer {stack.tenant_key(tenant)}"}
        prompt = f"soak {rng.randrange(10**6)} tell me a story {fault}"
        tokens = rng.choice((20, 60, 150, 300))
        if kind == "embeddings":
            body = {"model": "e", "input": [prompt, "second"], "user": tenant}
            return await self.unary(f"{url}/v1/embeddings", body, key)
        if kind == "anthropic":
            body = {
                "model": "c",
                "max_tokens": tokens,
                "stream": True,
                "messages": [{"role": "user", "content": prompt}],
                "metadata": {"user_id": tenant},
            }
            return await self.stream(f"{url}/v1/messages", body, key)
        if kind == "responses":
            body = {
                "model": "m",
                "input": prompt,
                "max_output_tokens": tokens,
                "stream": True,
                "user": tenant,
                "store": False,
            }
            return await self.stream(f"{url}/v1/responses", body, key)
        body = {
            "model": "m",
            "max_tokens": tokens,
            "user": tenant,
            "messages": [{"role": "user", "content": prompt}],
        }
        if kind == "chat_unary":
            return await self.unary(f"{url}/v1/chat/completions", body, key)
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        if kind == "lease":
            return await self.leased(url, body, key)
        return await self.stream(f"{url}/v1/chat/completions", body, key)

    async def unary(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> str:
        r = await self.http.post(url, json=body, headers=headers)
        return "200" if r.status_code == 200 else f"{r.status_code}:{refusal(r.content)}"

    async def stream(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> str:
        async with self.http.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                return f"{r.status_code}:{refusal(await r.aread())}"
            tail = b""
            async for chunk in r.aiter_bytes():
                tail = (tail + chunk)[-4096:]
        # How each API ends a stream: an error event; a cut or capped one; a complete one.
        if b"event: error" in tail or b"response.failed" in tail or b'data: {"error"' in tail:
            return "stream_error"
        if b'"length"' in tail or b'"max_tokens"' in tail or b"response.incomplete" in tail:
            return "cut_or_capped"
        return "completed"

    async def leased(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> str:
        """Open a lease, send two streams under it, close it."""
        r = await self.http.post(
            f"{url}/v1/hardcap/leases", json={"tokens": 2_000, "ttl_seconds": 120}, headers=headers
        )
        if r.status_code not in (200, 201):
            return f"lease_{r.status_code}:{refusal(r.content)}"
        lease = r.json()["id"]
        under = {**headers, "x-hardcap-lease": lease}
        outcomes = [await self.stream(f"{url}/v1/chat/completions", body, under) for _ in "ab"]
        await self.http.delete(f"{url}/v1/hardcap/leases/{lease}", headers=headers)
        return "+".join(outcomes)


def refusal(raw: bytes) -> str:
    """An error answer's code (OpenAI's shape) or type (Anthropic's), for the tally."""
    try:
        error = json.loads(raw)["error"]
        kind = str(error.get("code") or error.get("type"))
        # A 400 is the soak's own mistake or the gateway's: keep what it said.
        return f"{kind} ({error.get('message', '')[:80]})" if "invalid" in kind else kind
    except (ValueError, KeyError, TypeError, AttributeError):
        return "unreadable"


def process_sample(pid: int) -> dict[str, float]:
    """RSS (MB) and open descriptors of a process, from /proc."""
    rss_kb = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    return {"rss_mb": round(rss_kb / 1024, 1), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


async def health_lag(urls: list[str], worst: dict[str, float], stop: asyncio.Event) -> None:
    """The slowest ``/healthz`` answer per gateway since the last sample (ms), polled often."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        while not stop.is_set():
            for url in urls:
                t = time.monotonic()
                try:
                    await http.get(f"{url}/healthz")
                    ms = (time.monotonic() - t) * 1000
                except httpx.HTTPError:
                    ms = 10_000.0
                worst[url] = max(worst.get(url, 0.0), ms)
            await asyncio.sleep(0.5)


async def faults(
    ns: argparse.Namespace,
    valkey: Valkey,
    moto: subprocess.Popen[bytes],
    mock: str,
    started: float,
    log: list[dict[str, Any]],
) -> None:
    """The schedule of :data:`FAULTS_AT`, minute after minute."""
    minute = 0
    async with httpx.AsyncClient(timeout=10.0) as http:
        while (minute + 1) * 60 <= ns.minutes * 60:
            base = started + minute * 60
            for name, offset in sorted(FAULTS_AT.items(), key=lambda kv: kv[1]):
                await asyncio.sleep(max(base + offset - time.monotonic(), 0))
                at = round(time.monotonic() - started, 1)
                if name == "upstream_503":
                    await http.post(f"{mock}/mock/fault", json={"status": 503, "seconds": 3})
                elif name == "valkey_pause":
                    valkey.signal(signal.SIGSTOP)
                    await asyncio.sleep(2.0)
                    valkey.signal(signal.SIGCONT)
                elif name == "dynamodb_pause":
                    moto.send_signal(signal.SIGSTOP)
                    await asyncio.sleep(8.0)
                    moto.send_signal(signal.SIGCONT)
                elif (minute + 1) % ns.restart_every == 0:
                    await asyncio.to_thread(valkey.restart)
                else:
                    continue
                log.append({"at_s": at, "fault": name})
            minute += 1


async def soak(ns: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    valkey = Valkey(tmp)
    valkey.start()
    moto, moto_url = start_moto(tmp / "moto.log")
    mock = stack.start_mock(tmp, pace_ms=ns.pace_ms, seed=7, median=60, sigma=0.8)
    minutes = int(ns.minutes + 0.999)
    data = build_config(mock.url, valkey.url, minutes)
    extra = {
        ENDPOINT_VAR: moto_url,
        env.USAGE_TABLE: TABLE,
        REGION_VAR: "us-east-1",
        "PYTHONFAULTHANDLER": "1",
        "SOAK_UPSTREAM_KEY": "sk-mock",
        **DUMMY_CREDENTIALS,
    }
    samples: list[dict[str, Any]] = []
    fault_log: list[dict[str, Any]] = []
    try:
        with stack.gateways_with_env(data, 1, tmp, extra) as plain:
            rolling = stack.start_gateway(tmp / "config.yaml", tmp, env=extra, rollup=True)
            try:
                gateways = [plain[0], rolling]
                urls = [g.url for g in gateways]
                started = time.monotonic()
                traffic = Traffic(urls, started)
                worst: dict[str, float] = {}
                clients = [asyncio.create_task(traffic.client(i)) for i in range(ns.clients)]
                lag = asyncio.create_task(health_lag(urls, worst, traffic.stop))
                schedule = asyncio.create_task(
                    faults(ns, valkey, moto, mock.url, started, fault_log)
                )
                end = started + ns.minutes * 60
                minute = 0
                while time.monotonic() < end:
                    await asyncio.sleep(min(60.0, end - time.monotonic()))
                    minute += 1
                    samples.append(sample(minute, gateways, worst, traffic))
                    worst.clear()
                    print(f"minute {minute}: {samples[-1]}", flush=True)
                traffic.stop.set()
                schedule.cancel()
                await asyncio.gather(*clients, lag, return_exceptions=True)
                await traffic.http.aclose()
                ledger = await settle_and_compare(urls[0], mock.url, minutes)
                samples.append(sample(minute + 1, gateways, worst, traffic))
                exits = {g.url: g.proc.poll() for g in gateways}
                fatal = [
                    g.url
                    for g in gateways
                    if "Fatal Python error" in g.log.read_text(errors="replace")
                ]
            finally:
                rolling.stop()
    finally:
        mock.stop()
        moto.send_signal(signal.SIGCONT)
        moto.kill()
        valkey.stop()
    return {
        "samples": samples,
        "faults": fault_log,
        "ledger": ledger,
        "exits": exits,
        "fatal_errors": fatal,
        "outcomes": dict(traffic.outcomes.most_common()),
        "valkey_restarts": valkey.restarts,
    }


def sample(
    minute: int, gateways: list[Any], worst: dict[str, float], traffic: Traffic
) -> dict[str, Any]:
    per = []
    for g in gateways:
        alive = g.proc.poll() is None
        row = {"alive": alive, **(process_sample(g.proc.pid) if alive else {})}
        row["healthz_worst_ms"] = round(worst.get(g.url, 0.0), 1)
        per.append(row)
    return {"minute": minute, "gateways": per, "requests": sum(traffic.outcomes.values())}


async def settle_and_compare(url: str, mock: str, minutes: int) -> dict[str, Any]:
    """Once nothing is in flight and a full rollup pass has charged the settles kept while the
    cache was away: each tenant's ledger against the mock's truth, and what is still held."""
    tenants = ["big", *(f"tight-{i}" for i in range(minutes + 1))]
    async with httpx.AsyncClient(timeout=10.0) as http:
        deadline = time.monotonic() + 90  # a full pass comes every ROLLUP_FULL_SECONDS (60 s)
        while True:
            truth = (await http.get(f"{mock}/mock/ground-truth")).json()["tenants"]
            rows = {t: await usage(http, url, t) for t in tenants}
            short = [t for t in tenants if rows[t]["used"] < total(truth.get(t, {}))]
            if not short and not any(r["reserved"] for r in rows.values()):
                break
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(2.0)
    out = {}
    for t in tenants:
        billed = total(truth.get(t, {}))
        out[t] = {
            "billed": billed,
            "charged": rows[t]["used"],
            "reserved": rows[t]["reserved"],
            "limit": BIG if t == "big" else TIGHT,
        }
    return out


def total(row: dict[str, Any]) -> int:
    return int(row.get("prompt_tokens", 0)) + int(row.get("completion_tokens", 0))


async def usage(http: httpx.AsyncClient, url: str, tenant: str) -> dict[str, int]:
    r = await http.get(
        f"{url}/v1/hardcap/usage", headers={"authorization": f"Bearer {stack.tenant_key(tenant)}"}
    )
    row = next(b for b in r.json()["budgets"] if b["level"] == "tenant")
    return {"used": int(row["used"]), "reserved": int(row["reserved"])}


def verdict(result: dict[str, Any]) -> list[str]:
    """Each goal the run missed, in words (empty: all met)."""
    missed = []
    if any(code is not None for code in result["exits"].values()) or result["fatal_errors"]:
        missed.append(f"a gateway died: exits {result['exits']}, {result['fatal_errors']}")
    samples = [s for s in result["samples"] if all(g["alive"] for g in s["gateways"])]
    if len(samples) >= 2:
        first, last = samples[0]["gateways"], samples[-1]["gateways"]
        for i, (a, b) in enumerate(zip(first, last, strict=True)):
            if b["rss_mb"] - a["rss_mb"] > RSS_GROWTH_MB:
                missed.append(f"gateway {i}: RSS grew {a['rss_mb']} -> {b['rss_mb']} MB")
            if b["fds"] - a["fds"] > FD_GROWTH:
                missed.append(f"gateway {i}: descriptors grew {a['fds']} -> {b['fds']}")
    for tenant, row in result["ledger"].items():
        if row["charged"] < row["billed"]:
            missed.append(f"{tenant}: charged {row['charged']} < billed {row['billed']}")
        if row["billed"] > row["limit"]:
            missed.append(f"{tenant}: billed {row['billed']} past its limit {row['limit']}")
        if row["reserved"]:
            missed.append(f"{tenant}: {row['reserved']} still held")
    return missed


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hardcap-soak-") as tmp:
        result = asyncio.run(soak(ns, Path(tmp)))
    missed = verdict(result)
    out = ns.out or RESULTS / "soak.json"
    write_json(
        out,
        {
            "machine": machine_info(),
            "command": f"python -m bench soak "
            f"{'--quick' if ns.quick else f'--minutes {ns.minutes:g}'}",
            "parameters": {k: str(v) for k, v in vars(ns).items()},
            "goals_missed": missed,
            **result,
        },
    )
    print(f"wrote {out}; goals missed: {missed or 'none'}")
    return 1 if ns.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
