"""128 concurrent Responses API streams on one tenant through 3 gateway processes sharing one
Valkey, as `test_gateway_concurrency.py` does for chat completions: never over the budget by
the provider's own count, most of it usable.

Ground truth is what the mock upstream generated, not what the gateway thinks it forwarded.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from hardcap_core.local.valkey import LocalValkey
from tests.load.harness import reserved_left
from tests.load.mock import start_mock
from tests.stack import KEYS, Mock, config_data, gateway_processes

BUDGET = 20_000
STREAMS = 128


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mock]:
    # Its own process, ahead in CPU priority, as a real provider is on its own hardware.
    service = start_mock(tmp_path_factory.mktemp("mock"), pace_ms=20.0, seed=3, nice=-10)
    m = Mock(url=service.url)
    yield m
    m.stop()
    service.stop()


async def one(http: httpx.AsyncClient, url: str, stop: asyncio.Event) -> str:
    """One Responses stream: how it ended (its last event's type), or the refusal's code."""
    body = {"model": "p95", "input": "Tell tenant alpha about budgets.", "user": "alpha",
            "max_output_tokens": 1024, "stream": True}  # fmt: skip
    headers = {"authorization": f"Bearer {KEYS['alpha']}"}
    async with http.stream("POST", f"{url}/responses", json=body, headers=headers) as r:
        if r.status_code != 200:
            raw = await r.aread()
            code = str(json.loads(raw)["error"]["code"]) if r.status_code == 429 else None
            if code == "budget_exceeded":
                stop.set()
            return code or f"http_{r.status_code}"
        last = ""
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                last = line[7:]
        return last


async def drive(urls: list[str]) -> Counter[str]:
    stop = asyncio.Event()
    ends: Counter[str] = Counter()
    rng = random.Random(5)

    async def client(i: int) -> None:
        n = i
        async with httpx.AsyncClient(timeout=60) as http:
            while not stop.is_set():
                end = await one(http, urls[n % len(urls)], stop)
                ends[end] += 1
                n += 1
                if end == "budget_busy":
                    await asyncio.sleep(rng.uniform(1.0, 1.2))  # its Retry-After

    async with asyncio.timeout(120):
        await asyncio.gather(*(client(i) for i in range(STREAMS)))
    return ends


@pytest.mark.slow
def test_128_responses_streams_3_processes_hold_the_budget(
    valkey: LocalValkey, mock: Mock, tmp_path: Path
) -> None:
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    budgets = [{"dimension": "total_tokens", "limit": BUDGET, "window": "day"}]
    data = config_data(mock.url, valkey.url, **{"tenants.0.budgets": budgets})
    with gateway_processes(data, 3, tmp_path) as urls:
        ends = asyncio.run(drive(urls))
        truth = mock.truth("alpha", settle_s=10)
        left = reserved_left(urls[0], KEYS["alpha"])
    print(f"\nground truth {truth} ends {dict(ends)}")
    allowed = {"response.completed", "response.incomplete", "budget_busy", "budget_exceeded"}
    assert set(ends) <= allowed, ends
    assert ends["budget_exceeded"] >= 1  # the clients really ran the budget out
    assert truth["total_tokens"] <= BUDGET * 1.001, (truth, ends)
    assert truth["total_tokens"] >= BUDGET * 0.9  # and most of it was usable
    assert left == 0
    assert truth["in_flight"] == 0
