"""What one request costs the gateway process, for bench/cost/lambda_cost.py: its threads' on-CPU
time and memory from /proc, sequential requests and streams (one in flight, as a Lambda
environment serves them) over the benchmarks' HTTP/1.1 client, and their summaries."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from bench.lib import cgroup_cpu
from bench.lib.machine import process_cpu_seconds
from tests.load.harness import chat_body
from tests.load.http1 import Client

TENANT = "cost"
MAX_TOKENS = 4096


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
