"""Load drivers shared by the benchmarks and the concurrency tests.

A tenant's clients run ``concurrency`` streams at once, round-robin over the gateway URLs, each
starting a new request as soon as the last ends, until the budget answers ``budget_exceeded``.
``budget_busy`` and ``rate_limited`` are retried after the gateway's ``retry-after-ms`` (or
``retry-after``) with 0-20 % jitter, as the official SDKs do, unless a fixed pause is given.
:func:`drive_tenant` speaks raw SSE over :mod:`bench.http1` (a lean keep-alive client: the
load generator must not be the bottleneck on a 2-core machine) and parses only the last few
events of each stream (the finish chunk, the usage chunk, or an error event).
:func:`stream_once` is the same exchange over httpx, for callers that already hold a client.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from bench.http1 import Client, ProtocolError

REQUEST_TIMEOUT_S = 300.0  # one stream, start to end: a hung request is an error, not a stall


@dataclass
class TenantRun:
    tenant: str
    requests: int = 0
    completed: int = 0
    truncated: int = 0  # finish_reason "length" below max_tokens: the gateway cut the stream
    capped: int = 0  # finish_reason "length" at max_tokens: the model's own cap
    busy: int = 0
    exceeded: int = 0
    rate_limited: int = 0
    errors: int = 0
    output_tokens_seen: int = 0  # completion tokens the clients' usage chunks reported
    seconds: float = 0.0
    error_samples: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


async def stream_once(
    http: httpx.AsyncClient, url: str, key: str, body: dict[str, Any]
) -> tuple[str, int, dict[str, str]]:
    """One streamed completion: (outcome, completion tokens reported, response headers)."""
    headers = {"authorization": f"Bearer {key}"}
    async with http.stream("POST", f"{url}/chat/completions", json=body, headers=headers) as r:
        if r.status_code == 429:
            data = json.loads(await r.aread())
            return data["error"]["code"], 0, dict(r.headers)
        if r.status_code != 200:
            return f"http_{r.status_code}", 0, dict(r.headers)
        finish, tokens = None, 0
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return "stream_error", tokens, dict(r.headers)
            for choice in chunk.get("choices") or ():
                finish = choice.get("finish_reason") or finish
            if chunk.get("usage"):
                tokens = chunk["usage"].get("completion_tokens", 0)
        return ("truncated" if finish == "length" else "completed"), tokens, dict(r.headers)


async def stream_raw(
    client: Client, key: str, body: bytes, max_tokens: int
) -> tuple[str, int, dict[str, str]]:
    """:func:`stream_once` over :class:`bench.http1.Client`; ``body`` is the JSON request.

    Outcomes: completed, truncated (cut by the gateway), capped (the reply reached
    max_tokens), a 429 error code, http_<status>, stream_error.
    """
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    async with client.stream("POST", "/chat/completions", body, headers) as r:
        if r.status != 200:
            raw = await r.read()
            if r.status == 429:
                return str(json.loads(raw)["error"]["code"]), 0, r.headers
            return f"http_{r.status}", 0, r.headers
        tail: deque[bytes] = deque(maxlen=4)
        buffer = b""
        async for piece in r.chunks():
            buffer += piece
            *events, buffer = buffer.split(b"\n\n")
            tail.extend(events)
    finish, tokens = None, 0
    for event in tail:
        if not event.startswith(b"data: ") or event == b"data: [DONE]":
            continue
        chunk = json.loads(event[6:])
        if "error" in chunk:
            return "stream_error", tokens, r.headers
        for choice in chunk.get("choices") or ():
            finish = choice.get("finish_reason") or finish
        if chunk.get("usage"):
            tokens = chunk["usage"].get("completion_tokens", 0)
    if finish == "length":
        return ("capped" if tokens >= max_tokens else "truncated"), tokens, r.headers
    return "completed", tokens, r.headers


def chat_body(
    tenant: str, model: str, max_tokens: int, prompt: str | None = None, stream: bool = True
) -> dict[str, Any]:
    """The request every benchmark client sends; the mock counts it under ``tenant``."""
    body: dict[str, Any] = {
        "model": model,
        "stream": stream,
        "max_tokens": max_tokens,
        "user": tenant,
        "messages": [{"role": "user", "content": prompt or f"Tell tenant {tenant} about budgets."}],
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def drive_tenant(
    urls: list[str],
    key: str,
    tenant: str,
    *,
    concurrency: int,
    model: str,
    max_tokens: int,
    time_limit_s: float = 120.0,
    busy_pause_s: tuple[float, float] | None = None,
    seed: int = 0,
) -> TenantRun:
    """Spend ``tenant``'s budget with ``concurrency`` streams until it is exceeded.

    Stops starting requests at the first ``budget_exceeded`` or after ``time_limit_s``;
    streams already running finish. After a 429 a client waits ``busy_pause_s`` (uniform in
    LOW, HIGH) if given, else what the response's Retry-After headers say.
    """
    run = TenantRun(tenant)
    rng = random.Random(seed)
    started = time.monotonic()
    done = asyncio.Event()
    body = json.dumps(chat_body(tenant, model, max_tokens)).encode()
    clients = [Client(url, max_connections=concurrency) for url in urls]

    def pause(headers: dict[str, str]) -> float:
        if busy_pause_s is not None:
            return rng.uniform(*busy_pause_s)
        return retry_after_s(headers) * rng.uniform(1.0, 1.2)

    async def worker(i: int) -> None:
        n = i
        while not done.is_set() and time.monotonic() - started < time_limit_s:
            client = clients[n % len(clients)]
            n += 1
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    outcome, tokens, headers = await stream_raw(client, key, body, max_tokens)
                sample = outcome
            except (OSError, ProtocolError, asyncio.IncompleteReadError, TimeoutError) as e:
                outcome, tokens, sample = "transport_error", 0, repr(e)
                headers = {}
            run.requests += 1
            run.output_tokens_seen += tokens
            if outcome == "completed":
                run.completed += 1
            elif outcome == "truncated":
                run.truncated += 1
            elif outcome == "capped":
                run.capped += 1
            elif outcome == "budget_busy":
                run.busy += 1
                await asyncio.sleep(pause(headers))
            elif outcome == "budget_exceeded":
                run.exceeded += 1
                done.set()
            elif outcome == "rate_limited":
                run.rate_limited += 1
                await asyncio.sleep(pause(headers))
            else:
                run.errors += 1
                if len(run.error_samples) < 5:
                    run.error_samples.append(sample)
                await asyncio.sleep(0.05)

    try:
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    finally:
        for client in clients:
            await client.aclose()
    run.seconds = round(time.monotonic() - started, 3)
    return run


def retry_after_s(headers: dict[str, str], default: float = 1.0) -> float:
    """Seconds a 429 asks the client to wait: ``retry-after-ms`` first, then ``retry-after``."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            return max(0.0, float(headers[name]) / scale)
        except (KeyError, ValueError):
            continue
    return default


def reserved_left(url: str, key: str) -> int:
    """Reserved tokens (all budgets) still held for the key's tenant, read through the gateway."""
    return sum(b["reserved"] for b in usage_rows(url, key) if b["unit"] == "tokens")


def usage_rows(url: str, key: str) -> list[dict[str, Any]]:
    """The budget rows of GET /v1/hardcap/usage for the key's tenant."""
    r = httpx.get(f"{url}/hardcap/usage", headers={"authorization": f"Bearer {key}"})
    r.raise_for_status()
    rows: list[dict[str, Any]] = r.json()["budgets"]
    return rows
