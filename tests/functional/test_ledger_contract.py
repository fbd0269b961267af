"""Contract tests of every ledger script, run against a standalone server AND a 3-master cluster."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from hardcap_core.budgets import Dimension, Prices, RateLimit
from hardcap_core.errors import ReservationReused
from hardcap_core.ledger import (
    Admitted,
    Extended,
    ExtendRefused,
    Ledger,
    Refusal,
    Refused,
    ReservationGone,
)
from tests.conftest import KEY, ORG, TENANT, scope

TOT, OUT, IN, USD = (
    Dimension.TOTAL_TOKENS,
    Dimension.OUTPUT_TOKENS,
    Dimension.INPUT_TOKENS,
    Dimension.COST_USD,
)


async def admitted(ledger: Ledger, sc: Any, **kw: Any) -> Admitted:
    res = await ledger.admit(sc, **kw)
    assert isinstance(res, Admitted), res
    return res


async def test_admit_reserves_and_settle_charges_actual(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    a = await admitted(ledger, sc, input_tokens=100, output_estimate=300)
    assert a.reservation.output_reserved == 300
    assert a.budgets[0].remaining == 600
    u = await ledger.usage(sc)
    assert (u.rows[0].used, u.rows[0].reserved, u.live_reservations) == (0, 400, 1)

    s = await ledger.settle(a.reservation, input_tokens=90, output_tokens=120)
    assert not s.duplicate and s.had_reservation
    u = await ledger.usage(sc)
    assert (u.rows[0].used, u.rows[0].reserved, u.live_reservations) == (210, 0, 0)


async def test_settle_is_idempotent(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    a = await admitted(ledger, sc, input_tokens=10, output_estimate=100)
    first = await ledger.settle(a.reservation, input_tokens=10, output_tokens=50)
    again = await ledger.settle(a.reservation, input_tokens=10, output_tokens=50)
    assert not first.duplicate and again.duplicate
    assert (await ledger.usage(sc)).rows[0].used == 60


async def test_busy_when_held_by_flight_exceeded_when_spent(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    a = await admitted(ledger, sc, input_tokens=0, output_estimate=800)
    busy = await ledger.admit(sc, input_tokens=0, output_estimate=500)
    assert isinstance(busy, Refused) and busy.reason is Refusal.BUSY
    assert busy.retry_after_ms == 1000
    assert busy.level == TENANT and busy.dimension == "total_tokens"

    await ledger.settle(a.reservation, input_tokens=0, output_tokens=800)
    spent = await ledger.admit(sc, input_tokens=0, output_estimate=500)
    assert isinstance(spent, Refused) and spent.reason is Refusal.EXCEEDED
    # Retry when the UTC day resets: between now and 24 h from now.
    assert 0 < spent.retry_after_ms <= 86_400_000
    assert spent.budgets[0].reset_ms == spent.retry_after_ms


async def test_refused_request_costs_nothing(ledger: Ledger) -> None:
    rates = (RateLimit(TENANT, requests_per_minute=2, tokens_per_minute=10_000),)
    sc = scope((TENANT, TOT, 100, "day"), rates=rates)
    for _ in range(3):
        r = await ledger.admit(sc, input_tokens=0, output_estimate=500)
        assert isinstance(r, Refused) and r.reason is Refusal.EXCEEDED
    u = await ledger.usage(sc)
    assert (u.rows[0].used, u.rows[0].reserved, u.live_reservations) == (0, 0, 0)
    # None of the three refusals used up a request slot or bucket tokens.
    ok = await admitted(ledger, sc, input_tokens=0, output_estimate=50)
    assert ok.rates[0].requests_remaining == 1
    assert ok.rates[0].tokens_remaining == 10_000 - 50


async def test_shrinks_only_at_the_tail_of_a_budget(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    held = await admitted(ledger, sc, input_tokens=0, output_estimate=900)
    # 80 tokens are free only because 900 are in flight: wait for them rather than take a
    # small hold that would likely be cut.
    r = await ledger.admit(sc, input_tokens=20, output_estimate=400, min_output=16)
    assert isinstance(r, Refused) and r.reason is Refusal.BUSY
    await ledger.settle(held.reservation, input_tokens=0, output_tokens=900)
    # Now the budget itself has only 100 left: the request gets in with what remains ...
    small = await admitted(ledger, sc, input_tokens=20, output_estimate=400, min_output=16)
    assert small.reservation.output_reserved == 80
    await ledger.settle(small.reservation, input_tokens=20, output_tokens=75)
    # ... and with less than the minimum left, it is refused, saying what is left: 5 tokens
    # are not a spent budget, a request that needs fewer still gets in.
    r = await ledger.admit(sc, input_tokens=0, output_estimate=400, min_output=16)
    assert isinstance(r, Refused) and r.reason is Refusal.EXCEEDED
    assert "has 5 tokens left" in r.message and "spent" not in r.message
    await admitted(ledger, sc, input_tokens=0, output_estimate=5, min_output=5)
    r = await ledger.admit(sc, input_tokens=0, output_estimate=400, min_output=16)
    assert isinstance(r, Refused) and "is spent for this window" in r.message


async def test_rate_limited_by_requests_per_minute(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 10**6, "day"), rates=(RateLimit(KEY, requests_per_minute=3),))
    for _ in range(3):
        await admitted(ledger, sc, input_tokens=1, output_estimate=1)
    r = await ledger.admit(sc, input_tokens=1, output_estimate=1)
    assert isinstance(r, Refused) and r.reason is Refusal.RATE_LIMITED
    assert (r.level, r.dimension) == (KEY, "requests")
    assert 0 < r.retry_after_ms <= 60_000


async def test_tokens_used_past_the_hold_fill_the_window(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 10**6, "day"), rates=(RateLimit(TENANT, tokens_per_minute=6000),))
    a = await admitted(ledger, sc, input_tokens=100, output_estimate=100)
    await ledger.settle(a.reservation, input_tokens=100, output_tokens=6500)
    r = await ledger.admit(sc, input_tokens=10, output_estimate=10)
    assert isinstance(r, Refused) and r.reason is Refusal.RATE_LIMITED
    assert (r.level, r.dimension) == (TENANT, "tokens")
    # The 6600 tokens count for a minute after they ended (see test_ledger_tpm.py).
    assert 59_000 < r.retry_after_ms <= 61_000
    assert r.rates[0].tokens_remaining == 0


async def test_hierarchy_refusal_names_the_level(ledger: Ledger) -> None:
    sc = scope(
        (KEY, TOT, 10_000, "day"),
        (TENANT, TOT, 10_000, "month"),
        (ORG, OUT, 300, "1h"),
    )
    await admitted(ledger, sc, input_tokens=500, output_estimate=200)
    r = await ledger.admit(sc, input_tokens=500, output_estimate=200)
    assert isinstance(r, Refused) and r.reason is Refusal.BUSY
    assert (r.level, r.dimension) == (ORG, "output_tokens")
    assert "org bigco" in r.message
    # Admission reserved on every level at once.
    u = await ledger.usage(sc)
    assert [row.reserved for row in u.rows] == [700, 700, 200]


async def test_input_and_cost_budgets(ledger: Ledger) -> None:
    prices = Prices.per_million(2.0, 8.0)  # 2000 and 8000 nano-USD per token
    sc = scope((TENANT, USD, 20_000_000, "month"), (KEY, IN, 1000, "day"))
    a = await admitted(ledger, sc, input_tokens=500, output_estimate=1000, prices=prices)
    assert a.budgets[0].remaining == 20_000_000 - 500 * 2000 - 1000 * 8000
    # An input budget refuses on input alone, however little output is asked for.
    r = await ledger.admit(sc, input_tokens=600, output_estimate=1, prices=prices)
    assert isinstance(r, Refused) and (r.level, r.dimension) == (KEY, "input_tokens")
    await ledger.settle(a.reservation, input_tokens=400, output_tokens=100)
    u = await ledger.usage(sc)
    assert u.rows[0].used == 400 * 2000 + 100 * 8000
    assert u.rows[1].used == 400


async def test_extend_grows_partially_then_refuses(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    a = await admitted(ledger, sc, input_tokens=100, output_estimate=800)
    e = await ledger.extend(a.reservation, 64)
    assert isinstance(e, Extended) and (e.granted, e.output_reserved) == (64, 864)
    e = await ledger.extend(a.reservation, 64)
    assert isinstance(e, Extended) and (e.granted, e.output_reserved) == (36, 900)
    e = await ledger.extend(a.reservation, 64)
    assert isinstance(e, ExtendRefused) and e.budget.level == TENANT
    assert (await ledger.usage(sc)).rows[0].reserved == 1000


async def test_expired_reservation_is_reclaimed_and_not_resurrected(client: Any) -> None:
    ledger = Ledger(client, reservation_ttl_s=0.2)
    sc = scope((TENANT, TOT, 1000, "day"))
    a = await admitted(ledger, sc, input_tokens=0, output_estimate=600)
    await asyncio.sleep(0.3)
    # The instance "died": nothing settled. Any look at the tenant returns its budget.
    u = await ledger.usage(sc)
    assert (u.rows[0].reserved, u.live_reservations) == (0, 0)
    assert isinstance(await ledger.extend(a.reservation, 64), ReservationGone)
    assert (await ledger.usage(sc)).rows[0].reserved == 0
    # The late settle still charges what was really generated, once.
    s = await ledger.settle(a.reservation, input_tokens=0, output_tokens=250)
    assert not s.had_reservation
    assert (await ledger.usage(sc)).rows[0].used == 250


async def test_heartbeat_keeps_a_slow_stream_alive(client: Any) -> None:
    ledger = Ledger(client, reservation_ttl_s=0.3)
    sc = scope((TENANT, TOT, 1000, "day"))
    a = await admitted(ledger, sc, input_tokens=0, output_estimate=100)
    for _ in range(4):
        await asyncio.sleep(0.15)
        assert isinstance(await ledger.extend(a.reservation, 0), Extended)
    assert (await ledger.usage(sc)).live_reservations == 1


async def test_admission_reclaims_before_checking(client: Any) -> None:
    ledger = Ledger(client, reservation_ttl_s=0.2)
    sc = scope((TENANT, TOT, 1000, "day"))
    await admitted(ledger, sc, input_tokens=0, output_estimate=1000)
    await asyncio.sleep(0.3)
    await admitted(ledger, sc, input_tokens=0, output_estimate=1000)


async def test_window_rollover_starts_a_fresh_budget(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 100, "2s"))
    a = await admitted(ledger, sc, input_tokens=0, output_estimate=100)
    await ledger.settle(a.reservation, input_tokens=0, output_tokens=100)
    r = await ledger.admit(sc, input_tokens=0, output_estimate=10)
    assert isinstance(r, Refused) and r.reason is Refusal.EXCEEDED
    assert 0 < r.retry_after_ms <= 2000
    await asyncio.sleep(r.retry_after_ms / 1000 + 0.05)
    await admitted(ledger, sc, input_tokens=0, output_estimate=100)


async def test_server_time_wins_over_a_wrong_client_clock(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 100, "day"), (TENANT, OUT, 100, "60s"))
    ledger._offset_ms = -3 * 86_400_000  # the client thinks it is three days ago
    await admitted(ledger, sc, input_tokens=0, output_estimate=10)
    assert abs(ledger.server_now_ms() - time.time() * 1000) < 5_000


async def test_script_flush_mid_run(ledger: Ledger, client: Any) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    a = await admitted(ledger, sc, input_tokens=0, output_estimate=100)
    await client.script_flush()  # on a cluster: every primary
    assert not any(await client.script_exists(ledger.scripts.extend.sha))
    assert isinstance(await ledger.extend(a.reservation, 10), Extended)
    await ledger.settle(a.reservation, input_tokens=0, output_tokens=110)
    assert (await ledger.usage(sc)).rows[0].used == 110


async def test_keys_share_one_slot_per_hierarchy(ledger: Ledger, client: Any) -> None:
    """Every key a script touches is declared and hash-tagged on the root (cluster-safe)."""
    sc = scope((KEY, TOT, 100, "day"), (ORG, USD, 100, "month"), (TENANT, IN, 5, "10s"))
    a = await admitted(ledger, sc, input_tokens=1, output_estimate=5)
    await ledger.settle(a.reservation, input_tokens=1, output_tokens=5)
    keys = [k async for k in client.scan_iter(match="hc:*")]
    assert keys and all(b"{o:bigco}" in k for k in keys)


async def test_reservation_ids_are_single_use(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    a = await admitted(ledger, sc, input_tokens=0, output_estimate=100, reservation_id="req-1")
    await ledger.settle(a.reservation, input_tokens=0, output_tokens=50)
    with pytest.raises(ReservationReused):
        await ledger.admit(sc, input_tokens=0, output_estimate=300, reservation_id="req-1")
    u = await ledger.usage(sc)
    assert (u.rows[0].used, u.rows[0].reserved, u.live_reservations) == (50, 0, 0)


@pytest.mark.parametrize(
    ("budget", "input_tokens", "estimate", "least", "prices"),
    [
        ((TENANT, TOT, 100, "day"), 80, 50, 30, Prices()),  # 80 in + 30 least out > 100
        ((KEY, IN, 50, "day"), 60, 10, 1, Prices()),  # the input alone is over
        ((ORG, USD, 1000, "month"), 10, 40, 20, Prices(50, 30)),  # 500 + 20 x 30 nUSD > 1000
    ],
    ids=["total", "input", "cost"],
)
async def test_a_request_larger_than_the_whole_budget_is_told_so(
    ledger: Ledger,
    budget: tuple[Any, Dimension, int, str],
    input_tokens: int,
    estimate: int,
    least: int,
    prices: Prices,
) -> None:
    """Regression: refused as 'exceeded' with the window reset as retry-after ("resets in
    15 h"), although the budget was untouched and no wait would help."""
    sc = scope(budget)
    r = await ledger.admit(
        sc, input_tokens=input_tokens, output_estimate=estimate, min_output=least, prices=prices
    )
    assert isinstance(r, Refused) and r.reason is Refusal.EXCEEDED and r.never_fits, r
    assert (r.budget, r.retry_after_ms) == (sc.budgets[0], 0)
    assert "larger than the whole" in r.message and "resets" not in r.message
    assert r.budgets[0].remaining == budget[2]  # untouched, and nothing was held
    assert (await ledger.usage(sc)).rows[0].reserved == 0


async def test_a_request_that_fits_an_empty_budget_is_not_never_fits(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 100, "day"))
    small = await admitted(ledger, sc, input_tokens=80, output_estimate=50, min_output=16)
    assert small.reservation.output_reserved == 20  # shrunk to the tail
    await ledger.settle(small.reservation, input_tokens=80, output_tokens=20)
    r = await ledger.admit(sc, input_tokens=80, output_estimate=50, min_output=16)
    assert isinstance(r, Refused) and r.reason is Refusal.EXCEEDED and not r.never_fits
    assert 0 < r.retry_after_ms <= 86_400_000 and "resets" in r.message
