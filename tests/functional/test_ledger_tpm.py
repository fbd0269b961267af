"""tokens_per_minute as a sliding 60 s window over reservations (lua/lib.lua: the tpm windows).

Against a real Valkey, standalone and cluster. The scripts read the server's clock, so a
window's past is set up by writing an ended-tokens bucket of an earlier second into the rate
hash, as a settle then would have; everything else goes through the ledger's own calls.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from hardcap_core.budgets import Dimension, RateLimit
from hardcap_core.ledger import Admitted, Extended, ExtendRefused, Ledger, Refusal, Refused
from tests.conftest import TENANT, scope

TOT = Dimension.TOTAL_TOKENS


def tpm_scope(tpm: int) -> Any:
    return scope((TENANT, TOT, 10**9, "day"), rates=(RateLimit(TENANT, tokens_per_minute=tpm),))


async def admitted(ledger: Ledger, sc: Any, **kw: Any) -> Admitted:
    res = await ledger.admit(sc, **kw)
    assert isinstance(res, Admitted), res
    return res


async def server_second(client: Any) -> int:
    t = await client.time()
    return int(t[0])


async def ended_earlier(ledger: Ledger, client: Any, sc: Any, ago_s: int, tokens: int) -> None:
    """Tokens of requests that ended ``ago_s`` seconds ago (and none before), as a settle then
    would have left them."""
    rl, tag = ledger.keys.ledger(sc)[3], TENANT.tag
    sec = await server_second(client) - ago_s
    fields = {f"{tag}:e{sec % 61}": f"{sec},{tokens}", f"{tag}:es": tokens}
    await client.hset(rl, mapping={**fields, f"{tag}:eo": sec - 1, f"{tag}:el": sec})


async def test_a_full_window_refuses_until_its_oldest_tokens_leave(
    ledger: Ledger, client: Any
) -> None:
    sc = tpm_scope(6000)
    await admitted(ledger, sc, input_tokens=0, output_estimate=1)  # the counters restored
    await ended_earlier(ledger, client, sc, 59, 5990)
    r = await ledger.admit(sc, input_tokens=10, output_estimate=10)
    assert isinstance(r, Refused) and r.reason is Refusal.RATE_LIMITED
    assert (r.level, r.dimension) == (TENANT, "tokens")
    # The tokens that ended 59 s ago leave within about two seconds, not a minute.
    assert 0 < r.retry_after_ms <= 2100
    assert r.rates[0].tokens_remaining == 6000 - 5990 - 1
    await asyncio.sleep(r.retry_after_ms / 1000)
    ok = await admitted(ledger, sc, input_tokens=10, output_estimate=10)
    assert ok.reservation.output_reserved == 10


async def test_the_window_does_not_refill_within_the_minute(ledger: Ledger) -> None:
    # A bucket refilled 100 tokens a second; the window gives nothing back until a minute has
    # passed since the tokens were used.
    sc = tpm_scope(6000)
    a = await admitted(ledger, sc, input_tokens=100, output_estimate=100)
    await ledger.settle(a.reservation, input_tokens=100, output_tokens=5850)
    await asyncio.sleep(1.1)
    r = await ledger.admit(sc, input_tokens=10, output_estimate=50)
    assert isinstance(r, Refused) and r.reason is Refusal.RATE_LIMITED
    assert 55_000 < r.retry_after_ms <= 61_000
    assert r.rates[0].tokens_remaining == 50
    assert 55_000 < (r.rates[0].tokens_reset_ms or 0) <= 61_000


async def test_live_holds_count_and_a_short_retry_while_only_they_block(ledger: Ledger) -> None:
    sc = tpm_scope(1000)
    a = await admitted(ledger, sc, input_tokens=100, output_estimate=800)
    assert a.rates[0].tokens_remaining == 100
    r = await ledger.admit(sc, input_tokens=50, output_estimate=100)
    # Its output is not shrunk to the 100 left: it waits for the live hold to settle.
    assert isinstance(r, Refused) and r.reason is Refusal.RATE_LIMITED
    assert r.retry_after_ms == 1000
    small = await admitted(ledger, sc, input_tokens=50, output_estimate=50)
    assert small.rates[0].tokens_remaining == 0


async def test_settle_moves_the_real_count_into_the_window(ledger: Ledger) -> None:
    sc = tpm_scope(10_000)
    a = await admitted(ledger, sc, input_tokens=100, output_estimate=400)
    b = await admitted(ledger, sc, input_tokens=100, output_estimate=400)
    assert b.rates[0].tokens_remaining == 10_000 - 1000
    await ledger.settle(a.reservation, input_tokens=90, output_tokens=60)  # less than held
    await ledger.settle(b.reservation, input_tokens=100, output_tokens=900)  # more
    c = await admitted(ledger, sc, input_tokens=0, output_estimate=1)
    assert c.rates[0].tokens_remaining == 10_000 - 150 - 1000 - 1


async def test_expiry_counts_the_hold_and_a_late_settle_only_what_exceeds_it(client: Any) -> None:
    ledger = Ledger(client, reservation_ttl_s=0.2)
    sc = tpm_scope(10_000)
    # As the gateway admits: an expired hold is charged (a lost stream may have used it).
    a = await admitted(ledger, sc, input_tokens=100, output_estimate=400, charge_on_expiry=True)
    await asyncio.sleep(0.3)
    b = await admitted(ledger, sc, input_tokens=0, output_estimate=1)  # reclaims a
    # The lost stream may have generated all it held: its hold stays in the window.
    assert b.rates[0].tokens_remaining == 10_000 - 500 - 1
    await ledger.settle(a.reservation, input_tokens=100, output_tokens=700)
    await ledger.settle(b.reservation, input_tokens=0, output_tokens=1)
    c = await admitted(ledger, sc, input_tokens=0, output_estimate=1)
    assert c.rates[0].tokens_remaining == 10_000 - 800 - 1 - 1


async def test_an_extend_the_window_cannot_cover_is_refused(ledger: Ledger) -> None:
    sc = tpm_scope(1000)
    a = await admitted(ledger, sc, input_tokens=100, output_estimate=800)
    e = await ledger.extend(a.reservation, 64)
    assert isinstance(e, Extended) and e.output_reserved == 864
    e = await ledger.extend(a.reservation, 64)
    assert isinstance(e, Extended) and (e.granted, e.output_reserved) == (36, 900)
    e = await ledger.extend(a.reservation, 64)
    assert isinstance(e, ExtendRefused) and e.rate_limited and e.level == TENANT
    # The extensions are held: settling drops all 1000 from the live total.
    await ledger.settle(a.reservation, input_tokens=100, output_tokens=300)
    b = await admitted(ledger, sc, input_tokens=0, output_estimate=10)
    assert b.rates[0].tokens_remaining == 1000 - 400 - 10


async def test_a_request_larger_than_the_limit_runs_alone(ledger: Ledger) -> None:
    sc = tpm_scope(1000)
    big = await admitted(ledger, sc, input_tokens=900, output_estimate=400, min_output=16)
    assert big.reservation.output_reserved == 100
    r = await ledger.admit(sc, input_tokens=900, output_estimate=400, min_output=16)
    assert isinstance(r, Refused) and r.reason is Refusal.RATE_LIMITED


async def test_no_minute_ever_holds_more_than_the_limit(ledger: Ledger) -> None:
    # Many concurrent streams admit, extend and settle (at most what they hold) for about two
    # seconds, well inside one minute: everything they held or used must fit in the limit.
    tpm = 3000
    sc = tpm_scope(tpm)
    rng = random.Random(14)
    totals: list[int] = []

    async def stream() -> None:
        while True:
            res = await ledger.admit(
                sc, input_tokens=rng.randint(1, 60), output_estimate=rng.randint(1, 120)
            )
            if isinstance(res, Refused):
                assert res.reason is Refusal.RATE_LIMITED and res.retry_after_ms > 0
                if res.retry_after_ms > 1000:
                    return  # only ended tokens leaving, in a minute, would let it in
                await asyncio.sleep(0.02)
                continue
            r, held = res.reservation, res.reservation.output_reserved
            for _ in range(rng.randint(0, 4)):
                await asyncio.sleep(rng.random() / 50)
                e = await ledger.extend(r, 64)
                if not isinstance(e, Extended):
                    assert isinstance(e, ExtendRefused) and e.rate_limited
                    break
                held = e.output_reserved
            out = rng.randint(0, held)
            totals.append(r.input_tokens + out)
            await ledger.settle(r, input_tokens=r.input_tokens, output_tokens=out)
            if rng.random() < 0.5:
                return

    await asyncio.gather(*(stream() for _ in range(32)))
    assert sum(totals) <= tpm
    final = await ledger.admit(sc, input_tokens=0, output_estimate=1)
    spent = sum(totals)
    if isinstance(final, Admitted):
        assert final.rates[0].tokens_remaining == tpm - spent - 1
    else:
        assert final.rates[0].tokens_remaining == tpm - spent


async def test_state_of_the_earlier_token_bucket_is_ignored(ledger: Ledger, client: Any) -> None:
    sc = tpm_scope(1000)
    await admitted(ledger, sc, input_tokens=0, output_estimate=1)
    rl = ledger.keys.ledger(sc)[3]
    await client.hset(rl, mapping={f"{TENANT.tag}:tb": -50_000, f"{TENANT.tag}:tt": 1})
    a = await admitted(ledger, sc, input_tokens=10, output_estimate=10)
    assert a.rates[0].tokens_remaining == 1000 - 1 - 20


async def test_tokens_that_ended_over_a_minute_ago_count_nothing(
    ledger: Ledger, client: Any
) -> None:
    sc = tpm_scope(1000)
    await admitted(ledger, sc, input_tokens=0, output_estimate=1)
    # Long gone: the whole sum is dropped without reading a bucket.
    await ended_earlier(ledger, client, sc, 200, 10**6)
    a = await admitted(ledger, sc, input_tokens=10, output_estimate=10)
    assert a.rates[0].tokens_remaining == 1000 - 1 - 20
    # Ended 61 s ago, in the bucket this second reuses: subtracted, then the bucket is reused.
    await ended_earlier(ledger, client, sc, 61, 10**6)
    b = await admitted(ledger, sc, input_tokens=10, output_estimate=10)
    assert b.rates[0].tokens_remaining == 1000 - 1 - 20 - 20
    await ledger.settle(b.reservation, input_tokens=10, output_tokens=5)
    c = await admitted(ledger, sc, input_tokens=0, output_estimate=1)
    assert c.rates[0].tokens_remaining == 1000 - 1 - 20 - 15 - 1
