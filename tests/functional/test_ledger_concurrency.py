"""Many processes hammer one tenant at once; the invariant holds and admissions are exact.

Each worker process is a stand-in for a gateway instance (a Lambda execution environment): its
own client, its own event loop, no shared memory. Only the server serializes them.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import random
import traceback
from typing import Any

import pytest

from hardcap_core.budgets import Dimension
from hardcap_core.ledger import Admitted, Extended, ExtendRefused, Ledger, Refused
from tests.conftest import TENANT, flush, make_client, scope

PROCESSES = 4
TASKS_PER_PROCESS = 60  # 240 concurrent calls


def _sc(limit: int) -> Any:
    return scope((TENANT, Dimension.TOTAL_TOKENS, limit, "day"), levels=(TENANT,))


async def _hold_only(url: str, cluster: bool, limit: int) -> int:
    client = await make_client(url, cluster)
    ledger = Ledger(client)
    sc = _sc(limit)
    results = await asyncio.gather(
        *(ledger.admit(sc, input_tokens=0, output_estimate=100) for _ in range(TASKS_PER_PROCESS))
    )
    await client.aclose()
    return sum(isinstance(r, Admitted) for r in results)


async def _full_cycle(url: str, cluster: bool, limit: int, seed: int) -> tuple[int, int]:
    client = await make_client(url, cluster)
    ledger = Ledger(client)
    sc = _sc(limit)
    rng = random.Random(seed)

    async def one() -> tuple[int, int]:
        res = await ledger.admit(sc, input_tokens=10, output_estimate=rng.randint(20, 200))
        if not isinstance(res, Admitted):
            return 0, 0
        r = res.reservation
        reserved = r.output_reserved
        for _ in range(rng.randint(0, 3)):
            await asyncio.sleep(rng.random() / 100)
            e = await ledger.extend(r, 64)
            if isinstance(e, Extended):
                reserved = e.output_reserved
            else:
                assert isinstance(e, ExtendRefused)
                break
        # Truncate mode: never generate past the reservation.
        out = rng.randint(1, reserved)
        await ledger.settle(r, input_tokens=10, output_tokens=out)
        return 1, 10 + out

    results = await asyncio.gather(*(one() for _ in range(TASKS_PER_PROCESS)))
    await client.aclose()
    return sum(a for a, _ in results), sum(t for _, t in results)


def _picklable_errors(fn: Any, args: Any) -> Any:
    # Exceptions from redis-py hold locks and cannot cross the process boundary as they are.
    try:
        return asyncio.run(fn(*args))
    except Exception:
        raise RuntimeError(f"worker failed: {traceback.format_exc()}") from None


def _run_hold(args: tuple[str, bool, int]) -> int:
    return int(_picklable_errors(_hold_only, args))


def _run_cycle(args: tuple[str, bool, int, int]) -> tuple[int, int]:
    a, t = _picklable_errors(_full_cycle, args)
    return int(a), int(t)


@pytest.fixture
def pool() -> Any:
    ctx = mp.get_context("spawn")
    with ctx.Pool(PROCESSES) as p:
        yield p


async def test_exactly_as_many_admitted_as_the_budget_allows(
    backend: tuple[str, bool], pool: Any
) -> None:
    url, cluster = backend
    limit = 100 * 37 + 50  # room for exactly 37 holds of 100 tokens
    counts = await asyncio.to_thread(pool.map, _run_hold, [(url, cluster, limit)] * PROCESSES)
    assert sum(counts) == 37

    client = await make_client(url, cluster)
    u = await Ledger(client).usage(_sc(limit))
    assert (u.rows[0].reserved, u.live_reservations) == (3700, 37)
    await client.aclose()


async def test_invariant_holds_under_admit_extend_settle_storm(
    backend: tuple[str, bool], pool: Any
) -> None:
    url, cluster = backend
    limit = 5000
    client = await make_client(url, cluster)
    await flush(client)
    ledger = Ledger(client)
    sc = _sc(limit)
    stop = asyncio.Event()
    worst = 0

    async def watch() -> None:
        # The usage script reads used and reserved atomically, so this sees real server states.
        nonlocal worst
        while not stop.is_set():
            row = (await ledger.usage(sc)).rows[0]
            worst = max(worst, row.used + row.reserved)
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch())
    args = [(url, cluster, limit, seed) for seed in range(PROCESSES)]
    results = await asyncio.to_thread(pool.map, _run_cycle, args)
    stop.set()
    await watcher

    row = (await ledger.usage(sc)).rows[0]
    charged = sum(t for _, t in results)
    assert worst <= limit
    assert row.used == charged <= limit
    assert row.reserved == 0
    assert sum(a for a, _ in results) > 10  # the storm really admitted work
    refused = await ledger.admit(sc, input_tokens=10, output_estimate=limit)
    assert isinstance(refused, Refused)
    await client.aclose()
