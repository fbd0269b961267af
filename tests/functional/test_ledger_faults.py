"""Real faults of a real budget server, for both fail modes: killed, frozen, out of memory.

Each test runs a private server (``hardcap_core.local.valkey.LocalValkey``) so it can break it
without disturbing the session one. A frozen server (SIGSTOP) accepts nothing and answers
nothing: calls give up after the client's socket timeout (2 s). An out-of-memory one
(``maxmemory 1``, ``noeviction``) answers every write with an OOM error.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from hardcap_core.budgets import Dimension
from hardcap_core.errors import LedgerUnavailable
from hardcap_core.ledger import Admitted, Ledger, Unguarded
from hardcap_core.ledger.connection import connect
from hardcap_core.ledger.estimators import SharedP95Estimator
from hardcap_core.local.valkey import LocalValkey
from tests.conftest import TENANT, scope

SC = scope((TENANT, Dimension.TOTAL_TOKENS, 10_000, "month"))
PROCESSED_WAIT_S = 10.0  # how long to wait for a resumed server to run what it had queued


class Fault(ABC):
    """Break a private server one way, and repair it."""

    name = ""

    def __init__(self, server: LocalValkey, admin: Any) -> None:
        self.server, self.admin = server, admin

    @abstractmethod
    async def start(self) -> None:
        """Break the server."""

    @abstractmethod
    async def end(self) -> None:
        """Repair it (a killed server comes back empty on its port)."""


class Killed(Fault):
    name = "killed"

    async def start(self) -> None:
        self.port = self.server.port
        self.server.stop()

    async def end(self) -> None:
        # stop() removed the old working directory: the restart makes a fresh one.
        self.server.port, self.server.workdir = self.port, ""
        self.server.start()


class Frozen(Fault):
    name = "frozen"

    async def start(self) -> None:
        assert self.server.proc is not None
        os.kill(self.server.proc.pid, signal.SIGSTOP)

    async def end(self) -> None:
        assert self.server.proc is not None
        os.kill(self.server.proc.pid, signal.SIGCONT)


class OutOfMemory(Fault):
    name = "oom"

    async def start(self) -> None:
        await self.admin.config_set("maxmemory-policy", "noeviction")
        await self.admin.config_set("maxmemory", 1)

    async def end(self) -> None:
        await self.admin.config_set("maxmemory", 0)


FAULTS: list[Callable[[LocalValkey, Any], Fault]] = [Killed, Frozen, OutOfMemory]


@pytest.fixture
def server() -> Iterator[LocalValkey]:
    s = LocalValkey()
    s.start()
    try:
        yield s
    finally:
        if s.proc is not None:
            os.kill(s.proc.pid, signal.SIGCONT)  # a frozen server cannot take its SIGTERM
        s.stop()


@pytest.fixture
async def admin(server: LocalValkey) -> AsyncIterator[Any]:
    """A plain client that reconfigures the server and reads its counters."""
    import redis.asyncio as aioredis

    c = aioredis.Redis(port=server.port, socket_timeout=10)
    yield c
    await c.aclose()


@pytest.fixture
async def ledger(server: LocalValkey) -> AsyncIterator[Ledger]:
    """A ledger on the private server, warm: scripts loaded, one connection pooled."""
    client = await connect(server.url)
    led = Ledger(client)
    warm = await led.admit(SC, input_tokens=1, output_estimate=1)
    assert isinstance(warm, Admitted)
    await led.settle(warm.reservation, input_tokens=1, output_tokens=1)
    yield led
    await client.aclose()


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
@pytest.mark.parametrize("fail_open", [True, False], ids=["fail_open", "fail_closed"])
async def test_each_fault_meets_the_tenants_fail_mode(
    fault: Callable[[LocalValkey, Any], Fault],
    fail_open: bool,
    server: LocalValkey,
    admin: Any,
    ledger: Ledger,
) -> None:
    """Fail open goes ahead unguarded, fail closed is told the server is unavailable (a 503),
    never a protocol error (a 500); the estimator falls back to max_tokens instead of failing;
    once the fault ends the ledger works again."""
    f = fault(server, admin)
    await f.start()
    try:
        if fail_open:
            r = await ledger.admit(SC, input_tokens=5, output_estimate=50, fail_open=True)
            assert isinstance(r, Unguarded), r
        else:
            with pytest.raises(LedgerUnavailable):
                await ledger.admit(SC, input_tokens=5, output_estimate=50)
        # The gateway asks the estimator before it admits: it must not decide the fail mode.
        est = SharedP95Estimator(ledger, min_samples=1, cache_seconds=0)
        assert await est.estimate("route", 700) == 700
    finally:
        await f.end()
    before = (await ledger.usage(SC)).rows[0].used  # a killed server comes back empty
    a = await ledger.admit(SC, input_tokens=5, output_estimate=50)
    assert isinstance(a, Admitted)
    await ledger.settle(a.reservation, input_tokens=5, output_tokens=20)
    assert (await ledger.usage(SC)).rows[0].used == before + 25


async def test_a_write_refused_for_memory_is_unavailable_not_a_bug(
    server: LocalValkey, admin: Any, ledger: Ledger
) -> None:
    """Settle and extend too: the meter retries an unavailable settle and finishes a stream
    within its hold when extend is unavailable; a protocol error would be a 500."""
    a = await ledger.admit(SC, input_tokens=5, output_estimate=50)
    assert isinstance(a, Admitted)
    f = OutOfMemory(server, admin)
    await f.start()
    try:
        with pytest.raises(LedgerUnavailable):
            await ledger.extend(a.reservation, 64)
        with pytest.raises(LedgerUnavailable):
            await ledger.settle(a.reservation, input_tokens=5, output_tokens=10)
    finally:
        await f.end()
    await ledger.settle(a.reservation, input_tokens=5, output_tokens=10)
    assert (await ledger.usage(SC)).rows[0].used == 2 + 15


async def _evalsha_calls(admin: Any) -> int:
    stats = await admin.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.mark.parametrize("fail_open", [True, False], ids=["fail_open", "fail_closed"])
async def test_a_late_admit_never_leaves_a_hold(
    fail_open: bool, server: LocalValkey, admin: Any, ledger: Ledger
) -> None:
    """An admit that timed out while the server was frozen runs when the server resumes: it
    must reserve nothing (before: a phantom hold until the TTL, charged at expiry now)."""
    before = await _evalsha_calls(admin)
    f = Frozen(server, admin)
    await f.start()
    try:
        if fail_open:
            r = await ledger.admit(SC, input_tokens=5, output_estimate=500, fail_open=True)
            assert isinstance(r, Unguarded), r
        else:
            with pytest.raises(LedgerUnavailable):
                await ledger.admit(SC, input_tokens=5, output_estimate=500)
    finally:
        await f.end()
    # Wait (not a timed assertion) until the resumed server has run the queued admit.
    deadline = time.monotonic() + PROCESSED_WAIT_S
    while await _evalsha_calls(admin) <= before:
        assert time.monotonic() < deadline, "the server never ran the queued admit"
        await asyncio.sleep(0.01)
    u = await ledger.usage(SC)
    assert (u.rows[0].reserved, u.live_reservations) == (0, 0), u
    _, k_res, k_exp, _ = ledger.keys.core(SC)
    assert await admin.hlen(k_res) == 0
    assert await admin.zcard(k_exp) == 0
