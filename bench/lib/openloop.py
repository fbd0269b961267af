"""Open-loop load: requests go out on a fixed schedule whether or not earlier ones came back.

Latency is measured from each request's SCHEDULED send time, so a stall in the server (or in
this load generator) shows up in the latency of every request it delayed, instead of silently
lowering the offered rate (coordinated omission). Also a closed-loop driver for capacity.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tests.load.http1 import Client, ProtocolError

# One request: returns its outcome ("ok", "http_429", ...) and when its first body byte came.
Send = Callable[[], Awaitable[tuple[str, float | None]]]


@dataclass
class Sample:
    scheduled: float
    first_byte: float | None
    done: float
    outcome: str


def chat_sender(client: Client, body: dict[str, Any], key: str | None) -> Send:
    """A :data:`Send` posting ``body`` to /chat/completions; reads the whole body."""
    raw = json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"

    async def send() -> tuple[str, float | None]:
        first: float | None = None
        async with client.stream("POST", "/chat/completions", raw, headers) as r:
            async for _ in r.chunks():
                if first is None:
                    first = time.perf_counter()
            return ("ok" if r.status == 200 else f"http_{r.status}"), first

    return send


async def _timed(send: Send, scheduled: float, timeout_s: float) -> Sample:
    try:
        async with asyncio.timeout(timeout_s):
            outcome, first = await send()
    except TimeoutError:
        outcome, first = "timeout", None
    except (OSError, ProtocolError, asyncio.IncompleteReadError) as e:
        outcome, first = f"transport:{type(e).__name__}", None
    return Sample(scheduled, first, time.perf_counter(), outcome)


async def open_loop(
    send: Send, rate: float, duration_s: float, *, timeout_s: float = 10.0, max_pending: int = 4000
) -> list[Sample]:
    """``rate`` requests per second for ``duration_s``; every request's sample, in order.

    Beyond ``max_pending`` unanswered requests the generator sheds a request instead of
    sending it (outcome "shed", latency = time until it would have been sent), so an
    overloaded server cannot make the run unbounded.
    """
    count = int(rate * duration_s)
    start = time.perf_counter() + 0.05
    tasks: list[asyncio.Task[Sample]] = []
    shed: list[Sample] = []
    pending = 0

    def done(_: object) -> None:
        nonlocal pending
        pending -= 1

    for i in range(count):
        at = start + i / rate
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if pending >= max_pending:
            shed.append(Sample(at, None, time.perf_counter(), "shed"))
            continue
        task = asyncio.create_task(_timed(send, at, timeout_s))
        pending += 1
        task.add_done_callback(done)
        tasks.append(task)
    samples = list(await asyncio.gather(*tasks)) + shed
    samples.sort(key=lambda s: s.scheduled)
    return samples


async def closed_loop(send: Send, workers: int, duration_s: float) -> dict[str, Any]:
    """``workers`` clients each sending back to back for ``duration_s``: the capacity."""
    stop = time.perf_counter() + duration_s
    ok = failed = 0

    async def worker() -> None:
        nonlocal ok, failed
        while time.perf_counter() < stop:
            sample = await _timed(send, time.perf_counter(), 10.0)
            if sample.outcome == "ok":
                ok += 1
            else:
                failed += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    wall = time.perf_counter() - started
    return {
        "workers": workers,
        "seconds": round(wall, 2),
        "ok": ok,
        "failed": failed,
        "requests_per_second": round(ok / wall, 1),
    }


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of ``values``; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


def stats(samples: list[Sample], skip_s: float = 0.0) -> dict[str, Any]:
    """Latency (ms, from scheduled time) of successful requests scheduled after ``skip_s``."""
    if not samples:
        return {"requests": 0}
    t0 = samples[0].scheduled + skip_s
    kept = [s for s in samples if s.scheduled >= t0]
    ok = [s for s in kept if s.outcome == "ok"]
    total = [(s.done - s.scheduled) * 1000 for s in ok]
    ttfb = [(s.first_byte - s.scheduled) * 1000 for s in ok if s.first_byte is not None]
    span = (kept[-1].scheduled - kept[0].scheduled) if len(kept) > 1 else 0.0
    done_in_span = [s for s in ok if s.done <= kept[-1].scheduled] if span else ok
    failures: dict[str, int] = {}
    for s in kept:
        if s.outcome != "ok":
            failures[s.outcome] = failures.get(s.outcome, 0) + 1

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {
        "requests": len(kept),
        "ok": len(ok),
        "failures": failures,
        "offered_per_second": r(len(kept) / span) if span else None,
        # Completions inside the sending window: falls behind the offered rate at saturation.
        "achieved_per_second": r(len(done_in_span) / span) if span else None,
        "p50_ms": r(percentile(total, 50)),
        "p90_ms": r(percentile(total, 90)),
        "p99_ms": r(percentile(total, 99)),
        "max_ms": r(max(total, default=None)),
        "ttfb_p50_ms": r(percentile(ttfb, 50)),
        "ttfb_p99_ms": r(percentile(ttfb, 99)),
    }
