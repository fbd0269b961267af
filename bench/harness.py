"""Load drivers shared by the benchmarks and the concurrency tests.

A tenant's clients run ``concurrency`` streams at once, round-robin over the gateway URLs, each
starting a new request as soon as the last ends, until the budget answers ``budget_exceeded``.
``budget_busy`` is retried after a short jittered pause, as a well-behaved client would.
Clients speak raw SSE over httpx: lighter than the SDK, so the load generator is not the
bottleneck on a 2-core machine.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx


@dataclass
class TenantRun:
    tenant: str
    requests: int = 0
    completed: int = 0
    truncated: int = 0  # finish_reason "length" from the gateway cutting the stream
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


async def drive_tenant(
    urls: list[str],
    key: str,
    tenant: str,
    *,
    concurrency: int,
    model: str,
    max_tokens: int,
    time_limit_s: float = 120.0,
    busy_pause_s: tuple[float, float] = (0.05, 0.3),
    seed: int = 0,
) -> TenantRun:
    """Spend ``tenant``'s budget with ``concurrency`` streams until it is exceeded."""
    run = TenantRun(tenant)
    rng = random.Random(seed)
    started = time.monotonic()
    done = asyncio.Event()
    body = {
        "model": model,
        "stream": True,
        "max_tokens": max_tokens,
        "user": tenant,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"Tell tenant {tenant} about budgets."}],
    }
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:

        async def worker(i: int) -> None:
            n = i
            while not done.is_set() and time.monotonic() - started < time_limit_s:
                url = urls[n % len(urls)]
                n += 1
                try:
                    outcome, tokens, _ = await stream_once(http, url, key, body)
                except httpx.HTTPError as e:
                    outcome, tokens = "transport_error", 0
                    if len(run.error_samples) < 5:
                        run.error_samples.append(repr(e))
                run.requests += 1
                run.output_tokens_seen += tokens
                if outcome == "completed":
                    run.completed += 1
                elif outcome == "truncated":
                    run.truncated += 1
                elif outcome == "budget_busy":
                    run.busy += 1
                    await asyncio.sleep(rng.uniform(*busy_pause_s))
                elif outcome == "budget_exceeded":
                    run.exceeded += 1
                    done.set()
                elif outcome == "rate_limited":
                    run.rate_limited += 1
                    await asyncio.sleep(rng.uniform(*busy_pause_s))
                else:
                    run.errors += 1
                    if len(run.error_samples) < 5:
                        run.error_samples.append(outcome)
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    run.seconds = round(time.monotonic() - started, 3)
    return run


def reserved_left(url: str, key: str) -> int:
    """Reserved tokens (all budgets) still held for the key's tenant, read through the gateway."""
    r = httpx.get(f"{url}/hardcap/usage", headers={"authorization": f"Bearer {key}"})
    r.raise_for_status()
    return sum(b["reserved"] for b in r.json()["budgets"] if b["unit"] == "tokens")
