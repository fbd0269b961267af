"""What the ledger does when its server goes away: fail open or closed, quickly; then recover.

Each test runs its own private server so it can stop it without disturbing the session one.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from hardcap_core.budgets import Dimension
from hardcap_core.errors import LedgerUnavailable
from hardcap_core.ledger import Admitted, Ledger, Unguarded
from hardcap_core.ledger.connection import MAX_CONNECTIONS, connect
from hardcap_core.ledger.estimators import SharedP95Estimator
from hardcap_core.local.valkey import LocalValkey, free_port
from tests.conftest import TENANT, scope

FAST_S = 5.0  # well inside a client's patience; the client's socket timeouts are 2 s
SC = scope((TENANT, Dimension.TOTAL_TOKENS, 10_000, "month"))


@pytest.fixture
def server() -> Iterator[LocalValkey]:
    """A private server the test may stop."""
    with LocalValkey() as s:
        yield s


@pytest.fixture
async def private_ledger(server: LocalValkey) -> AsyncIterator[Ledger]:
    """A ledger on the private server, with one call done so the pool holds a connection."""
    client = await connect(server.url)
    led = Ledger(client)
    assert isinstance(await led.admit(SC, input_tokens=1, output_estimate=1), Admitted)
    yield led
    await client.aclose()


async def test_fail_open_goes_ahead_unguarded_and_fail_closed_raises(
    server: LocalValkey, private_ledger: Ledger
) -> None:
    server.stop()

    t = time.monotonic()
    r = await private_ledger.admit(SC, input_tokens=1, output_estimate=1, fail_open=True)
    assert isinstance(r, Unguarded) and "unreachable" in r.reason and r.reservation_id
    assert time.monotonic() - t < FAST_S

    t = time.monotonic()
    with pytest.raises(LedgerUnavailable):
        await private_ledger.admit(SC, input_tokens=1, output_estimate=1, fail_open=False)
    assert time.monotonic() - t < FAST_S

    # Fail-open is for admission only: the other calls always say the server is gone ...
    with pytest.raises(LedgerUnavailable):
        await private_ledger.usage(SC)
    with pytest.raises(LedgerUnavailable):
        await private_ledger.ping()
    # ... but the estimator, asked before the admission, falls back to max_tokens (the
    # conservative value), so the admission and the tenant's fail mode decide. Regression: it
    # raised, and the gateway answered 503 "fails closed" to fail-open tenants.
    est = SharedP95Estimator(private_ledger, cache_seconds=0)
    assert await est.estimate("route", 100, tenant="acme") == 100
    assert await est.estimate("route", 100) == 100


async def test_estimator_seen_down_does_not_ask_again_for_a_while(
    server: LocalValkey, private_ledger: Ledger
) -> None:
    """While the server is down, each request would otherwise wait out a timeout twice (the
    estimate, then the admission): the estimator takes it as down for ``cache_seconds``."""
    port = server.port
    server.stop()
    est = SharedP95Estimator(private_ledger, min_samples=5, cache_seconds=30)
    assert await est.estimate("route", 700, tenant="acme") == 700
    with LocalValkey(port=port):
        writer = SharedP95Estimator(private_ledger, min_samples=5, cache_seconds=0)
        for _ in range(5):
            await writer.observe("route", 40, truncated=False, tenant="acme")
        assert await writer.estimate("route", 700, tenant="acme") == 40
        assert await est.estimate("route", 700, tenant="acme") == 700  # did not ask


async def test_unreachable_from_the_start() -> None:
    url = f"redis://127.0.0.1:{free_port()}"  # nothing listens there
    client = await connect(url)
    ledger = Ledger(client)
    t = time.monotonic()
    r = await ledger.admit(SC, input_tokens=1, output_estimate=1, fail_open=True)
    assert isinstance(r, Unguarded)
    with pytest.raises(LedgerUnavailable):
        await ledger.admit(SC, input_tokens=1, output_estimate=1)
    assert time.monotonic() - t < FAST_S
    await client.aclose()
    # A cluster client loads the slot map on connect, so it fails there, as the same error.
    with pytest.raises(LedgerUnavailable):
        await connect(url, cluster=True)


async def test_a_server_that_hangs_times_out() -> None:
    """Accepts connections but never answers: the socket timeout turns it into unavailable."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)  # the kernel completes the handshake; nobody ever reads
        client = await connect(f"redis://127.0.0.1:{hole.getsockname()[1]}")
        t = time.monotonic()
        r = await Ledger(client).admit(SC, input_tokens=1, output_estimate=1, fail_open=True)
        assert isinstance(r, Unguarded)
        assert time.monotonic() - t < FAST_S
        await client.aclose()


async def test_recovers_when_the_server_comes_back(
    server: LocalValkey, private_ledger: Ledger
) -> None:
    port = server.port
    server.stop()
    with pytest.raises(LedgerUnavailable):
        await private_ledger.admit(SC, input_tokens=1, output_estimate=1)
    with LocalValkey(port=port):
        # A fresh server: no scripts loaded (redis-py reloads them on NOSCRIPT), no state.
        a = await private_ledger.admit(SC, input_tokens=10, output_estimate=20)
        assert isinstance(a, Admitted)
        await private_ledger.settle(a.reservation, input_tokens=10, output_tokens=5)
        assert (await private_ledger.usage(SC)).rows[0].used == 15


async def test_a_restart_while_idle_is_invisible(
    server: LocalValkey, private_ledger: Ledger
) -> None:
    """The pooled connection the old server closed is reconnected and the call resent.

    Regression: ``Redis.from_url`` builds its pool without redis-py's default Retry, so the
    first call after a restart (or failover, or idle timeout) raised "Connection closed by
    server" until connect() passed a Retry of its own.
    """

    async def burst() -> list[object]:
        calls = (private_ledger.admit(SC, input_tokens=1, output_estimate=1) for _ in range(8))
        return await asyncio.gather(*calls, return_exceptions=True)

    await burst()  # the pool now holds several connections, each to be closed by the restart
    port = server.port
    server.stop()
    with LocalValkey(port=port):
        results = await burst()
        assert all(isinstance(r, Admitted) for r in results), results


async def test_a_burst_on_a_cold_client_shares_a_bounded_pool(server: LocalValkey) -> None:
    """500 calls at once on a fresh client all succeed over at most MAX_CONNECTIONS sockets.

    Regression: the pool opened one connection per call in flight. A burst of hundreds of
    streams on cold gateway processes opened hundreds of connections at once, some connects
    timed out on the starved machine, and those requests got 503s and lost their settles.
    """
    client = await connect(server.url)
    try:
        led = Ledger(client)
        calls = (led.admit(SC, input_tokens=1, output_estimate=1) for _ in range(500))
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, Admitted) for r in results), {type(r) for r in results}
        info = await client.info("clients")
        assert 1 <= info["connected_clients"] <= MAX_CONNECTIONS
        assert info["connected_clients"] > 1  # the calls really overlapped
    finally:
        await client.aclose()
