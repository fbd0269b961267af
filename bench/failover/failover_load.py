"""The failover experiment's load and its bookkeeping: an open-loop generator of streaming
requests that records, per request, how it ended; the breaker's timeline; per-window summaries.

Every request is a streamed chat completion. Its outcome is decided from what the client got:

* ``ok``: status 200, a finish reason and ``data: [DONE]``, no error event;
* ``error_event``: status 200 and the stream ended cleanly with an SSE error event (what the
  gateway sends when its upstream dies after bytes reached the client);
* ``dropped``: the connection ended mid-stream or the stream ended with neither [DONE] nor an
  error event;
* ``http_<status>``, ``timeout``, ``transport:<error>``: the request failed before a stream.

Latencies are measured from each request's *scheduled* send time (no coordinated omission); the
time it was really written (``sent``) is kept too, so "sent after the kill" means sent.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis.asyncio as aioredis

from bench.lib.openloop import percentile
from tests.load.http1 import Client, ProtocolError

REQUEST_TIMEOUT_S = 15.0
OK, ERROR_EVENT, DROPPED = "ok", "error_event", "dropped"


@dataclass
class Shot:
    """One request: when it was due, sent, answered and done (perf_counter s), how it ended."""

    id: str
    gateway: int
    scheduled: float
    sent: float | None = None
    first_byte: float | None = None
    done: float | None = None
    outcome: str = "pending"
    error_code: str | None = None
    usage_tokens: int | None = None  # total_tokens of the closing usage chunk
    served_by: str | None = None  # which mock generated it (joined from GET /mock/requests)

    def as_json(self, t0: float) -> dict[str, Any]:
        """Times relative to ``t0`` (the phase's start), in seconds."""
        row = asdict(self)
        for k in ("scheduled", "sent", "first_byte", "done"):
            if row[k] is not None:
                row[k] = round(row[k] - t0, 4)
        return row


def classify(status: int, body: bytes, complete: bool) -> tuple[str, str | None, int | None]:
    """(outcome, error code, total tokens of the usage chunk) of one streamed reply."""
    if status != 200:
        try:
            code = json.loads(body)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
        return f"http_{status}", code, None
    done = finish = False
    error: str | None = None
    usage: int | None = None
    for event in body.split(b"\n\n"):
        if not event.startswith(b"data: "):
            continue
        if event == b"data: [DONE]":
            done = True
            continue
        try:
            chunk = json.loads(event[6:])
        except ValueError:
            continue
        if isinstance(chunk.get("error"), dict):
            error = str(chunk["error"].get("code") or chunk["error"].get("type"))
        for choice in chunk.get("choices") or ():
            finish = finish or bool(choice.get("finish_reason"))
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"].get("total_tokens")
    if error is not None and complete:
        return ERROR_EVENT, error, usage
    if done and finish and complete:
        return OK, None, usage
    return DROPPED, error, usage


def stream_body(shot_id: str, model: str, tenant: str, tokens: int) -> bytes:
    """A streamed request for ``tokens`` output tokens, carrying its id for the mocks' records."""
    body = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": tokens * 2,
        "user": tenant,
        "metadata": {"hardcap_bench_id": shot_id},
        "messages": [{"role": "user", "content": f"Failover check. [mock:tokens={tokens}]"}],
    }
    return json.dumps(body).encode()


async def send(client: Client, key: str | None, shot: Shot, body: bytes) -> None:
    """Send ``shot``'s request and record how it ended (never raises)."""
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    parts: list[bytes] = []
    status, complete = 0, False
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            shot.sent = time.perf_counter()
            async with client.stream("POST", "/chat/completions", body, headers) as r:
                status = r.status
                async for piece in r.chunks():
                    if shot.first_byte is None:
                        shot.first_byte = time.perf_counter()
                    parts.append(piece)
                complete = True
    except TimeoutError:
        shot.outcome = "timeout"
    except (OSError, ProtocolError, asyncio.IncompleteReadError) as e:
        # A stream that had begun and then lost its connection is a dropped stream.
        shot.outcome = DROPPED if status == 200 else f"transport:{type(e).__name__}"
    shot.done = time.perf_counter()
    if shot.outcome == "pending":
        shot.outcome, shot.error_code, shot.usage_tokens = classify(
            status, b"".join(parts), complete
        )
    elif status == 200:
        _, shot.error_code, shot.usage_tokens = classify(status, b"".join(parts), False)


Hook = tuple[float, Callable[[], Awaitable[None]]]


async def open_loop(
    clients: Sequence[Client],
    key: str,
    make_body: Callable[[str], bytes],
    rate: float,
    duration_s: float,
    prefix: str,
    *,
    hooks: Iterable[Hook] = (),
    on_done: Callable[[Shot], None] | None = None,
) -> tuple[float, list[Shot]]:
    """``rate`` requests/s for ``duration_s``, round-robin over ``clients``; each hook runs at
    its offset (s from the start). Returns the start (perf_counter) and every shot, in order."""
    count = int(rate * duration_s)
    t0 = time.perf_counter() + 0.05
    shots: list[Shot] = []
    tasks: list[asyncio.Task[None]] = []
    background = [asyncio.create_task(_at(t0 + at, fn)) for at, fn in hooks]

    async def one(shot: Shot) -> None:
        await send(clients[shot.gateway], key, shot, make_body(shot.id))
        if on_done is not None:
            on_done(shot)

    for i in range(count):
        at = t0 + i / rate
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        shot = Shot(f"{prefix}-{i}", i % len(clients), at)
        shots.append(shot)
        tasks.append(asyncio.create_task(one(shot)))
    await asyncio.gather(*tasks, *background)
    return t0, shots


async def _at(when: float, fn: Callable[[], Awaitable[None]]) -> None:
    delay = when - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    await fn()


class BreakerWatch:
    """Polls an upstream's shared breaker (the hash ``lua/breaker.lua`` keeps) and records
    every change of state or failure count, with its time."""

    def __init__(self, redis_url: str, key: str, every_s: float = 0.05) -> None:
        self.redis_url = redis_url
        self.key = key
        self.every_s = every_s
        self.changes: list[tuple[float, str, int]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        names = {"o": "open", "h": "half_open"}
        client = aioredis.Redis.from_url(self.redis_url)
        try:
            while True:
                raw = await client.hmget(self.key, "s", "f")
                code = raw[0].decode() if isinstance(raw[0], bytes) else (raw[0] or "c")
                now = (names.get(code, "closed"), int(raw[1] or 0))
                if not self.changes or self.changes[-1][1:] != now:
                    self.changes.append((time.perf_counter(), *now))
                await asyncio.sleep(self.every_s)
        finally:
            await client.aclose()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def timeline(self, t0: float, t1: float) -> list[dict[str, Any]]:
        """The changes between ``t0`` and ``t1``, with the state in force at ``t0`` first."""
        out: list[dict[str, Any]] = []
        for at, state, failures in self.changes:
            if at > t1:
                break
            row = {"t": round(max(at - t0, 0.0), 3), "state": state, "failures": failures}
            if at <= t0 and out:
                out[-1] = row
            else:
                out.append(row)
        return out


def _ms(values: list[float]) -> dict[str, float | None]:
    def r(x: float | None) -> float | None:
        return None if x is None else round(x * 1000, 2)

    return {
        "p50": r(percentile(values, 50)),
        "p99": r(percentile(values, 99)),
        "max": r(max(values, default=None)),
    }


def summarize(shots: Sequence[Shot]) -> dict[str, Any]:
    """Counts by outcome and by upstream, and latency of the ok requests from scheduled time."""
    outcomes: dict[str, int] = {}
    served: dict[str, int] = {}
    for s in shots:
        outcomes[s.outcome] = outcomes.get(s.outcome, 0) + 1
        who = s.served_by or "none"
        served[who] = served.get(who, 0) + 1
    ok = [s for s in shots if s.outcome == OK and s.done is not None]
    ttfb = [s.first_byte - s.scheduled for s in ok if s.first_byte is not None]
    lag = [s.sent - s.scheduled for s in shots if s.sent is not None]
    return {
        "requests": len(shots),
        "ok": len(ok),
        "failed": len(shots) - len(ok),
        "outcomes": dict(sorted(outcomes.items())),
        "served_by": dict(sorted(served.items())),
        "ttfb_ms": _ms(ttfb),
        "total_ms": _ms([s.done - s.scheduled for s in ok if s.done is not None]),
        "send_lag_ms": _ms(lag),  # the generator's own lateness: scheduled -> written
    }


def window(shots: Sequence[Shot], t0: float, lo: float, hi: float) -> list[Shot]:
    """Shots scheduled in [t0+lo, t0+hi)."""
    return [s for s in shots if t0 + lo <= s.scheduled < t0 + hi]


def bins(shots: Sequence[Shot], t0: float, width_s: float) -> list[dict[str, Any]]:
    """Per ``width_s`` of scheduled time: requests per upstream, failures, ok latency p50/p99."""
    if not shots:
        return []
    last = int((shots[-1].scheduled - t0) // width_s)
    out = []
    for b in range(last + 1):
        part = window(shots, t0, b * width_s, (b + 1) * width_s)
        s = summarize(part)
        ok_by: dict[str, int] = {}
        for shot in part:
            if shot.outcome == OK:
                ok_by[shot.served_by or "none"] = ok_by.get(shot.served_by or "none", 0) + 1
        out.append(
            {
                "t": round(b * width_s, 3),
                "requests": s["requests"],
                "failed": s["failed"],
                "ok_served_by": ok_by,
                "ttfb_ms": s["ttfb_ms"],
                "total_ms": s["total_ms"],
            }
        )
    return out


def join_served(shots: Iterable[Shot], records: dict[str, dict[str, Any]]) -> None:
    """Name each shot's upstream from the mocks' per-request records (``{upstream: records}``);
    the last upstream that recorded a shot served it (a fallback is recorded after)."""
    for shot in shots:
        for name, recs in records.items():
            if shot.id in recs:
                shot.served_by = name
