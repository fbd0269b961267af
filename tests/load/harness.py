"""Load drivers shared by the benchmarks and the concurrency tests.

A tenant's clients run ``concurrency`` streams at once, round-robin over the gateway URLs, each
starting a new request as soon as the last ends, until the budget answers ``budget_exceeded``.
Two kinds of client (``retries``):

* ``"patient"`` (the default): ``budget_busy``, ``rate_limited`` and ``overloaded`` are tried
  again after the gateway's ``retry-after-ms`` (or ``retry-after``) with 0-20 % jitter, or a
  fixed pause if given, for as long as it takes;
* ``"sdk"``: each logical request is retried as the official openai SDK does
  (:mod:`tests.load.sdk_retry`, ``max_retries`` 2 by default); a request whose attempts were all
  refused is *failed* (counted) and the client goes on with a new one.

Either way each run records when its first refusal of any kind came and, given the mock's URL,
how many tokens the mock had really generated for the tenant at that moment (one fetch,
in the background), and the ``x-hardcap-queue-wait-ms`` of every answer (absent: 0).
:func:`drive_tenant` speaks raw SSE over :mod:`tests.load.http1` (a lean keep-alive client: the
load generator must not be the bottleneck on a 2-core machine) and parses only the last few
events of each stream (the finish chunk, the usage chunk, or an error event).
:func:`stream_once` is the same exchange over httpx, for callers that already hold a client.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from tests.load import sdk_retry
from tests.load.http1 import Client, ProtocolError

REQUEST_TIMEOUT_S = 300.0  # one stream, start to end: a hung request is an error, not a stall
QUEUE_WAIT_HEADER = "x-hardcap-queue-wait-ms"
# Answers that refuse the request (429 budget_busy / rate_limited / budget_exceeded, 503
# overloaded): the first one a tenant's clients see is when its budget stopped being usable
# without friction.
REFUSALS = frozenset({"budget_busy", "rate_limited", "budget_exceeded", "overloaded"})
SERVED = frozenset({"completed", "truncated", "capped"})


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
    overloaded: int = 0  # 503 overloaded: the gateway shed the request before admission
    errors: int = 0
    output_tokens_seen: int = 0  # completion tokens the clients' usage chunks reported
    seconds: float = 0.0
    client: str = "patient"
    retries: int = 0  # attempts an SDK-like client made again after a refusal or error
    failed: int = 0  # logical requests an SDK-like client gave up on (every attempt refused)
    failed_outcomes: dict[str, int] = field(default_factory=dict)  # each one's last answer
    # The first refusal of any kind: outcome, seconds into the run, and the mock's count of
    # the tenant's prompt + completion tokens fetched right then (ground_truth_tokens).
    first_refusal: dict[str, Any] | None = None
    queue_waits_ms: list[int] = field(default_factory=list)  # per answer; summarized in JSON
    error_samples: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["queue_wait_ms"] = wait_summary(out.pop("queue_waits_ms"))
        return out


def percentile(values: list[int] | list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return float(ordered[rank - 1])


def wait_summary(waits: list[int]) -> dict[str, Any]:
    """How long answers waited in the admission queue: count, how many waited, p50/p99/max."""
    return {
        "answers": len(waits),
        "waited": sum(w > 0 for w in waits),
        "p50": percentile(waits, 0.5),
        "p99": percentile(waits, 0.99),
        "max": max(waits, default=None),
    }


def queue_wait_ms(headers: dict[str, str]) -> int:
    """The gateway's ``x-hardcap-queue-wait-ms`` (absent or unreadable: 0)."""
    try:
        return max(0, int(float(headers.get(QUEUE_WAIT_HEADER, "0"))))
    except ValueError:
        return 0


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
) -> tuple[str, int, dict[str, str], int]:
    """:func:`stream_once` over :class:`tests.load.http1.Client`; ``body`` is the JSON request.
    Returns (outcome, completion tokens reported, response headers, HTTP status).

    Outcomes: completed, truncated (cut by the gateway), capped (the reply reached
    max_tokens), a 429 error code, ``overloaded`` (a 503 saying so), http_<status>,
    stream_error.
    """
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    async with client.stream("POST", "/chat/completions", body, headers) as r:
        if r.status != 200:
            raw = await r.read()
            if r.status == 429:
                return str(json.loads(raw)["error"]["code"]), 0, r.headers, r.status
            if r.status == 503 and _error_code(raw) == "overloaded":
                return "overloaded", 0, r.headers, r.status
            return f"http_{r.status}", 0, r.headers, r.status
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
            return "stream_error", tokens, r.headers, 200
        for choice in chunk.get("choices") or ():
            finish = choice.get("finish_reason") or finish
        if chunk.get("usage"):
            tokens = chunk["usage"].get("completion_tokens", 0)
    if finish == "length":
        return ("capped" if tokens >= max_tokens else "truncated"), tokens, r.headers, 200
    return "completed", tokens, r.headers, 200


def _error_code(raw: bytes) -> str | None:
    """``error.code`` of an OpenAI-shaped error body, if it is one."""
    try:
        error = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        return None
    return str(error.get("code")) if isinstance(error, dict) else None


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
    retries: str = "patient",
    max_retries: int = sdk_retry.DEFAULT_MAX_RETRIES,
    truth_url: str | None = None,
    next_body: Callable[[], bytes] | None = None,
) -> TenantRun:
    """Spend ``tenant``'s budget with ``concurrency`` streams until it is exceeded.

    Stops starting requests at the first ``budget_exceeded`` or after ``time_limit_s``;
    streams already running finish. ``retries="patient"``: after a 429 or 503 overloaded a
    client waits ``busy_pause_s`` (uniform in LOW, HIGH) if given, else what the response's
    Retry-After headers say, and tries again. ``retries="sdk"``: the official SDK's rules with
    ``max_retries``. ``truth_url``: the mock, asked for the tenant's ground truth (prompt and
    completion tokens) at the first refusal. ``next_body``: each logical request's body (a
    retry sends the same one again, as the SDK does); default one short body over and over.
    """
    if retries not in ("patient", "sdk"):
        raise ValueError(f"retries: 'patient' or 'sdk', not {retries!r}")
    if retries == "sdk" and busy_pause_s is not None:
        raise ValueError("busy_pause_s is for the patient client; the SDK's own delays apply")
    run = TenantRun(tenant, client=retries if retries == "patient" else f"sdk:{max_retries}")
    rng = random.Random(seed)
    started = time.monotonic()
    done = asyncio.Event()
    body = json.dumps(chat_body(tenant, model, max_tokens)).encode()
    clients = [Client(url, max_connections=concurrency) for url in urls]
    truth = Client(truth_url, max_connections=1) if truth_url else None
    fetches: list[asyncio.Task[None]] = []

    def going() -> bool:
        return not done.is_set() and time.monotonic() - started < time_limit_s

    def pause(headers: dict[str, str]) -> float:
        if busy_pause_s is not None:
            return rng.uniform(*busy_pause_s)
        return retry_after_s(headers) * rng.uniform(1.0, 1.2)

    async def fetch_truth(record: dict[str, Any]) -> None:
        assert truth is not None
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
            if truth is not None:
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

    def logical_body() -> bytes:
        return next_body() if next_body is not None else body

    async def attempt(n: int, sent: bytes) -> tuple[str, dict[str, str], int | None]:
        client = clients[n % len(clients)]
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                outcome, tokens, headers, status = await stream_raw(client, key, sent, max_tokens)
            sample = outcome
        except (OSError, ProtocolError, asyncio.IncompleteReadError, TimeoutError) as e:
            outcome, tokens, headers, status, sample = "transport_error", 0, {}, None, repr(e)
        tally(outcome, tokens, headers, status)
        if outcome not in SERVED and outcome not in REFUSALS and len(run.error_samples) < 5:
            run.error_samples.append(sample)
        return outcome, headers, status

    async def patient(i: int) -> None:
        n = i
        while going():
            outcome, headers, _ = await attempt(n, logical_body())
            n += 1
            if outcome in ("budget_busy", "rate_limited", "overloaded"):
                await asyncio.sleep(pause(headers))
            elif outcome not in SERVED and outcome != "budget_exceeded":
                await asyncio.sleep(0.05)

    async def sdk_like(i: int) -> None:
        n = i
        while going():
            taken, sent = 0, logical_body()
            while True:
                outcome, headers, status = await attempt(n, sent)
                n += 1
                if outcome in SERVED or outcome == "budget_exceeded" or outcome == "stream_error":
                    break  # served, the run is over, or an error the SDK raises mid-stream
                if taken >= max_retries or not sdk_retry.should_retry(status, headers):
                    if outcome in REFUSALS or status is None or status >= 500:
                        run.failed += 1
                        run.failed_outcomes[outcome] = run.failed_outcomes.get(outcome, 0) + 1
                    break
                await asyncio.sleep(sdk_retry.retry_delay_s(taken, headers, rng))
                taken += 1
                run.retries += 1
                if not going():
                    break  # the budget ran out meanwhile: the client stops, nothing failed

    worker = patient if retries == "patient" else sdk_like
    try:
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        if fetches:
            await asyncio.gather(*fetches)
    finally:
        for client in [*clients, *([truth] if truth else [])]:
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
