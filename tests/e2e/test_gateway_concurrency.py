"""128 concurrent streams on one tenant through 3 gateway processes sharing one Valkey.

Ground truth is what the mock upstream generated, not what the gateway thinks it forwarded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from hardcap_core.local.valkey import LocalValkey
from tests.load.harness import drive_tenant, reserved_left
from tests.load.mock import start_mock
from tests.stack import KEYS, Mock, config_data, gateway_processes

BUDGET = 20_000


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mock]:
    # The provider runs in its own process, ahead of the gateways in CPU priority as a real
    # provider is on its own hardware: sharing this process's GIL with 128 clients, it would
    # notice a closed stream late and keep generating (counted as ground truth).
    service = start_mock(tmp_path_factory.mktemp("mock"), pace_ms=20.0, seed=3, nice=-10)
    m = Mock(url=service.url)
    yield m
    m.stop()
    service.stop()


@pytest.mark.slow
def test_128_streams_3_processes_hold_the_budget(
    valkey: LocalValkey, mock: Mock, tmp_path: Path
) -> None:
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    budgets = [{"dimension": "total_tokens", "limit": BUDGET, "window": "day"}]
    data = config_data(mock.url, valkey.url, **{"tenants.0.budgets": budgets})
    with gateway_processes(data, 3, tmp_path) as urls:
        run = asyncio.run(
            drive_tenant(
                urls,
                KEYS["alpha"],
                "alpha",
                concurrency=128,
                model="p95",
                max_tokens=1024,
                time_limit_s=90,
                # Clients honour Retry-After (1 s on budget_busy, jittered) as the OpenAI SDK
                # does (the default of drive_tenant).
            )
        )
        truth = mock.truth("alpha", settle_s=10)
        left = reserved_left(urls[0], KEYS["alpha"])
    print(f"\nground truth {truth} run {run}")
    assert run.errors == 0, run.error_samples
    assert run.exceeded >= 1  # the clients really ran the budget out
    assert truth["total_tokens"] <= BUDGET * 1.001, (truth, run)
    assert truth["total_tokens"] >= BUDGET * 0.9  # and most of it was usable
    assert left == 0
    assert truth["in_flight"] == 0
