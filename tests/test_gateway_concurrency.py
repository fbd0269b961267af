"""128 concurrent streams on one tenant through 3 gateway processes sharing one Valkey.

Ground truth is what the mock upstream generated, not what the gateway thinks it forwarded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bench.harness import drive_tenant, reserved_left
from hardcap_core.mock_upstream import MockSettings
from hardcap_core.valkey_local import LocalValkey
from tests.stack import KEYS, Mock, config_data, gateway_processes

BUDGET = 20_000


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=10.0, seed=3))
    yield m
    m.stop()


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
