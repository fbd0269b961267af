"""Tenants of one org share a hierarchy (one hash tag, one slot) but see only their own: the
live reservations the usage script reports are counted per level, never the org's whole set.
Run against a standalone server AND a 3-master cluster."""

from __future__ import annotations

import asyncio
from typing import Any

from hardcap_core.budgets import Dimension, Level, LevelKind
from hardcap_core.ledger import Admitted, Ledger
from tests.conftest import ORG, TENANT, scope

TOT = Dimension.TOTAL_TOKENS
BETA = Level(LevelKind.TENANT, "beta")
B1, B2 = Level(LevelKind.KEY, "b1"), Level(LevelKind.KEY, "b2")
ALPHA_SC = scope((TENANT, TOT, 10_000, "day"), (ORG, TOT, 10**6, "day"))
B1_SC = scope((BETA, TOT, 10_000, "day"), (ORG, TOT, 10**6, "day"), levels=(B1, BETA, ORG))
B2_SC = scope((BETA, TOT, 10_000, "day"), (ORG, TOT, 10**6, "day"), levels=(B2, BETA, ORG))


async def live(ledger: Ledger, sc: Any) -> tuple[int, int | None, int | None, int | None]:
    u = await ledger.usage(sc)
    return (
        u.live_reservations,
        u.live_of(LevelKind.KEY),
        u.live_of(LevelKind.TENANT),
        u.live_of(LevelKind.ORG),
    )


async def hold(ledger: Ledger, sc: Any) -> Admitted:
    a = await ledger.admit(sc, input_tokens=1, output_estimate=10)
    assert isinstance(a, Admitted), a
    return a


async def test_a_tenant_sees_only_its_own_requests_in_flight(ledger: Ledger) -> None:
    """Regression: live_reservations was the hierarchy's ZCARD, so alpha saw beta's traffic."""
    b1 = [await hold(ledger, B1_SC) for _ in range(2)]
    await hold(ledger, B2_SC)
    assert (await live(ledger, ALPHA_SC))[:3] == (0, 0, 0)
    await hold(ledger, ALPHA_SC)
    assert (await live(ledger, ALPHA_SC))[:3] == (1, 1, 1)
    # Beta's own view: its tenant's three, its key's own; the org level counts all four.
    assert await live(ledger, B1_SC) == (3, 2, 3, 4)
    assert await live(ledger, B2_SC) == (3, 1, 3, 4)
    await ledger.settle(b1[0].reservation, input_tokens=1, output_tokens=5)
    assert await live(ledger, B1_SC) == (2, 1, 2, 3)


async def test_expired_holds_leave_the_count(client: Any) -> None:
    ledger = Ledger(client, reservation_ttl_s=0.2)
    await hold(ledger, B1_SC)
    await hold(ledger, ALPHA_SC)
    await asyncio.sleep(0.3)
    assert await live(ledger, B1_SC) == (0, 0, 0, 0)
    k_live = ledger.keys.ledger(B1_SC)[6]
    assert await client.hgetall(k_live) == {}  # no zero counts left behind
