"""A tenant's clients sending a workload's requests (:mod:`bench.prompts`), each a different
body, as the official openai SDK sends and retries them.

:func:`bench.harness.drive_tenant` sends one short body over and over; here every logical
request takes the next body of the tenant's share of a pool, and a retry sends the same body
again, as the SDK does. The rest is the harness's: :func:`bench.harness.stream_raw` over the
lean :mod:`bench.http1` client, :class:`bench.harness.TenantRun`'s tallies, the SDK's retry rules
(:mod:`bench.sdk_retry`). At the first refusal of any kind, the mock's prompt and completion
tokens for the tenant are fetched apart, so that a cost budget can price them.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from typing import Any

from bench import sdk_retry
from bench.harness import (
    REFUSALS,
    REQUEST_TIMEOUT_S,
    SERVED,
    TenantRun,
    queue_wait_ms,
    stream_raw,
)
from bench.http1 import Client, ProtocolError
from bench.prompts import MAX_TOKENS


def payloads(bodies: Sequence[dict[str, Any]]) -> list[bytes]:
    """Each body's JSON without its braces, to be spliced after a request's own fields."""
    return [json.dumps(b, separators=(",", ":")).encode()[1:-1] for b in bodies]


def request_bytes(tenant: str, model: str, payload: bytes) -> bytes:
    """A streamed request of ``tenant`` to ``model`` carrying ``payload`` (:func:`payloads`)."""
    head = {
        "model": model,
        "user": tenant,  # the mock's ground truth is kept per user
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return json.dumps(head, separators=(",", ":")).encode()[:-1] + b"," + payload + b"}"


async def drive_workload(
    urls: list[str],
    key: str,
    tenant: str,
    *,
    concurrency: int,
    model: str,
    pool: Sequence[bytes],
    start: int,
    time_limit_s: float,
    seed: int,
    truth_url: str,
    max_retries: int = sdk_retry.DEFAULT_MAX_RETRIES,
) -> TenantRun:
    """Spend ``tenant``'s budget with ``concurrency`` SDK-like clients until it is exceeded.

    Logical requests take ``pool``'s payloads in turn from ``start``; each is retried as the
    SDK retries (at most ``max_retries`` times), then counted failed. Stops starting requests
    at the first ``budget_exceeded`` or after ``time_limit_s``; streams running finish.
    """
    run = TenantRun(tenant, client=f"sdk:{max_retries}")
    rng = random.Random(seed)
    started = time.monotonic()
    done = asyncio.Event()
    clients = [Client(url, max_connections=concurrency) for url in urls]
    truth = Client(truth_url, max_connections=1)
    fetches: list[asyncio.Task[None]] = []
    taken = [start]

    def going() -> bool:
        return not done.is_set() and time.monotonic() - started < time_limit_s

    def next_body() -> bytes:
        taken[0] += 1
        return request_bytes(tenant, model, pool[(taken[0] - 1) % len(pool)])

    async def fetch_truth(record: dict[str, Any]) -> None:
        t0 = time.monotonic()
        try:
            _, _, raw = await truth.request("GET", "/mock/ground-truth")
            row = json.loads(raw)["tenants"].get(tenant, {})
            record["prompt_tokens"] = int(row.get("prompt_tokens", 0))
            record["completion_tokens"] = int(row.get("completion_tokens", 0))
            record["ground_truth_tokens"] = record["prompt_tokens"] + record["completion_tokens"]
        except (OSError, ProtocolError, asyncio.IncompleteReadError, ValueError) as e:
            record["fetch_error"] = repr(e)
        record["fetch_s"] = round(time.monotonic() - t0, 4)

    def tally(outcome: str, tokens: int, headers: dict[str, str], status: int | None) -> None:
        run.requests += 1
        run.output_tokens_seen += tokens
        if status is not None:
            run.queue_waits_ms.append(queue_wait_ms(headers))
        if outcome in REFUSALS and run.first_refusal is None:
            run.first_refusal = {"outcome": outcome, "at_s": round(time.monotonic() - started, 3)}
            fetches.append(asyncio.create_task(fetch_truth(run.first_refusal)))
        if outcome in SERVED:
            setattr(run, outcome, getattr(run, outcome) + 1)
        elif outcome == "budget_busy":
            run.busy += 1
        elif outcome == "budget_exceeded":
            run.exceeded += 1
            done.set()
        elif outcome in ("rate_limited", "overloaded"):
            setattr(run, outcome, getattr(run, outcome) + 1)
        else:
            run.errors += 1

    async def attempt(n: int, body: bytes) -> tuple[str, dict[str, str], int | None]:
        client = clients[n % len(clients)]
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                outcome, tokens, headers, status = await stream_raw(client, key, body, MAX_TOKENS)
            sample = outcome
        except (OSError, ProtocolError, asyncio.IncompleteReadError, TimeoutError) as e:
            outcome, tokens, headers, status, sample = "transport_error", 0, {}, None, repr(e)
        tally(outcome, tokens, headers, status)
        if outcome not in SERVED and outcome not in REFUSALS and len(run.error_samples) < 5:
            run.error_samples.append(sample)
        return outcome, headers, status

    async def client_loop(i: int) -> None:
        n = i
        while going():
            body, retried = next_body(), 0
            while True:
                outcome, headers, status = await attempt(n, body)
                n += 1
                if outcome in SERVED or outcome in ("budget_exceeded", "stream_error"):
                    break  # served, the run is over, or an error the SDK raises mid-stream
                if retried >= max_retries or not sdk_retry.should_retry(status, headers):
                    if outcome in REFUSALS or status is None or status >= 500:
                        run.failed += 1
                        run.failed_outcomes[outcome] = run.failed_outcomes.get(outcome, 0) + 1
                    break
                await asyncio.sleep(sdk_retry.retry_delay_s(retried, headers, rng))
                retried += 1
                run.retries += 1
                if not going():
                    break  # the budget ran out meanwhile: the client stops, nothing failed

    try:
        await asyncio.gather(*(client_loop(i) for i in range(concurrency)))
        if fetches:
            await asyncio.gather(*fetches)
    finally:
        for client in [*clients, truth]:
            await client.aclose()
    run.seconds = round(time.monotonic() - started, 3)
    return run
