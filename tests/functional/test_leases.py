"""Leases on a real Valkey, standalone AND a 3-master cluster: an envelope held out of the
caller's budgets, requests that draw from it (and settle back into it), close and expiry that
return what is unspent, sub-leases, owners, and concurrent admits that never pass it."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from hardcap_core.budgets import Dimension, Level, LevelKind, Prices, Scope
from hardcap_core.errors import InvalidRequest, LeaseNotFound
from hardcap_core.ledger import Admitted, Extended, ExtendRefused, Ledger, Refused
from hardcap_core.ledger.leases import LeaseOpened, LeaseOwner, Leases
from hardcap_core.ledger.replies import ReservationMeta
from hardcap_core.rollup.records import parse_entry
from tests.conftest import KEY, ORG, TENANT, scope

TOT, OUT, USD = Dimension.TOTAL_TOKENS, Dimension.OUTPUT_TOKENS, Dimension.COST_USD
PRICES = Prices(2, 5)  # nano-USD per input / output token
SC = scope((TENANT, TOT, 10_000, "day"), (KEY, OUT, 8_000, "month"), (ORG, USD, 10**6, "month"))
OWNER = LeaseOwner("acme")
OTHER_TENANT = Level(LevelKind.TENANT, "beta")
# Another tenant of the same org: its scripts run in the same slot ({o:bigco}).
SIBLING = scope(
    (OTHER_TENANT, TOT, 10_000, "day"), levels=(Level(LevelKind.KEY, "k9"), OTHER_TENANT, ORG)
)


def meta(lease: str, tenant: str = "acme") -> ReservationMeta:
    return ReservationMeta(route="r", request_id="q", tenant=tenant, lease=lease)


async def opened(leases: Leases, sc: Scope = SC, **kw: Any) -> LeaseOpened:
    kw.setdefault("ttl_s", 60)
    res = await leases.open(sc, kw.pop("owner", OWNER), **kw)
    assert isinstance(res, LeaseOpened), res
    return res


async def rows(ledger: Ledger, sc: Scope = SC) -> list[tuple[int, int]]:
    return [(r.used, r.reserved) for r in (await ledger.usage(sc)).rows]


async def admit(ledger: Ledger, lease: str, inp: int, out: int, **kw: Any) -> Any:
    return await ledger.admit(
        SC, input_tokens=inp, output_estimate=out, prices=PRICES, meta=meta(lease), **kw
    )


async def test_a_lease_holds_its_envelope_and_requests_draw_from_it(ledger: Ledger) -> None:
    leases = Leases(ledger)
    lease = await opened(leases, tokens=1_000)
    # The envelope is held on every token budget once; cost budgets are not held (no usd).
    assert await rows(ledger) == [(0, 1_000), (0, 1_000), (0, 0)]
    a = await admit(ledger, lease.id, 100, 300)
    assert isinstance(a, Admitted)
    # The request's hold came out of the lease's: the tenant's reserved does not count both.
    assert [r for _, r in await rows(ledger)] == [1_000, 1_000, 100 * 2 + 300 * 5]
    st = await leases.read(SC, OWNER, lease.id)
    assert (st.held_tokens, st.spent_tokens, st.remaining_tokens) == (400, 0, 600)
    # Settle: the real charge is used; what the request drew and did not spend goes back to
    # the lease, which still holds its whole envelope less what was spent.
    await ledger.settle(a.reservation, input_tokens=100, output_tokens=150)
    assert await rows(ledger) == [(250, 750), (150, 850), (cost := 100 * 2 + 150 * 5, 0)]
    st = await leases.read(SC, OWNER, lease.id)
    assert (st.held_tokens, st.spent_tokens, st.remaining_tokens) == (0, 250, 750)
    assert st.spent_nusd == cost
    # Close: the unspent envelope goes back to the tenant in the same script.
    last = await leases.close(SC, OWNER, lease.id)
    assert last.remaining_tokens == 750
    assert await rows(ledger) == [(250, 0), (150, 0), (cost, 0)]
    with pytest.raises(LeaseNotFound):
        await leases.read(SC, OWNER, lease.id)
    with pytest.raises(LeaseNotFound):
        await admit(ledger, lease.id, 10, 10)


async def test_the_lease_caps_requests_and_rate_limits_still_apply(ledger: Ledger) -> None:
    leases = Leases(ledger)
    lease = await opened(leases, tokens=5_000, usd_nusd=2_000)
    # The estimate shrinks to what the envelope leaves (here the USD: (2000 - 200) / 5 = 360).
    a = await admit(ledger, lease.id, 100, 1_000, min_output=10)
    assert isinstance(a, Admitted) and a.reservation.output_reserved == 360
    busy = await admit(ledger, lease.id, 100, 100, min_output=10)
    assert isinstance(busy, Refused) and busy.lease == lease.id and busy.dimension == "usd"
    never = await admit(ledger, lease.id, 1_000, 10)
    assert isinstance(never, Refused) and never.never_fits and never.dimension == "usd"
    # Extend draws from the lease too, and stops at it.
    grown = await ledger.extend(a.reservation, 100)
    assert isinstance(grown, ExtendRefused)
    await ledger.settle(a.reservation, input_tokens=100, output_tokens=300)
    spent = await admit(ledger, lease.id, 100, 100, min_output=50)
    assert isinstance(spent, Refused) and not spent.never_fits and spent.lease == lease.id


async def test_extend_of_a_stream_under_a_lease_draws_from_the_lease(ledger: Ledger) -> None:
    leases = Leases(ledger)
    lease = await opened(leases, tokens=1_000)
    a = await admit(ledger, lease.id, 100, 100)
    assert isinstance(a, Admitted)
    grown = await ledger.extend(a.reservation, 300)
    assert isinstance(grown, Extended) and grown.granted == 300
    assert [r for _, r in (await rows(ledger))[:2]] == [1_000, 1_000]  # still one envelope
    st = await leases.read(SC, OWNER, lease.id)
    assert (st.held_tokens, st.remaining_tokens) == (500, 500)
    refused = await ledger.extend(a.reservation, 600, least=600)
    assert isinstance(refused, ExtendRefused)
    await leases.close(SC, OWNER, lease.id)
    # A stream whose lease ended grows no more; its settle charges the budgets, and returns
    # nothing to the dead lease: all that is left reserved is nothing.
    assert isinstance(await ledger.extend(a.reservation, 10), ExtendRefused)
    assert [r for _, r in (await rows(ledger))[:2]] == [500, 400]  # the request's own hold
    await ledger.settle(a.reservation, input_tokens=100, output_tokens=350)
    assert [(u, r) for u, r in (await rows(ledger))[:2]] == [(450, 0), (350, 0)]


async def test_an_expired_lease_returns_its_hold_and_its_late_settle_is_charged(
    client: Any,
) -> None:
    ledger = Ledger(client, reservation_ttl_s=60)
    leases = Leases(ledger)
    lease = await opened(leases, tokens=1_000, ttl_s=0.2)
    a = await admit(ledger, lease.id, 100, 200)
    assert isinstance(a, Admitted)
    await asyncio.sleep(0.3)
    # Reclaimed by the next script touching the hierarchy: the lease's unspent hold goes back;
    # the request in flight keeps its own hold.
    assert [r for _, r in (await rows(ledger))[:2]] == [300, 200]
    with pytest.raises(LeaseNotFound):
        await leases.read(SC, OWNER, lease.id)
    s = await ledger.settle(a.reservation, input_tokens=100, output_tokens=50)
    assert s.had_reservation
    assert (await rows(ledger))[:2] == [(150, 0), (50, 0)]


async def test_sub_leases_draw_from_their_parent_and_nest_boundedly(ledger: Ledger) -> None:
    leases = Leases(ledger, max_depth=3)
    top = await opened(leases, tokens=1_000)
    mid = await opened(leases, tokens=600, parent=top.id)
    assert [r for _, r in (await rows(ledger))[:2]] == [1_000, 1_000]
    low = await opened(leases, tokens=200, parent=mid.id)
    with pytest.raises(InvalidRequest):
        await opened(leases, tokens=100, parent=low.id)  # depth 4 > 3
    with pytest.raises(InvalidRequest):
        await opened(leases, usd_nusd=100, parent=mid.id)  # the parent limits tokens
    too_big = await leases.open(SC, OWNER, ttl_s=60, tokens=500, parent=mid.id)
    assert isinstance(too_big, Refused) and too_big.lease == mid.id  # 600 - 200 held
    a = await admit(ledger, low.id, 50, 100)
    assert isinstance(a, Admitted)
    await ledger.settle(a.reservation, input_tokens=50, output_tokens=50)
    assert (await leases.read(SC, OWNER, low.id)).spent_tokens == 100
    # Closing the sub-lease: its spend counts at the parent's level, its unspent part goes
    # back into the parent's hold, and the tenant still holds the top envelope less the spend.
    await leases.close(SC, OWNER, low.id)
    st = await leases.read(SC, OWNER, mid.id)
    assert (st.spent_tokens, st.held_tokens, st.remaining_tokens) == (100, 0, 500)
    assert (await rows(ledger))[0] == (100, 900)
    await leases.close(SC, OWNER, top.id)  # the parent first: the child returns to the budgets
    await leases.close(SC, OWNER, mid.id)
    assert (await rows(ledger))[0] == (100, 0)


async def test_another_tenant_or_user_cannot_use_or_close_a_lease(ledger: Ledger) -> None:
    leases = Leases(ledger)
    lease = await opened(leases, tokens=1_000)
    other = LeaseOwner("beta")
    with pytest.raises(LeaseNotFound):
        await leases.read(SIBLING, other, lease.id)
    with pytest.raises(LeaseNotFound):
        await leases.close(SIBLING, other, lease.id)
    with pytest.raises(LeaseNotFound):
        await ledger.admit(SIBLING, input_tokens=1, output_estimate=1, meta=meta(lease.id, "beta"))
    own = await opened(leases, tokens=100, owner=LeaseOwner("acme", "acme~ann"))
    bob = dataclasses.replace(meta(own.id), user="acme~bob")
    with pytest.raises(LeaseNotFound):
        await ledger.admit(SC, input_tokens=1, output_estimate=1, meta=bob)
    with pytest.raises(LeaseNotFound):
        await leases.close(SC, LeaseOwner("acme", "acme~bob"), own.id)
    assert (await leases.read(SC, OWNER, lease.id)).remaining_tokens == 1_000


async def test_a_lease_that_does_not_fit_the_budgets_is_refused(ledger: Ledger) -> None:
    leases = Leases(ledger)
    await opened(leases, tokens=7_000)
    res = await leases.open(SC, OWNER, ttl_s=60, tokens=5_000)
    assert isinstance(res, Refused) and res.budget is not None and not res.never_fits
    res = await leases.open(SC, OWNER, ttl_s=60, tokens=20_000)
    assert isinstance(res, Refused) and res.never_fits


async def test_usage_records_carry_the_lease(ledger: Ledger, client: Any) -> None:
    leases = Leases(ledger)
    lease = await opened(leases, tokens=1_000)
    a = await admit(ledger, lease.id, 10, 20)
    assert isinstance(a, Admitted)
    await ledger.settle(a.reservation, input_tokens=10, output_tokens=5)
    plain = await ledger.admit(SC, input_tokens=1, output_estimate=1)
    assert isinstance(plain, Admitted)
    await ledger.settle(plain.reservation, input_tokens=1, output_tokens=1)
    entries = await client.xrange(ledger.keys.usage_stream(SC.root))
    records = [parse_entry(i, f) for i, f in entries]
    assert [(r.lease, r.input_tokens + r.output_tokens) for r in records] == [
        (lease.id, 15),
        ("", 2),
    ]
    assert [f[b"r"][:2] for _, f in entries] == [b"4,", b"2,"]  # format 4 only under a lease


async def test_concurrent_admits_never_exceed_the_lease(ledger: Ledger) -> None:
    """50 admits at once on a 1,000-token lease of a 10,000-token budget: their holds never
    add up past the lease, and the tenant's reserved stays the envelope."""
    leases = Leases(ledger)
    lease = await opened(leases, tokens=1_000)
    results = await asyncio.gather(*(admit(ledger, lease.id, 20, 60) for _ in range(50)))
    held = [r.reservation for r in results if isinstance(r, Admitted)]
    assert len(held) == 1_000 // 80
    assert sum(h.input_tokens + h.output_reserved for h in held) <= 1_000
    assert (await rows(ledger))[0] == (0, 1_000)
    await asyncio.gather(*(ledger.settle(h, input_tokens=20, output_tokens=60) for h in held))
    st = await leases.read(SC, OWNER, lease.id)
    assert st.spent_tokens == 80 * len(held) <= 1_000
    assert (await rows(ledger))[0] == (80 * len(held), 1_000 - 80 * len(held))


async def test_a_sub_lease_closed_under_a_live_request_counts_its_hold_as_spent(
    ledger: Ledger,
) -> None:
    """The parent's envelope bounds what its sub-lease's requests spend even after the sub-lease
    ends with one in flight: that request's hold counts as spent at the parent's level, and its
    settle (charged to the budgets) returns nothing to the dead sub-lease nor to the parent."""
    leases = Leases(ledger)
    top = await opened(leases, tokens=1_000)
    sub = await opened(leases, tokens=400, parent=top.id)
    a = await admit(ledger, sub.id, 50, 150)
    assert isinstance(a, Admitted)
    await leases.close(SC, OWNER, sub.id)
    st = await leases.read(SC, OWNER, top.id)
    assert (st.spent_tokens, st.held_tokens, st.remaining_tokens) == (200, 0, 800)
    # The tenant holds the top lease's 800 and the request's own 200.
    assert (await rows(ledger))[0] == (0, 1_000)
    await ledger.settle(a.reservation, input_tokens=50, output_tokens=10)
    assert (await rows(ledger))[0] == (60, 800)
    assert (await leases.read(SC, OWNER, top.id)).remaining_tokens == 800
