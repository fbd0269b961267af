"""What a request costs on Lambda at each memory size: ONE gateway worker in a cgroup whose CPU
quota is Lambda's share of one vCPU (memory / 1,769 MB), sequential requests (one in flight, as
one Lambda execution environment serves them), and the bill that follows.

Per memory size (128, 256, 512, 768, 1024 MB and 1,769 MB, the one-vCPU reference) a fresh
gateway process (``hardcap serve``, one uvicorn worker) is started, moved into
``hardcap-bench-<M>`` with ``quota = M / 1769 x period`` (bench/cgroup_cpu.py: cgroup v2
``cpu.max`` where the v2 hierarchy has the cpu controller, else v1's CFS quota, the same kernel
mechanism), warmed, and measured:

* non-streamed 1-token completions: gateway CPU per request (its threads' on-CPU time from
  /proc/<pid>/task/*/schedstat; utime+stime ticks too), wall-clock duration per request;
* streams of 200 and 1,000 tokens at mock pace 0: CPU per stream, CPU per relayed token (the
  slope between the two lengths), duration;
* a stream paced at 100 tokens/s (``[mock:pace_ms=10]``, one token per network read) and one
  at 200 tokens/s (headroom): time to first and last byte and the inter-token gap as the
  client sees it, against the same streams straight from the mock (no gateway, no quota)
  measured in the same run: is it slowed? And the share of the CPU quota the stream used;
* non-streamed requests each after 0.3 s idle (a full quota): a single request's duration;
* RSS of the gateway (VmRSS, VmHWM) after warm-up and after the load; the cgroup's throttling.

The mock upstream and the private Valkey run outside the cgroup (they stand for the provider
and ElastiCache). The costs (duration billed by wall clock, rounded up to 1 ms, at arm64 and
x86 prices), the memory default and the share of the model's price are computed from the
measurements by :func:`cost_model`; docs/cost.md has the tables and sources.

    flock /tmp/hardcap-bench.lock .venv/bin/python -m bench.lambda_cost --plot      # ~5 min
    flock /tmp/hardcap-bench.lock .venv/bin/python -m bench.lambda_cost --quick     # < 2 min
    .venv/bin/python -m bench.lambda_cost --report bench/results/lambda-cost.json --markdown

Needs root (cgroups). Writes bench/results/lambda-cost.json (lambda-cost-quick.json).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm  # type: ignore[import-untyped]

from bench import cgroup_cpu, stack
from bench.harness import chat_body
from bench.http1 import Client
from bench.machine import CpuWatch, machine_info, process_cpu_seconds, write_json
from hardcap_core.local import stack as local_stack
from hardcap_core.local.valkey import LocalValkey

RESULTS = Path(__file__).resolve().parent / "results"
TENANT = "cost"
ONE_VCPU_MB = 1769
MEMORY_SIZES = (128, 256, 512, 768, 1024, 1769)
MAX_TOKENS = 4096
# A route that reserves max_tokens: every stream here fits its hold, so no extend round trips
# depend on an estimator's warm-up (the p95 estimator would reserve less and extend instead).
ROUTE = stack.mock_route("cost", estimator={"kind": "max_tokens"}, max_output_tokens=MAX_TOKENS)

# Prices, US East (N. Virginia), first pricing tier; sources in docs/cost.md.
PRICES = {
    "lambda_request_per_million": 0.20,
    "lambda_gb_second": {"arm64": 0.0000133334, "x86_64": 0.0000166667},
    "function_url_per_million": 0.0,
    "api_gateway_rest_per_million": 3.50,
    "api_gateway_http_per_million": 1.00,
}
MODELS = {
    # USD per million tokens, (input, output); sources in docs/cost.md.
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "claude-sonnet-5.5": (2.00, 10.00),
    "claude-opus-5.5": (4.00, 20.00),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer requests (< 2 min)")
    p.add_argument("--out", type=Path)
    p.add_argument("--memory", default=",".join(map(str, MEMORY_SIZES)), help="MB, comma list")
    p.add_argument("--period-us", type=int, default=100_000, help="CFS period (kernel default)")
    p.add_argument("--warm", type=int, default=40, help="warm-up requests per memory size")
    p.add_argument("--requests", type=int, default=200, help="non-streamed requests")
    p.add_argument("--isolated", type=int, default=20, help="non-streamed, each after idle")
    p.add_argument("--isolated-gap-s", type=float, default=0.3, help="idle before each of those")
    p.add_argument("--short-streams", type=int, default=20, help="200-token streams at pace 0")
    p.add_argument("--long-streams", type=int, default=8, help="1,000-token streams at pace 0")
    p.add_argument("--short-tokens", type=int, default=200)
    p.add_argument("--long-tokens", type=int, default=1000)
    p.add_argument("--paced-streams", type=int, default=3)
    p.add_argument("--paced-tokens", type=int, default=500)
    p.add_argument("--pace-ms", type=float, default=10.0, help="mock pace of the paced stream")
    p.add_argument("--fast-pace-ms", type=float, default=5.0, help="a faster model, for headroom")
    p.add_argument("--log-level", default="INFO", help="gateway POWERTOOLS_LOG_LEVEL")
    p.add_argument("--report", type=Path, help="recompute the cost model of a result file")
    p.add_argument("--plot", action="store_true", help="also write a PNG beside the result")
    p.add_argument("--markdown", action="store_true", help="print docs/cost.md's tables")
    p.add_argument("--write-doc", action="store_true", help="put the tables into docs/cost.md")
    add_model_arguments(p)
    ns = p.parse_args(argv)
    if ns.quick:
        ns.warm, ns.requests, ns.short_streams, ns.long_streams = 15, 40, 5, 3
        ns.isolated = 8
        ns.paced_streams, ns.paced_tokens = 1, 200
    return ns


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The cost model's knobs (they only change the arithmetic, not what is measured)."""
    p.add_argument("--stream-rate", type=float, default=100.0, help="tokens/s of a model")
    p.add_argument("--stream-lengths", default="100,500,2000", help="table columns, tokens")
    p.add_argument("--share-in", type=int, default=500, help="input tokens, model share")
    p.add_argument("--share-out", type=int, default=200, help="output tokens, model share")
    p.add_argument(
        "--headroom-mb",
        type=int,
        default=48,
        help="memory the sandbox needs beside the gateway (adapter, runtime): an assumption",
    )
    p.add_argument("--slow-ttlb-ms", type=float, default=100.0, help="added last byte allowed")
    p.add_argument("--slow-gap-ms", type=float, default=10.0, help="added gap p99 allowed")
    p.add_argument("--slow-ttfb-ms", type=float, default=50.0, help="added first byte allowed")
    p.add_argument(
        "--max-quota-used",
        type=float,
        default=0.5,
        help="headroom: share of the CPU quota the paced stream may use",
    )


# --- the gateway process ------------------------------------------------------------------


def thread_cpu_ns(pid: int) -> int:
    """On-CPU nanoseconds of ``pid``'s live threads (/proc/<pid>/task/*/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return total


def memory_kb(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon of ``pid`` in kB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[name] = int(value.split()[0])
    return out


class CpuMeter:
    """CPU the gateway spent over a stretch, two ways; and the cgroup's throttling."""

    def __init__(self, pid: int, group: cgroup_cpu.CpuQuota) -> None:
        self.pid, self.group = pid, group

    def start(self) -> CpuMeter:
        self.ns0, self.ticks0 = thread_cpu_ns(self.pid), process_cpu_seconds(self.pid)
        self.stat0, self.t0 = self.group.stat(), time.monotonic()
        return self

    def stop(self) -> dict[str, Any]:
        return {
            "cpu_ms": round((thread_cpu_ns(self.pid) - self.ns0) / 1e6, 3),
            "cpu_ms_ticks": round((process_cpu_seconds(self.pid) - self.ticks0) * 1e3, 1),
            "wall_s": round(time.monotonic() - self.t0, 3),
            "throttling": cgroup_cpu.stat_delta(self.stat0, self.group.stat()),
        }


# --- the client: one request at a time ----------------------------------------------------


def body_bytes(model: str, tokens: int, stream: bool, pace_ms: float = 0.0) -> bytes:
    prompt = f"Cost. [mock:tokens={tokens}][mock:pace_ms={pace_ms:g}]"
    return json.dumps(chat_body(TENANT, model, MAX_TOKENS, prompt, stream)).encode()


def headers(key: str | None) -> dict[str, str]:
    h = {"content-type": "application/json"}
    if key:
        h["authorization"] = f"Bearer {key}"
    return h


async def one_request(client: Client, body: bytes, key: str | None) -> dict[str, Any]:
    """A non-streamed exchange: status and wall-clock seconds to the last byte."""
    t0 = time.perf_counter()
    status, _, raw = await client.request("POST", "/chat/completions", body, headers(key))
    wall = time.perf_counter() - t0
    ok = status == 200 and b'"choices"' in raw
    out: dict[str, Any] = {"ok": ok, "status": status, "wall_s": wall}
    if not ok:
        out["error"] = raw[:300].decode(errors="replace")
    return out


async def one_stream(client: Client, body: bytes, key: str | None) -> dict[str, Any]:
    """A streamed exchange: first byte, last byte and each content event's arrival time."""
    t0 = time.perf_counter()
    arrivals: list[float] = []
    first: float | None = None
    tail = b""
    async with client.stream("POST", "/chat/completions", body, headers(key)) as r:
        buffer = b""
        async for piece in r.chunks():
            now = time.perf_counter() - t0
            first = now if first is None else first
            buffer += piece
            *events, buffer = buffer.split(b"\n\n")
            arrivals.extend(now for e in events if b'"content"' in e)
            if events:
                tail = events[-1]
        status = r.status
    last = time.perf_counter() - t0
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    ok = status == 200 and tail.strip() == b"data: [DONE]"
    return {
        **({} if ok else {"error": tail[:300].decode(errors="replace")}),
        "ok": ok,
        "status": status,
        "ttfb_s": first,
        "ttlb_s": last,
        "content_events": len(arrivals),
        "gaps_s": gaps,
    }


def run_sequential(
    url: str, key: str | None, plan: list[tuple[bytes, bool]], pause_s: float = 0.0
) -> list[dict]:
    """``plan``'s requests one after another over one keep-alive connection, ``pause_s``
    of idle before each."""

    async def go() -> list[dict[str, Any]]:
        client = Client(url, 1)
        out = []
        try:
            for body, stream in plan:
                if pause_s:
                    await asyncio.sleep(pause_s)
                send = one_stream if stream else one_request
                out.append(await send(client, body, key))
        finally:
            await client.aclose()
        return out

    return asyncio.run(go())


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarize_walls(rows: list[dict[str, Any]]) -> dict[str, Any]:
    walls = [r["wall_s"] if "wall_s" in r else r["ttlb_s"] for r in rows]
    return {
        "count": len(rows),
        "failures": sum(not r["ok"] for r in rows),
        "wall_ms_p50": round(statistics.median(walls) * 1e3, 3),
        "wall_ms_p99": round((pct(walls, 0.99) or 0) * 1e3, 3),
        "wall_ms_mean": round(statistics.fmean(walls) * 1e3, 3),
    }


def summarize_paced(rows: list[dict[str, Any]], pace_ms: float, tokens: int) -> dict[str, Any]:
    gaps = [g for r in rows for g in r["gaps_s"]]
    return {
        "count": len(rows),
        "failures": sum(not r["ok"] for r in rows),
        "tokens": tokens,
        "pace_ms": pace_ms,
        "schedule_s": round((tokens - 1) * pace_ms / 1e3, 3),
        "content_events": [r["content_events"] for r in rows],
        "ttfb_ms_median": round(statistics.median(r["ttfb_s"] for r in rows) * 1e3, 2),
        "ttlb_s_median": round(statistics.median(r["ttlb_s"] for r in rows), 4),
        "ttlb_s_max": round(max(r["ttlb_s"] for r in rows), 4),
        "gap_ms_p50": round((pct(gaps, 0.5) or 0) * 1e3, 3),
        "gap_ms_p99": round((pct(gaps, 0.99) or 0) * 1e3, 3),
        "gap_ms_max": round(max(gaps, default=0) * 1e3, 3),
    }


# --- one memory size ----------------------------------------------------------------------


def measure_memory_size(
    memory_mb: int, data: dict[str, Any], tmp: Path, ns: argparse.Namespace, bar: Any
) -> dict[str, Any]:
    quota = max(1000, round(memory_mb / ONE_VCPU_MB * ns.period_us))  # the kernel's minimum 1 ms
    group = cgroup_cpu.CpuQuota(str(memory_mb), quota, ns.period_us).create()
    key = stack.tenant_key(TENANT)
    row: dict[str, Any] = {"memory_mb": memory_mb, "cgroup": group.settings()}
    try:
        gw, row["start"] = start_in_group(group, data, tmp, ns)
        try:
            pid = gw.proc.pid
            row["cgroup"]["members"] = group.members()
            if pid not in row["cgroup"]["members"]:
                raise RuntimeError(f"gateway {pid} is not in {group.path}")
            row["rss_kb_after_start"] = memory_kb(pid)
            row["server"] = stack.server_in_use(gw)
            url = f"{gw.url}/v1"
            meter = CpuMeter(pid, group)
            watch = CpuWatch({"gateway": pid}).start()

            bar.set_postfix_str(f"{memory_mb} MB warm")
            warm = [(body_bytes("cost", 1, False), False)] * ns.warm
            warm += [(body_bytes("cost", ns.short_tokens, True), True)] * 3
            m = meter.start()
            warm_rows = run_sequential(url, key, warm)
            row["warm"] = {**m.stop(), "failures": sum(not r["ok"] for r in warm_rows)}
            failed = [r for r in warm_rows if not r["ok"]]
            if failed:
                print_logs(tmp)
                raise RuntimeError(
                    f"{len(failed)} of {len(warm_rows)} warm-up requests failed at {memory_mb} MB:"
                    f" status {failed[0]['status']}: {failed[0].get('error')}"
                )
            row["rss_kb_after_warm"] = memory_kb(pid)
            row["parser"] = stack.parser_in_use(gw)
            bar.update(1)

            m = meter.start()
            time.sleep(1.0)
            row["idle"] = m.stop()  # background work with no request: subtracted below
            idle_ms_per_s = row["idle"]["cpu_ms"] / row["idle"]["wall_s"]

            def phase(name: str, plan: list[tuple[bytes, bool]], per: int = 1) -> dict[str, Any]:
                bar.set_postfix_str(f"{memory_mb} MB {name}")
                m = meter.start()
                rows = run_sequential(url, key, plan)
                cpu = m.stop()
                n = len(plan)
                busy_ms = max(cpu["cpu_ms"] - idle_ms_per_s * cpu["wall_s"], 0.0)
                out = {**summarize_walls(rows), **cpu, "cpu_ms_per_request": round(busy_ms / n, 4)}
                out["cpu_ms_per_request_ticks"] = round(cpu["cpu_ms_ticks"] / n, 3)
                if per > 1:
                    out["cpu_us_per_token"] = round(busy_ms * 1e3 / n / per, 3)
                    out["ttfb_ms_p50"] = round(
                        statistics.median(r["ttfb_s"] for r in rows) * 1e3, 3
                    )
                bar.update(1)
                return out

            row["non_streamed"] = phase(
                "non-streamed", [(body_bytes("cost", 1, False), False)] * ns.requests
            )
            bar.set_postfix_str(f"{memory_mb} MB isolated")
            m = meter.start()
            isolated = run_sequential(
                url, key, [(body_bytes("cost", 1, False), False)] * ns.isolated, ns.isolated_gap_s
            )
            row["non_streamed_isolated"] = {
                **summarize_walls(isolated),
                "gap_before_each_s": ns.isolated_gap_s,
                "throttling": m.stop()["throttling"],
            }
            bar.update(1)
            short = body_bytes("cost", ns.short_tokens, True)
            row["stream_short"] = phase(
                "short streams", [(short, True)] * ns.short_streams, ns.short_tokens
            )
            long = body_bytes("cost", ns.long_tokens, True)
            row["stream_long"] = phase(
                "long streams", [(long, True)] * ns.long_streams, ns.long_tokens
            )
            s, lg = row["stream_short"], row["stream_long"]
            extra = ns.long_tokens - ns.short_tokens
            row["cpu_us_per_relayed_token"] = round(
                (lg["cpu_ms_per_request"] - s["cpu_ms_per_request"]) * 1e3 / extra, 3
            )

            for name, pace in (("paced", ns.pace_ms), ("paced_fast", ns.fast_pace_ms)):
                bar.set_postfix_str(f"{memory_mb} MB {name}")
                paced = body_bytes("cost", ns.paced_tokens, True, pace)
                m = meter.start()
                # Each after two periods of idle: the stream starts on a fresh quota, as one
                # arriving at an idle environment does (what came before is not its fault).
                paced_rows = run_sequential(
                    url, key, [(paced, True)] * ns.paced_streams, 2 * ns.period_us / 1e6
                )
                cpu = m.stop()
                busy_ms = max(cpu["cpu_ms"] - idle_ms_per_s * cpu["wall_s"], 0.0)
                row[name] = {
                    **summarize_paced(paced_rows, pace, ns.paced_tokens),
                    **cpu,
                    "cpu_ms_per_request": round(busy_ms / ns.paced_streams, 3),
                    # One token per network read here, unlike the pace-0 streams' batches.
                    "cpu_us_per_token": round(
                        busy_ms * 1e3 / ns.paced_streams / ns.paced_tokens, 2
                    ),
                    "cpu_share_used": round(busy_ms / 1e3 / cpu["wall_s"], 4),
                }
                bar.update(1)
            row["rss_kb_after_load"] = memory_kb(pid)
            row["machine_cpu"] = watch.stop()
        finally:
            gw.stop()
    finally:
        group.remove()
    return row


def start_in_group(
    group: cgroup_cpu.CpuQuota, data: dict[str, Any], tmp: Path, ns: argparse.Namespace
) -> tuple[local_stack.Service, dict[str, Any]]:
    """A gateway process that enters the cgroup before Python starts (a shell writes its own
    pid into cgroup.procs, then execs the interpreter), so its start runs under the quota too:
    seconds from the process's start to its first /healthz answer."""
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    launch = stack._gateway_launch(hiredis=True, fast_server=True, log_level=ns.log_level)
    procs = group.path / "cgroup.procs"
    launch["command"] = ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *launch["command"]]
    t0 = time.monotonic()
    gw = local_stack.start_gateway(config, tmp, **launch)
    seconds = time.monotonic() - t0
    return gw, {
        "seconds_to_healthz": round(seconds, 2),
        "cpu_s_to_healthz": round(thread_cpu_ns(gw.proc.pid) / 1e9, 3),
        "note": "from the checkout (not the shipped artifact), polled every 0.1 s",
    }


def warm_mock(mock_url: str) -> None:
    """The mock's first requests load its tokenizer: not part of any baseline."""
    url = f"{mock_url}/v1"
    run_sequential(url, None, [(body_bytes("mock-small", 50, True), True)] * 5)
    run_sequential(url, None, [(body_bytes("mock-small", 20, True, 10.0), True)] * 2)


def direct_rows(mock_url: str, ns: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """The same requests straight from the mock (no gateway, no quota): the baseline."""
    url = f"{mock_url}/v1"
    n_paced = max(ns.paced_streams, 2)
    return {
        "paced": run_sequential(
            url,
            None,
            [(body_bytes("mock-small", ns.paced_tokens, True, ns.pace_ms), True)] * n_paced,
        ),
        "paced_fast": run_sequential(
            url,
            None,
            [(body_bytes("mock-small", ns.paced_tokens, True, ns.fast_pace_ms), True)] * n_paced,
        ),
        "non_streamed": run_sequential(
            url, None, [(body_bytes("mock-small", 1, False), False)] * 50
        ),
        "stream_short": run_sequential(
            url, None, [(body_bytes("mock-small", ns.short_tokens, True), True)] * 10
        ),
    }


def direct_summary(parts: list[dict[str, list[dict[str, Any]]]], ns: argparse.Namespace) -> dict:
    """The baseline over every direct block of the run (one before, one after the gateways)."""
    rows = {k: [r for part in parts for r in part[k]] for k in parts[0]}
    return {
        "blocks": len(parts),
        "paced": summarize_paced(rows["paced"], ns.pace_ms, ns.paced_tokens),
        "paced_fast": summarize_paced(rows["paced_fast"], ns.fast_pace_ms, ns.paced_tokens),
        "non_streamed": summarize_walls(rows["non_streamed"]),
        "stream_short": {
            **summarize_walls(rows["stream_short"]),
            "ttfb_ms_p50": round(
                statistics.median(r["ttfb_s"] for r in rows["stream_short"]) * 1e3, 3
            ),
        },
    }


# --- the cost model -----------------------------------------------------------------------


def lambda_cost(memory_mb: int, seconds: float, arch: str) -> float:
    """USD for one invocation: the request plus duration rounded up to 1 ms, times GB."""
    billed = math.ceil(seconds * 1000 - 1e-9) / 1000
    gb_s = billed * memory_mb / 1024
    return PRICES["lambda_request_per_million"] / 1e6 + gb_s * PRICES["lambda_gb_second"][arch]


def cost_model(result: dict[str, Any], ns: argparse.Namespace) -> dict[str, Any]:
    """$ per million requests by memory size and stream length, the memory default, and the
    gateway's cost beside the model's, from a run's measurements."""
    direct = result["direct"]
    rate = ns.stream_rate
    lengths = [int(x) for x in ns.stream_lengths.split(",")]
    rows, verdicts = [], []
    for m in result["memory_sizes"]:
        mb = m["memory_mb"]
        paced, d = m["paced"], direct["paced"]
        added_ttlb_ms = (paced["ttlb_s_median"] - d["ttlb_s_median"]) * 1e3
        added_ttfb_ms = paced["ttfb_ms_median"] - d["ttfb_ms_median"]
        added_gap_ms = paced["gap_ms_p99"] - d["gap_ms_p99"]
        hwm_mb = max(m["rss_kb_after_load"]["VmHWM"], m["rss_kb_after_warm"]["VmHWM"]) / 1024
        fits = hwm_mb + ns.headroom_mb <= mb
        slowed = (
            added_ttlb_ms > ns.slow_ttlb_ms
            or added_gap_ms > ns.slow_gap_ms
            or added_ttfb_ms > ns.slow_ttfb_ms
            or paced["failures"] > 0
        )
        # A stream's billed duration: its tokens at the model's rate plus what the gateway
        # added to the last byte at this memory size (never less than nothing).
        added_s = max(added_ttlb_ms, 0.0) / 1e3
        durations = {"non_streamed": m["non_streamed"]["wall_ms_mean"] / 1e3}
        durations |= {f"stream_{n}": n / rate + added_s for n in lengths}
        per_million = {
            arch: {k: round(lambda_cost(mb, s, arch) * 1e6, 2) for k, s in durations.items()}
            for arch in PRICES["lambda_gb_second"]
        }
        rows.append(
            {
                "memory_mb": mb,
                "duration_s": {k: round(v, 4) for k, v in durations.items()},
                "usd_per_million": per_million,
                "added_ttlb_ms": round(added_ttlb_ms, 1),
                "added_ttfb_ms": round(added_ttfb_ms, 2),
                "added_gap_p99_ms": round(added_gap_ms, 2),
                "vmhwm_mb": round(hwm_mb, 1),
                "quota_used_by_stream": round(
                    paced["cpu_share_used"] / m["cgroup"]["cpu_share"], 3
                ),
                "fits_memory": fits,
                "slows_stream": slowed,
            }
        )
        if "paced_fast" in m and "paced_fast" in direct:
            f, df = m["paced_fast"], direct["paced_fast"]
            rows[-1]["fast_stream"] = {
                "tokens_per_s": round(1000 / f["pace_ms"]),
                "added_ttlb_ms": round((f["ttlb_s_median"] - df["ttlb_s_median"]) * 1e3, 1),
                "added_ttfb_ms": round(f["ttfb_ms_median"] - df["ttfb_ms_median"], 2),
                "added_gap_p99_ms": round(f["gap_ms_p99"] - df["gap_ms_p99"], 2),
            }
            fast = rows[-1]["fast_stream"]
            rows[-1]["slows_fast_stream"] = (
                fast["added_ttlb_ms"] > ns.slow_ttlb_ms
                or fast["added_gap_p99_ms"] > ns.slow_gap_ms
                or fast["added_ttfb_ms"] > ns.slow_ttfb_ms
                or f["failures"] > 0
            )
        verdicts.append((mb, fits and not slowed))
    ok = [mb for mb, good in verdicts if good]
    default = min(ok) if ok else None
    # Headroom: twice the rate holds too, and the stream leaves half the quota unused.
    roomy = [
        r["memory_mb"]
        for r in rows
        if r["memory_mb"] in ok
        and not r.get("slows_fast_stream")
        and r["quota_used_by_stream"] <= ns.max_quota_used
    ]
    share = model_share(rows, default, ns)
    return {
        "assumptions": {
            "stream_rate_tokens_per_s": rate,
            "stream_lengths": lengths,
            "region": "us-east-1, first pricing tier",
            "prices": PRICES,
            "memory_headroom_mb": ns.headroom_mb,
            "headroom_if": {
                "twice_the_rate_not_slowed": True,
                "quota_used_by_stream_at_most": ns.max_quota_used,
            },
            "slowed_if": {
                "added_ttlb_ms_over": ns.slow_ttlb_ms,
                "added_gap_p99_ms_over": ns.slow_gap_ms,
                "added_ttfb_ms_over": ns.slow_ttfb_ms,
            },
            "not_included": "the model's time to first token (billed too: seconds x GB), "
            "ElastiCache, NAT and data transfer",
        },
        "table": rows,
        "default_memory_mb": default,
        "default_with_headroom_mb": min(roomy) if roomy else None,
        "model_share": share,
    }


def model_share(rows: list[dict[str, Any]], default: int | None, ns: argparse.Namespace) -> dict:
    """The gateway's Lambda cost for one streamed request beside what the model charges."""
    out: dict[str, Any] = {
        "input_tokens": ns.share_in,
        "output_tokens": ns.share_out,
        "stream_rate": ns.stream_rate,
        "models": {},
    }
    for name, (pin, pout) in MODELS.items():
        model_usd = (ns.share_in * pin + ns.share_out * pout) / 1e6
        per_mem = {}
        for r in rows:
            seconds = ns.share_out / ns.stream_rate + max(r["added_ttlb_ms"], 0) / 1e3
            per_mem[r["memory_mb"]] = {
                arch: {
                    "gateway_usd": lambda_cost(r["memory_mb"], seconds, arch),
                    "share_of_model": round(
                        lambda_cost(r["memory_mb"], seconds, arch) / model_usd, 4
                    ),
                    "share_with_rest_api": round(
                        (
                            lambda_cost(r["memory_mb"], seconds, arch)
                            + PRICES["api_gateway_rest_per_million"] / 1e6
                        )
                        / model_usd,
                        4,
                    ),
                }
                for arch in PRICES["lambda_gb_second"]
            }
        out["models"][name] = {
            "usd_per_million_in_out": [pin, pout],
            "model_usd": model_usd,
            "by_memory": per_mem,
        }
    out["default_memory_mb"] = default
    return out


# --- printing and plotting ----------------------------------------------------------------


def print_summary(result: dict[str, Any], out: Path) -> None:
    print(f"\nwrote {out}")
    d = result["direct"]["paced"]
    print(
        f"direct paced stream: {d['tokens']} tokens at {d['pace_ms']} ms: last byte "
        f"{d['ttlb_s_median']} s, gap p99 {d['gap_ms_p99']} ms"
    )
    print(" MB   cpu ms/req  req ms p50  cpu us/token  paced ttlb s  gap p99 ms  ttfb ms  HWM MB")
    for m in result["memory_sizes"]:
        p = m["paced"]
        print(
            f"{m['memory_mb']:>5} {m['non_streamed']['cpu_ms_per_request']:>10.3f} "
            f"{m['non_streamed']['wall_ms_p50']:>11.2f} {m['cpu_us_per_relayed_token']:>13.2f} "
            f"{p['ttlb_s_median']:>13.3f} {p['gap_ms_p99']:>11.2f} {p['ttfb_ms_median']:>8.2f} "
            f"{m['rss_kb_after_load']['VmHWM'] / 1024:>7.1f}"
        )
    cost = result["cost"]
    cols = ["non_streamed"] + [f"stream_{n}" for n in cost["assumptions"]["stream_lengths"]]
    for arch in PRICES["lambda_gb_second"]:
        print(f"$ per million requests, {arch}: " + ", ".join(cols))
        for r in cost["table"]:
            cells = "  ".join(f"{r['usd_per_million'][arch][c]:>8.2f}" for c in cols)
            flags = ("" if r["fits_memory"] else " (RSS too big)") + (
                " (slows the stream)" if r["slows_stream"] else ""
            )
            print(f"  {r['memory_mb']:>5} MB  {cells}{flags}")
    print(f"default memory: {cost['default_memory_mb']} MB")


def markdown(result: dict[str, Any]) -> str:
    """The tables docs/cost.md shows, from a result file."""
    cost, direct = result["cost"], result["direct"]
    by_mb = {r["memory_mb"]: r for r in cost["table"]}
    d = direct["paced"]
    lines = [
        f"Measured {result['machine']['date_utc']} at commit "
        f"{(result['machine']['git_commit'] or '?')[:10]}"
        f"{' (tree with local changes)' if result['machine']['git_dirty'] else ''}, "
        f"{result['machine']['cpu_model']}; CFS period "
        f"{result['parameters']['period_us'] / 1000:g} ms. Straight from the mock: a "
        f"{d['tokens']}-token stream at {1000 / d['pace_ms']:.0f} tokens/s takes "
        f"{d['ttlb_s_median']:.3f} s, gap p99 {d['gap_ms_p99']:.1f} ms.",
        "",
        "| memory | CPU share | start to /healthz (s) | CPU ms / request | request ms, "
        "back to back (mean) | request ms, after idle (p50) | CPU µs / token, batched | "
        "CPU µs / token, one per read | 100 tok/s: added last byte / gap p99 / first byte (ms)"
        " | 100 tok/s: share of the quota used | 200 tok/s: added gap p99 (ms) | VmHWM MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for m in result["memory_sizes"]:
        c = by_mb[m["memory_mb"]]
        fast = c.get("fast_stream", {})
        lines.append(
            f"| {m['memory_mb']} MB | {m['cgroup']['cpu_share']:.3f} "
            f"| {m.get('start', {}).get('seconds_to_healthz', '—')} "
            f"| {m['non_streamed']['cpu_ms_per_request']:.2f} "
            f"| {m['non_streamed']['wall_ms_mean']:.1f} "
            f"| {m.get('non_streamed_isolated', {}).get('wall_ms_p50', '—')} "
            f"| {m['cpu_us_per_relayed_token']:.0f} "
            f"| {m['paced']['cpu_us_per_token']:.0f} "
            f"| {c['added_ttlb_ms']:+.0f} / {c['added_gap_p99_ms']:+.1f} / "
            f"{c['added_ttfb_ms']:+.1f}{' **slowed**' if c['slows_stream'] else ''} "
            f"| {c['quota_used_by_stream'] * 100:.0f} % "
            f"| {fast.get('added_gap_p99_ms', 0):+.1f}"
            f"{' **slowed**' if c.get('slows_fast_stream') else ''} "
            f"| {c['vmhwm_mb']:.0f} |"
        )
    cols = ["non_streamed"] + [f"stream_{n}" for n in cost["assumptions"]["stream_lengths"]]
    heads = ["non-streamed (gateway time only)"] + [
        f"{n}-token stream" for n in cost["assumptions"]["stream_lengths"]
    ]
    for arch in PRICES["lambda_gb_second"]:
        lines += [
            "",
            f"$ per million requests, Lambda only ({arch}: "
            f"${PRICES['lambda_gb_second'][arch]:.10f} per GB-s, $0.20 per million requests), "
            f"streams at {cost['assumptions']['stream_rate_tokens_per_s']:g} tokens/s:",
            "",
            "| memory | " + " | ".join(heads) + " |",
            "|---:|" + "---:|" * len(cols),
        ]
        for r in cost["table"]:
            cells = " | ".join(f"{r['usd_per_million'][arch][c]:.2f}" for c in cols)
            lines.append(f"| {r['memory_mb']} MB | {cells} |")
    share = cost["model_share"]
    lines += [
        "",
        f"The gateway's Lambda cost for one request of {share['input_tokens']} tokens in and "
        f"{share['output_tokens']} out streamed at {share['stream_rate']:g} tokens/s, as a share "
        "of the model's price (arm64; in brackets with API Gateway REST in front, +$3.50 per "
        "million):",
        "",
        "| model ($ in / out per M tokens) | model $ per request | "
        + " | ".join(f"{r['memory_mb']} MB" for r in cost["table"])
        + " |",
        "|---|---:|" + "---:|" * len(cost["table"]),
    ]
    for name, m in share["models"].items():
        pin, pout = m["usd_per_million_in_out"]
        cells = " | ".join(
            f"{a['share_of_model'] * 100:.1f} % ({a['share_with_rest_api'] * 100:.1f} %)"
            for a in (v["arm64"] for v in m["by_memory"].values())
        )
        lines.append(f"| {name} (${pin:g} / ${pout:g}) | ${m['model_usd']:.6f} | {cells} |")
    lines += [
        "",
        f"Default memory by the rule: {cost['default_memory_mb']} MB; with headroom for "
        f"twice the rate: {cost.get('default_with_headroom_mb')} MB.",
    ]
    return "\n".join(lines)


DOC = Path(__file__).resolve().parent.parent / "docs" / "cost.md"


def write_doc(result: dict[str, Any], path: Path = DOC) -> None:
    """Replace the tables between docs/cost.md's ``<!-- lambda_cost:NAME -->`` markers."""
    parts = markdown(result).split("\n\n")
    i_share = next(i for i, p in enumerate(parts) if p.startswith("The gateway's Lambda cost"))
    blocks = {
        "MEASUREMENTS": parts[:2],
        "COST": parts[2:i_share],
        "SHARE": parts[i_share:],
    }
    doc = path.read_text()
    for name, body in blocks.items():
        begin, end = f"<!-- lambda_cost:{name} -->", f"<!-- /lambda_cost:{name} -->"
        head, found, rest = doc.partition(begin)
        _, found_end, tail = rest.partition(end)
        if not (found and found_end):
            raise SystemExit(f"{path}: no {begin} ... {end} block")
        doc = head + begin + "\n" + "\n\n".join(body).strip() + "\n" + end + tail
    path.write_text(doc)
    print(f"updated the tables in {path}")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = result["memory_sizes"]
    mb = [m["memory_mb"] for m in ms]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    ax.plot(mb, [m["non_streamed"]["wall_ms_mean"] for m in ms], "o-", label="back to back (mean)")
    iso = [m.get("non_streamed_isolated", {}).get("wall_ms_p50") for m in ms]
    if all(v is not None for v in iso):
        ax.plot(mb, iso, "s-", label="after idle (p50)")
    ax.set_xlabel("memory (MB)")
    ax.set_ylabel("ms per non-streamed request")
    ax.set_yscale("log")
    ax.set_title("duration, one request in flight")
    ax.legend()
    ax = axes[1]
    for name in ("paced", "paced_fast"):
        if all(name in m for m in ms):
            rate = 1000 / ms[0][name]["pace_ms"]
            used = [m[name]["cpu_share_used"] / m["cgroup"]["cpu_share"] * 100 for m in ms]
            ax.plot(mb, used, "o-", label=f"{rate:.0f} tokens/s")
    ax.axhline(100, color="red", ls="--", label="the whole quota")
    ax.axhline(50, color="grey", ls=":", label="half of it")
    ax.set_xlabel("memory (MB)")
    ax.set_ylabel("% of the CPU quota")
    ax.set_yscale("log")
    ax.set_title("CPU quota a paced stream uses")
    ax.legend()
    ax = axes[2]
    cost = result["cost"]
    for col in ["non_streamed"] + [f"stream_{n}" for n in cost["assumptions"]["stream_lengths"]]:
        ax.plot(
            [r["memory_mb"] for r in cost["table"]],
            [r["usd_per_million"]["arm64"][col] for r in cost["table"]],
            "o-",
            label=col.replace("_", " "),
        )
    ax.set_xlabel("memory (MB)")
    ax.set_ylabel("$ per million requests (arm64)")
    ax.set_yscale("log")
    ax.set_title("Lambda cost")
    ax.legend()
    fig.suptitle(f"Hardcap on an emulated Lambda CPU share ({result['machine']['cpu_model']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def print_logs(tmp: Path, lines: int = 15) -> None:
    for log in sorted(tmp.glob("gateway-*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        print(f"--- {log.name} (last {len(tail)} lines)", *tail, sep="\n", file=sys.stderr)


# --- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    if ns.report:
        result = json.loads(ns.report.read_text())
        result["cost"] = cost_model(result, ns)
        write_json(ns.report, result)
        print_summary(result, ns.report)
        if ns.markdown:
            print(markdown(result))
        if ns.write_doc:
            write_doc(result)
        if ns.plot:
            plot(result, ns.report.with_suffix(".png"))
        return 0
    if not cgroup_cpu.is_root():
        print("bench/lambda_cost.py needs root to create cgroups", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = ns.out or RESULTS / ("lambda-cost-quick.json" if ns.quick else "lambda-cost.json")
    sizes = [int(x) for x in ns.memory.split(",")]
    stale = cgroup_cpu.remove_stale()
    result: dict[str, Any] = {
        "benchmark": "lambda-cost",
        "command": "flock /tmp/hardcap-bench.lock .venv/bin/python -m bench.lambda_cost "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "complete": False,
        "machine": machine_info(),
        "cgroup_backend": cgroup_cpu.backend()[0],  # type: ignore[index]
        "stale_cgroups_removed": stale,
        "parameters": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(ns).items()},
            "one_vcpu_mb": ONE_VCPU_MB,
            "route": ROUTE,
            "gateway_processes": 1,
            "in_flight": 1,
            "outside_the_cgroup": ["mock upstream", "valkey", "load generator"],
            "cpu_measure": "gateway threads' on-CPU time (/proc/<pid>/task/*/schedstat), "
            "minus its idle rate; utime+stime ticks beside it",
        },
        "memory_sizes": [],
    }
    started = time.monotonic()
    bar = tqdm(total=7 * len(sizes) + 2, unit="phase")
    with tempfile.TemporaryDirectory(prefix="hardcap-cost-") as tmp_name, LocalValkey() as vk:
        tmp = Path(tmp_name)
        mock = stack.start_mock(tmp, pace_ms=0.0, seed=13)
        try:
            data = stack.base_config(mock.url, vk.url)
            data["routes"] = [ROUTE]
            data["tenants"] = [stack.tenant_entry(TENANT, 10**15, "30d")]
            bar.set_postfix_str("direct")
            warm_mock(mock.url)
            direct = [direct_rows(mock.url, ns)]
            bar.update(1)
            for mb in sizes:
                try:
                    result["memory_sizes"].append(measure_memory_size(mb, data, tmp, ns, bar))
                except Exception:
                    print_logs(tmp)  # a gateway that would not start says why in its log
                    raise
                write_json(out, result)
            bar.set_postfix_str("direct")
            direct.append(direct_rows(mock.url, ns))
            result["direct"] = direct_summary(direct, ns)
            bar.update(1)
        finally:
            bar.close()
            mock.stop()
            cgroup_cpu.remove_stale()
    result["complete"] = True
    result["seconds"] = round(time.monotonic() - started, 1)
    result["cost"] = cost_model(result, ns)
    write_json(out, result)
    print_summary(result, out)
    if ns.markdown:
        print(markdown(result))
    if ns.write_doc:
        write_doc(result)
    if ns.plot:
        plot(result, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
