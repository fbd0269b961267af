"""A settle that never comes: expired holds are charged (when admitted to be), a settle that
arrives after all charges only the difference, and an admit that runs too late holds nothing.
Run against a standalone server AND a 3-master cluster."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hardcap_core.budgets import Dimension, Level, LevelKind, Prices, Scope
from hardcap_core.errors import ReservationReused
from hardcap_core.ledger import Admitted, Ledger, ReservationGone
from tests.conftest import KEY, ORG, TENANT, scope

TOT, OUT, USD = Dimension.TOTAL_TOKENS, Dimension.OUTPUT_TOKENS, Dimension.COST_USD
TTL_S = 0.2
PAST_TTL_S = 0.3
PRICES = Prices(2, 5)  # nano-USD per input / output token
SC = scope((TENANT, TOT, 10_000, "day"), (KEY, OUT, 5_000, "month"), (ORG, USD, 10**6, "month"))


def cost(inp: int, out: int) -> int:
    return PRICES.cost(inp, out)


async def admitted(ledger: Ledger, sc: Scope, **kw: Any) -> Admitted:
    res = await ledger.admit(sc, **kw)
    assert isinstance(res, Admitted), res
    return res


async def used(ledger: Ledger, sc: Scope) -> list[int]:
    return [row.used for row in (await ledger.usage(sc)).rows]


@pytest.mark.parametrize("charge", [True, False], ids=["charged", "returned"])
async def test_an_expired_hold_is_charged_when_admitted_to_be(client: Any, charge: bool) -> None:
    """Regression: every expired hold went back to the tenant, so the provider's tokens of a
    stream whose instance died were never charged."""
    ledger = Ledger(client, reservation_ttl_s=TTL_S)
    a = await admitted(
        ledger, SC, input_tokens=100, output_estimate=300, prices=PRICES, charge_on_expiry=charge
    )
    await asyncio.sleep(PAST_TTL_S)
    u = await ledger.usage(SC)
    assert [row.reserved for row in u.rows] == [0, 0, 0]
    assert [row.used for row in u.rows] == ([400, 300, cost(100, 300)] if charge else [0, 0, 0])
    assert u.live_reservations == 0
    assert isinstance(await ledger.extend(a.reservation, 64), ReservationGone)


async def test_an_extended_hold_is_charged_what_it_had_grown_to(client: Any) -> None:
    ledger = Ledger(client, reservation_ttl_s=TTL_S)
    a = await admitted(
        ledger, SC, input_tokens=10, output_estimate=100, prices=PRICES, charge_on_expiry=True
    )
    await ledger.extend(a.reservation, 64)
    await asyncio.sleep(PAST_TTL_S)
    assert await used(ledger, SC) == [174, 164, cost(10, 164)]


@pytest.mark.parametrize("real_output", [120, 300, 450], ids=["lower", "equal", "higher"])
async def test_a_settle_after_the_expiry_charge_charges_only_the_difference(
    client: Any, real_output: int
) -> None:
    """A slow instance settles after its hold was charged: no double charge; a refund when the
    real count was lower, the rest when it was higher."""
    ledger = Ledger(client, reservation_ttl_s=TTL_S)
    a = await admitted(
        ledger, SC, input_tokens=100, output_estimate=300, prices=PRICES, charge_on_expiry=True
    )
    await asyncio.sleep(PAST_TTL_S)
    assert await used(ledger, SC) == [400, 300, cost(100, 300)]  # reclaimed and charged
    s = await ledger.settle(a.reservation, input_tokens=90, output_tokens=real_output)
    assert (s.duplicate, s.had_reservation, s.expiry_charged) == (False, False, True)
    want = [90 + real_output, real_output, cost(90, real_output)]
    assert await used(ledger, SC) == want
    again = await ledger.settle(a.reservation, input_tokens=90, output_tokens=real_output)
    assert again.duplicate and await used(ledger, SC) == want


async def test_a_settle_before_anyone_reclaimed_is_an_ordinary_settle(client: Any) -> None:
    ledger = Ledger(client, reservation_ttl_s=TTL_S)
    a = await admitted(ledger, SC, input_tokens=100, output_estimate=300, charge_on_expiry=True)
    await asyncio.sleep(PAST_TTL_S)
    s = await ledger.settle(a.reservation, input_tokens=100, output_tokens=50)
    assert (s.had_reservation, s.expiry_charged) == (True, False)
    assert (await used(ledger, SC))[:2] == [150, 50]


@pytest.mark.parametrize("real_output", [50, 500], ids=["lower", "higher"])
async def test_a_settle_in_a_later_window_never_refunds_into_it(
    client: Any, real_output: int
) -> None:
    """The expiry charge went to the window current at reclaim. A settle in the next window
    charges what exceeds it there, and refunds nothing: the next window was never charged."""
    ledger = Ledger(client, reservation_ttl_s=TTL_S)
    sc = scope((TENANT, TOT, 10_000, "2s"))
    a = await admitted(ledger, sc, input_tokens=0, output_estimate=300, charge_on_expiry=True)
    await asyncio.sleep(PAST_TTL_S)
    reclaimed = await ledger.usage(sc)
    assert reclaimed.rows[0].used == 300
    first = sc.budgets[0].window.bounds(reclaimed.server_time_ms)
    await asyncio.sleep((first.end_ms - ledger.server_now_ms()) / 1000 + 0.05)
    s = await ledger.settle(a.reservation, input_tokens=0, output_tokens=real_output)
    assert s.expiry_charged and s.server_time_ms >= first.end_ms
    assert (await ledger.usage(sc)).rows[0].used == max(real_output - 300, 0)
    field = sc.budgets[0].field
    assert int(await client.hget(ledger.keys.used(sc, first.spec, first.id), field)) == 300


K2 = Level(LevelKind.KEY, "k2")
BETA = Level(LevelKind.TENANT, "beta")
# Two tenants of org bigco whose own budgets count over different windows.
ALPHA_SC = scope((KEY, TOT, 10_000, "day"), (ORG, TOT, 50_000, "month"))
BETA_SC = scope((K2, TOT, 10_000, "3600s"), (ORG, TOT, 50_000, "month"), levels=(K2, BETA, ORG))


@pytest.mark.parametrize("by", ["admit", "extend", "usage"])
async def test_a_sibling_reclaims_an_expired_hold_into_windows_it_does_not_count(
    client: Any, by: str
) -> None:
    """Alpha's hold counts against a day window beta's calls do not name: the script asks for
    it and the client names it too, so the hold is charged where it belongs."""
    alpha = Ledger(client, reservation_ttl_s=TTL_S)
    beta = Ledger(client)
    b = await admitted(beta, BETA_SC, input_tokens=0, output_estimate=10)
    await admitted(alpha, ALPHA_SC, input_tokens=50, output_estimate=250, charge_on_expiry=True)
    await asyncio.sleep(PAST_TTL_S)
    if by == "admit":
        await admitted(beta, BETA_SC, input_tokens=0, output_estimate=10)
    elif by == "extend":
        await beta.extend(b.reservation, 10)
    else:
        await beta.usage(BETA_SC)
    k_res = alpha.keys.core(ALPHA_SC)[1]
    assert await client.hlen(k_res) == (2 if by == "admit" else 1)  # only beta's are live
    org = (await beta.usage(BETA_SC)).rows[1]
    assert org.used == 300
    assert await used(alpha, ALPHA_SC) == [300, 300]


async def test_an_expired_and_charged_id_is_not_admitted_again(client: Any) -> None:
    ledger = Ledger(client, reservation_ttl_s=TTL_S)
    await admitted(
        ledger, SC, input_tokens=0, output_estimate=100, charge_on_expiry=True, reservation_id="r1"
    )
    await asyncio.sleep(PAST_TTL_S)
    await ledger.usage(SC)
    with pytest.raises(ReservationReused):
        await ledger.admit(SC, input_tokens=0, output_estimate=100, reservation_id="r1")
    assert (await ledger.usage(SC)).rows[0].reserved == 0


async def test_an_admit_answered_late_for_a_wrong_clock_guess_is_sent_again(
    ledger: Ledger,
) -> None:
    """The client believed the server's clock 10 s behind: its "not after" had passed when the
    script ran, so nothing was reserved; the reply came in time, so it calls again."""
    ledger._offset_ms -= 10_000
    a = await admitted(ledger, SC, input_tokens=0, output_estimate=100)
    u = await ledger.usage(SC)
    assert (u.rows[0].reserved, u.live_reservations) == (100, 1)
    await ledger.settle(a.reservation, input_tokens=0, output_tokens=10)
    assert (await ledger.usage(SC)).rows[0].used == 10
