"""Limits that span tenants (a route's, an upstream's), on a real Valkey standalone and a 3-node
cluster: tenants in different slots draw allowances from the limit's own slot, and together
never spend past it (hardcap_core/ledger/allowances.py has the argument)."""

from __future__ import annotations

import asyncio
import random

import pytest

from hardcap_core.budgets import Dimension, Level, LevelKind, Scope, Window
from hardcap_core.ledger import Admitted, Extended, Ledger, Refusal, Refused
from hardcap_core.ledger.allowances import SharedLimits, shared_budgets
from hardcap_core.ledger.scripts import ALLOWANCE_SCRIPTS, lua_dir
from tests.conftest import make_client

TENANTS = [f"tenant{i}" for i in range(8)]  # spread over the cluster's three nodes


def _scope(tenant: str) -> Scope:
    return Scope((Level(LevelKind.TENANT, tenant),))


def _upstream(limit: int, window: str = "day", **rates: int) -> SharedLimits:
    budgets = [(Dimension.TOTAL_TOKENS, limit, Window.parse(window))] if limit else []
    return SharedLimits(shared_budgets("upstream", "openai", budgets, **rates))


async def _spent(ledger: Ledger, shared: SharedLimits, tenants: list[str]) -> dict[str, int]:
    """What each tenant's hierarchy was charged on the shared row, and checks its allowance."""
    b = shared.budgets[0]
    bounds = b.window.bounds(ledger.server_now_ms())
    out = {}
    for t in tenants:
        key = ledger.keys.used_of(f"t:{t}", bounds.spec, bounds.id)
        used, allowance = await ledger.client.hmget(key, b.field, b.field + ":a")
        out[t] = int(used or 0)
        assert out[t] <= int(allowance or 0)  # each within its own allowance
    return out


async def _granted(ledger: Ledger, shared: SharedLimits) -> int:
    b = shared.budgets[0]
    bounds = b.window.bounds(ledger.server_now_ms())
    key = ledger.keys.granted(b.tag, bounds.spec, bounds.id)
    return int(await ledger.client.hget(key, b.field) or 0)


async def test_grants_never_pass_the_limit(ledger: Ledger) -> None:
    shared = _upstream(10_000)
    row = shared.budgets[0]
    now = ledger.server_now_ms()
    given = await asyncio.gather(
        *(ledger.allowances.grant(f"t:{t}", [(row, 700)], now) for t in TENANTS for _ in range(3))
    )
    assert sum(g[row.field] for g in given) >= 10_000  # what a short ask took back went again
    bounds = row.window.bounds(now)
    held = [
        int(
            await ledger.client.hget(
                ledger.keys.used_of(f"t:{t}", "d", bounds.id), row.field + ":a"
            )
            or 0
        )
        for t in TENANTS
    ]
    # 24 asks of 700 from 8 hierarchies: their allowances add up to what was granted, which is
    # the limit at most (the short asks took back from others only what they lacked).
    assert sum(held) == await _granted(ledger, shared) <= 10_000
    assert sum(held) >= 10_000 - 700
    await ledger.allowances.grant("t:late", [(row, 1)], now)  # takes back unused, so it gets 1
    late = ledger.keys.used_of("t:late", "d", bounds.id)
    assert int(await ledger.client.hget(late, row.field + ":a") or 0) >= 1
    assert await _granted(ledger, shared) <= 10_000


@pytest.mark.parametrize("seed", [1, 2])
async def test_tenants_in_different_slots_never_spend_past_the_upstream(
    ledger: Ledger, backend: tuple[str, bool], seed: int
) -> None:
    """Eight tenants, 8 x 30 requests at once from two clients (two gateway instances): admit,
    extend, settle what was held. The sum of what the ledger charged stays within the upstream's
    budget, and the limit is not stranded in idle allowances (most of it is spent)."""
    limit = 20_000
    shared = _upstream(limit)
    other = Ledger(await make_client(*backend))
    rng = random.Random(seed)

    async def one(lg: Ledger, tenant: str) -> None:
        res = await lg.admit(
            _scope(tenant), input_tokens=rng.randint(5, 50), output_estimate=rng.randint(20, 200),
            min_output=1, shared=shared,
        )  # fmt: skip
        if not isinstance(res, Admitted):
            assert isinstance(res, Refused) and res.shared is not None
            return
        r = res.reservation
        out = r.output_reserved
        if rng.random() < 0.5:
            e = await lg.extend(r, 64)
            if isinstance(e, Extended):
                out = e.output_reserved
        await asyncio.sleep(rng.random() / 50)
        await lg.settle(r, input_tokens=r.input_tokens, output_tokens=out)

    try:
        await asyncio.gather(
            *(one(ledger if i % 2 else other, t) for t in TENANTS for i in range(30))
        )
    finally:
        await other.client.aclose()
    spent = await _spent(ledger, shared, TENANTS)
    if backend[1]:  # on the cluster the hierarchies and the upstream's slot span its nodes
        keys = [f"hc:{{t:{t}}}:reserved" for t in TENANTS] + ["hc:{up:openai}:g"]
        assert len({ledger.client.get_node_from_key(k).name for k in keys}) == 3
    assert sum(spent.values()) <= limit
    assert await _granted(ledger, shared) <= limit
    assert sum(spent.values()) > limit // 2


async def test_a_refusal_names_the_upstream(ledger: Ledger) -> None:
    shared = _upstream(1_000)
    a = await ledger.admit(_scope("a"), input_tokens=400, output_estimate=500, shared=shared)
    assert isinstance(a, Admitted)
    b = await ledger.admit(_scope("b"), input_tokens=400, output_estimate=500, shared=shared)
    assert isinstance(b, Refused)
    assert b.reason is Refusal.EXCEEDED and b.shared is not None
    assert b.shared.owner == "upstream:openai"
    assert "upstream:openai" in b.message
    never = await ledger.admit(_scope("b"), input_tokens=900, output_estimate=500, shared=shared)
    assert isinstance(never, Refused) and never.never_fits and "upstream:openai" in never.message


async def test_release_returns_unused_allowance_to_whoever_needs_it(ledger: Ledger) -> None:
    """A small tenant's grant (5% of the limit, more than it used) is taken back when another
    tenant needs the rest; and an explicit release returns all that is not used or held."""
    shared = _upstream(1_000)
    small = await ledger.admit(_scope("small"), input_tokens=5, output_estimate=5, shared=shared)
    assert isinstance(small, Admitted)  # granted 50 (the chunk), holds 10
    await ledger.settle(small.reservation, input_tokens=5, output_tokens=5)
    big = await ledger.admit(_scope("big"), input_tokens=490, output_estimate=500, shared=shared)
    assert isinstance(big, Admitted)  # 990: the 950 left, and 40 taken back from "small"
    assert (await _spent(ledger, shared, ["small"]))["small"] == 10
    await ledger.settle(big.reservation, input_tokens=490, output_tokens=100)
    back = await ledger.release_allowances(_scope("big"), shared)
    assert back == {shared.budgets[0].field: 400}  # 990 granted, 590 used
    assert await _granted(ledger, shared) == 600


async def test_a_new_window_starts_every_allowance_again(ledger: Ledger) -> None:
    shared = _upstream(100, window="2s")
    row = shared.budgets[0]
    await _at_window_start(ledger, 2000)
    first = await ledger.admit(_scope("a"), input_tokens=50, output_estimate=50, shared=shared)
    assert isinstance(first, Admitted)
    full = await ledger.admit(_scope("b"), input_tokens=10, output_estimate=10, shared=shared)
    assert isinstance(full, Refused) and full.shared == row
    await _at_window_start(ledger, 2000)
    again = await ledger.admit(_scope("b"), input_tokens=10, output_estimate=10, shared=shared)
    assert isinstance(again, Admitted)


async def test_requests_per_minute_across_tenants_admit_exactly_the_limit(ledger: Ledger) -> None:
    shared = _upstream(0, requests_per_minute=25)
    await _at_window_start(ledger, 60_000, within_ms=50_000)  # 10 s left at least
    results = await asyncio.gather(
        *(
            ledger.admit(_scope(t), input_tokens=1, output_estimate=1, shared=shared)
            for t in TENANTS
            for _ in range(5)
        )
    )
    admitted = [r for r in results if isinstance(r, Admitted)]
    assert len(admitted) == 25
    refused = [r for r in results if isinstance(r, Refused)]
    assert all(r.shared is not None and r.shared.measure == "rpm" for r in refused)
    assert all(r.reason is Refusal.RATE_LIMITED and r.retry_after_ms > 0 for r in refused)
    assert all("upstream:openai" in r.message for r in refused)


async def test_an_extend_past_the_allowance_asks_for_more(ledger: Ledger) -> None:
    shared = _upstream(10_000)  # chunk 500
    res = await ledger.admit(_scope("a"), input_tokens=10, output_estimate=100, shared=shared)
    assert isinstance(res, Admitted)
    e = await ledger.extend(res.reservation, 2_000)  # past the 500 granted: granted more
    assert isinstance(e, Extended) and e.granted == 2_000
    assert await _granted(ledger, shared) >= 2_110


async def _at_window_start(ledger: Ledger, length_ms: int, within_ms: int = 0) -> None:
    """Wait for the server's next window of ``length_ms`` to start, unless it is at most
    ``within_ms`` into one now (so a test's calls share one window)."""
    await ledger.usage(_scope("clock"))  # learns the server's clock
    into = ledger.server_now_ms() % length_ms
    if into > within_ms:
        await asyncio.sleep((length_ms - into) / 1000 + 0.05)


def test_the_allowance_scripts_ship_with_the_others() -> None:
    """They are read from the same folder as the ledger's (the wheel and the Lambda artifact
    copy every lua/*.lua)."""
    assert all((lua_dir() / f"{name}.lua").is_file() for name in ALLOWANCE_SCRIPTS)
