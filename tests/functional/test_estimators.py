"""Output estimators; the shared p95 one against a real standalone server and a 3-master cluster."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hardcap_core.ledger import Ledger
from hardcap_core.ledger.estimators import FixedEstimator, MaxTokensEstimator, SharedP95Estimator
from tests.conftest import make_client

ROUTE = "gpt-4o-mini"


@pytest.fixture
async def other_ledger(backend: tuple[str, bool]) -> AsyncIterator[Ledger]:
    """A second "instance": its own client on the same server."""
    c = await make_client(*backend)
    yield Ledger(c)
    await c.aclose()


async def observe_all(est: SharedP95Estimator, values: list[int], route: str = ROUTE) -> None:
    for v in values:
        await est.observe(route, v, truncated=False)


async def test_max_tokens_and_fixed_estimators() -> None:
    assert await MaxTokensEstimator().estimate(ROUTE, 4096) == 4096
    fixed = FixedEstimator(300)
    assert await fixed.estimate(ROUTE, 4096) == 300
    assert await fixed.estimate(ROUTE, 100) == 100  # capped by the request's max_tokens
    assert await FixedEstimator(0).estimate(ROUTE, 100) == 1  # never reserves nothing
    await fixed.observe(ROUTE, 10_000, truncated=False)  # learns nothing
    assert await fixed.estimate(ROUTE, 4096) == 300


async def test_below_min_samples_reserves_max_tokens(ledger: Ledger) -> None:
    est = SharedP95Estimator(ledger, min_samples=10, cache_seconds=0)
    assert await est.estimate(ROUTE, 2048) == 2048
    await observe_all(est, [50] * 9)
    assert await est.estimate(ROUTE, 2048) == 2048
    await est.observe(ROUTE, 50, truncated=False)
    assert await est.estimate(ROUTE, 2048) == 50


async def test_p95_of_a_known_distribution_capped_by_max_tokens(ledger: Ledger) -> None:
    est = SharedP95Estimator(ledger, min_samples=10, cache_seconds=0)
    values = list(range(1, 101))
    random.Random(7).shuffle(values)
    await observe_all(est, values)
    assert await est.current(ROUTE) == (95, 100)
    assert await est.estimate(ROUTE, 4096) == 95
    assert await est.estimate(ROUTE, 40) == 40


async def test_instances_share_samples(ledger: Ledger, other_ledger: Ledger) -> None:
    a = SharedP95Estimator(ledger, min_samples=20, cache_seconds=0)
    b = SharedP95Estimator(other_ledger, min_samples=20, cache_seconds=0)
    # Neither instance alone has seen min_samples replies; together they have.
    await observe_all(a, [100] * 10)
    await observe_all(b, [300] * 10)
    assert await a.current(ROUTE) == (300, 20)
    assert await b.estimate(ROUTE, 4096) == 300
    assert await a.estimate(ROUTE, 4096) == 300
    # Routes are separate samples.
    assert await b.estimate("other-route", 4096) == 4096


async def test_truncated_replies_are_not_recorded(ledger: Ledger) -> None:
    est = SharedP95Estimator(ledger, min_samples=5, cache_seconds=0)
    await observe_all(est, [200] * 5)
    for _ in range(20):
        await est.observe(ROUTE, 10, truncated=True)
    await est.observe(ROUTE, 0, truncated=False)  # an empty reply says nothing either
    assert await est.current(ROUTE) == (200, 5)
    samples_key, _ = ledger.keys.estimator(ROUTE)
    assert await ledger.client.llen(samples_key) == 5


async def test_keeps_only_the_last_samples(ledger: Ledger) -> None:
    est = SharedP95Estimator(ledger, min_samples=5, cache_seconds=0, keep=10)
    await observe_all(est, [1000] * 50)
    assert await est.estimate(ROUTE, 4096) == 1000
    await observe_all(est, list(range(1, 11)))
    # The 50 long replies have all been pushed out of the sample of 10.
    assert await est.current(ROUTE) == (10, 10)
    assert await est.estimate(ROUTE, 4096) == 10


async def test_cache_hides_new_samples_until_it_expires(
    ledger: Ledger, other_ledger: Ledger
) -> None:
    writer = SharedP95Estimator(ledger, min_samples=5, cache_seconds=0)
    reader = SharedP95Estimator(other_ledger, min_samples=5, cache_seconds=0.3)
    await observe_all(writer, [100] * 5)
    assert await reader.estimate(ROUTE, 4096) == 100
    await observe_all(writer, [500] * 100)
    assert await writer.estimate(ROUTE, 4096) == 500
    assert await reader.estimate(ROUTE, 4096) == 100  # still the cached value
    await asyncio.sleep(0.35)
    assert await reader.estimate(ROUTE, 4096) == 500


async def test_recompute_every_sixteenth_sample_once_the_sample_is_large(ledger: Ledger) -> None:
    """Past 160 samples the quantile is refreshed every 16th sample, not on every one."""
    est = SharedP95Estimator(ledger, min_samples=5, cache_seconds=0)
    await observe_all(est, [10] * 160)
    samples_key, stats_key = ledger.keys.estimator(ROUTE)
    stats: Any = await ledger.client.hgetall(stats_key)
    assert int(stats[b"c"]) == 160 and int(stats[b"q"]) == 10
    # Long replies 161..175 leave the quantile stale; the 176th recomputes it, and 16 of 176
    # (9%) is more than the 5% tail, so the p95 is now 1000.
    await observe_all(est, [1000] * 15)
    assert await est.current(ROUTE) == (10, 175)
    await est.observe(ROUTE, 1000, truncated=False)
    assert await est.current(ROUTE) == (1000, 176)
    assert await ledger.client.llen(samples_key) == 176


@pytest.mark.parametrize(("flood", "max_tokens"), [(1, 500), (4000, 8000)], ids=["short", "long"])
async def test_one_tenants_replies_do_not_move_anothers_estimate(
    ledger: Ledger, flood: int, max_tokens: int
) -> None:
    """Regression: the sample was per route across tenants, so one tenant's 60 streamed
    max_tokens:1 replies cut another tenant's next output hold from 500 to 65."""
    est = SharedP95Estimator(ledger, min_samples=50, cache_seconds=0)
    for _ in range(60):
        await est.observe(ROUTE, flood, truncated=False, tenant="a")
    assert await est.estimate(ROUTE, max_tokens, tenant="a") == min(flood, max_tokens)
    # Tenant b has no sample of its own, and one other tenant is no consensus: max_tokens, as
    # with no traffic on the route at all.
    assert await est.estimate(ROUTE, max_tokens, tenant="b") == max_tokens
    for _ in range(50):
        await est.observe(ROUTE, 200, truncated=False, tenant="b")
    assert await est.estimate(ROUTE, max_tokens, tenant="b") == 200


@pytest.mark.parametrize("flood", [1, 4000], ids=["short", "long"])
async def test_the_route_consensus_resists_one_tenants_flood(ledger: Ledger, flood: int) -> None:
    """A tenant without a sample of its own reserves the upper median of the tenants' p95s:
    one vote per tenant, so a flood moves it only between the other tenants' values."""
    est = SharedP95Estimator(ledger, min_samples=5, cache_seconds=0)
    for tenant, value in (("t1", 300), ("t2", 320), ("t3", 340)):
        for _ in range(5):
            await est.observe(ROUTE, value, truncated=False, tenant=tenant)
    assert await est.estimate(ROUTE, 4096, tenant="new") == 320
    for _ in range(200):
        await est.observe(ROUTE, flood, truncated=False, tenant="t1")
    assert await est.estimate(ROUTE, 4096, tenant="t1") == flood  # its own sample follows it
    assert 320 <= await est.estimate(ROUTE, 4096, tenant="new") <= 340


async def test_a_consensus_needs_three_tenants(ledger: Ledger) -> None:
    est = SharedP95Estimator(ledger, min_samples=5, cache_seconds=0)
    for tenant in ("t1", "t2"):
        await observe_all_for(est, tenant, [100] * 5)
    assert await est.estimate(ROUTE, 4096, tenant="new") == 4096
    await observe_all_for(est, "t3", [100] * 5)
    assert await est.estimate(ROUTE, 4096, tenant="new") == 100
    assert await est.estimate("other-route", 4096, tenant="new") == 4096


async def test_a_tenants_sample_lives_in_its_own_slot(ledger: Ledger, other_ledger: Ledger) -> None:
    """Two instances share a tenant's sample; its keys carry the tenant's hash tag."""
    a = SharedP95Estimator(ledger, min_samples=10, cache_seconds=0)
    b = SharedP95Estimator(other_ledger, min_samples=10, cache_seconds=0)
    await observe_all_for(a, "acme", [100] * 5)
    await observe_all_for(b, "acme", [300] * 5)
    assert await a.estimate(ROUTE, 4096, tenant="acme") == 300
    samples_key, stats_key = ledger.keys.estimator(ROUTE, "acme")
    assert "{t:acme}" in samples_key and "{t:acme}" in stats_key
    assert await ledger.client.llen(samples_key) == 10


async def observe_all_for(est: SharedP95Estimator, tenant: str, values: list[int]) -> None:
    for v in values:
        await est.observe(ROUTE, v, truncated=False, tenant=tenant)


async def test_a_tenant_votes_again_only_when_its_quantile_moves(ledger: Ledger) -> None:
    """Every completed reply records a sample; the vote (a second round trip) goes out when the
    tenant's quantile changed, not once per reply — and the consensus still follows it."""
    est = SharedP95Estimator(ledger, min_samples=10, cache_seconds=60)
    votes: list[int] = []
    vote = ledger.vote_output

    async def counted(route: str, tenant: str, value: int) -> Any:
        votes.append(value)
        return await vote(route, tenant, value)

    ledger.vote_output = counted  # type: ignore[method-assign]
    for v in [40] * 30:
        await est.observe(ROUTE, v, truncated=False, tenant="t1")
    assert votes == [40]  # the sample reached 10 at 40, and its quantile stayed there
    for v in [400] * 40:
        await est.observe(ROUTE, v, truncated=False, tenant="t1")
    assert votes[0] == 40 and votes[-1] == 400 and len(votes) <= 4
    assert (await ledger.output_consensus(ROUTE)).tenants == 1
