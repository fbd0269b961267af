"""The rollup against a real Valkey (standalone and cluster) and moto's DynamoDB: usage records
reach the durable ledger exactly once, whatever crashes or overlaps, and a flushed cache gets
its counters back before it admits anyone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hardcap_core.budgets import Prices
from hardcap_core.config import Config, parse_config
from hardcap_core.errors import DurableStoreUnavailable
from hardcap_core.ledger import Admitted, Ledger, Refused, ReservationMeta, SettleNote
from hardcap_core.rollup import run as run_module
from hardcap_core.rollup.records import parse_entry
from hardcap_core.rollup.restore import durable_ledger
from hardcap_core.rollup.run import run_rollup
from hardcap_core.rollup.streams import UsageStream
from hardcap_core.rollup.table import UsageTable
from tests.conftest import flush
from tests.stack import config_data

PRICES = Prices.per_million(1.0, 2.0)  # the test config's price: 1000 / 2000 nUSD per token


@pytest.fixture
def config(backend: tuple[str, bool]) -> Config:
    return parse_config(config_data("http://127.0.0.1:9", backend[0]))


async def spend(
    ledger: Ledger, config: Config, key: str, n: int, *, inp: int = 10, out: int = 20
) -> list[tuple[int, int]]:
    """``n`` requests of ``key``'s tenant admitted and settled; their (input, output)."""
    principal = config.principal_by_id(key)
    assert principal is not None
    done = []
    for i in range(n):
        meta = ReservationMeta("small", "mock-small", key, f"rq-{i}", provider="mock")
        admitted = await ledger.admit(principal.scope, input_tokens=inp, output_estimate=out + 5,
                                      prices=PRICES, meta=meta)  # fmt: skip
        assert isinstance(admitted, Admitted)
        await ledger.settle(admitted.reservation, input_tokens=inp + i, output_tokens=out + i,
                            note=SettleNote(reasoning_tokens=i, cached_input_tokens=1))  # fmt: skip
        done.append((inp + i, out + i))
    return done


def totals(usage_table: UsageTable, tenant: str) -> dict[str, int]:
    rows = usage_table.usage([tenant], 0, 2**42)
    keys = ("requests", "input_tokens", "output_tokens", "reasoning_tokens", "cost_nusd", "refused")
    return {k: sum(getattr(r, k) for r in rows) for k in keys}


async def stream_records(client: Any, ledger: Ledger, config: Config, tenant: str) -> list[Any]:
    root = config.tenant_scope(tenant).root
    entries = await client.xrange(ledger.keys.usage_stream(root))
    return [parse_entry(i, f) for i, f in entries]


async def test_settled_records_reach_dynamodb_once(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    ledger = Ledger(client)
    done = await spend(ledger, config, "alpha-k", 7) + await spend(ledger, config, "beta-k", 3)
    records = await stream_records(client, ledger, config, "alpha")  # alpha and beta share acme
    assert len(records) == 10
    report = await run_rollup(config, client, usage_table)
    assert report.applied == 10 and report.stalled == []
    alpha = totals(usage_table, "alpha")
    assert alpha["requests"] == 7
    assert alpha["input_tokens"] == sum(i for i, _ in done[:7])
    assert alpha["output_tokens"] == sum(o for _, o in done[:7])
    assert alpha["reasoning_tokens"] == sum(range(7))
    assert alpha["cost_nusd"] == sum(PRICES.cost(i, o) for i, o in done[:7])
    assert totals(usage_table, "beta")["output_tokens"] == sum(o for _, o in done[7:])
    # Again: nothing new, nothing counted twice; the applied records are trimmed from the cache.
    assert (await run_rollup(config, client, usage_table)).applied == 0
    assert totals(usage_table, "alpha") == alpha
    assert await stream_records(client, ledger, config, "alpha") == []


async def test_refusals_are_recorded_and_cost_nothing(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    ledger = Ledger(client)
    principal = config.principal_by_id("beta-k")
    assert principal is not None
    huge = await ledger.admit(principal.scope, input_tokens=1, output_estimate=2_000_000)
    assert isinstance(huge, Refused) and huge.never_fits
    await run_rollup(config, client, usage_table)
    beta = totals(usage_table, "beta")
    assert beta["refused"] == 1 and beta["requests"] == 0 and beta["output_tokens"] == 0


async def test_a_run_killed_between_write_and_ack_does_not_count_twice(
    client: Any, config: Config, usage_table: UsageTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(client)
    done = await spend(ledger, config, "alpha-k", 5)

    async def die(self: UsageStream, ids: Any) -> None:
        if ids:
            raise SystemExit("killed after the DynamoDB write, before XACK")

    with monkeypatch.context() as m:
        m.setattr(UsageStream, "ack", die)
        # A killed process does not give its lease back either.
        m.setattr(UsageStream, "release", lambda self, owner: asyncio.sleep(0))
        with pytest.raises(SystemExit):
            await run_rollup(config, client, usage_table)
    assert totals(usage_table, "alpha")["requests"] == 5  # written, never acknowledged
    # The lease is still held: the next run leaves the stream alone ...
    assert (await run_rollup(config, client, usage_table)).skipped_busy >= 1
    await client.delete(ledger.keys.rollup_lease(config.tenant_scope("alpha").root))
    # ... until it runs out; then the entries left pending are claimed, found applied, acked.
    report = await run_rollup(config, client, usage_table)
    assert report.applied == 0 and report.stalled == []
    assert totals(usage_table, "alpha")["output_tokens"] == sum(o for _, o in done)
    assert totals(usage_table, "alpha")["requests"] == 5
    assert await stream_records(client, ledger, config, "alpha") == []


async def test_a_run_that_dies_mid_batch_loses_nothing(
    client: Any, config: Config, usage_table: UsageTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(client)
    done = await spend(ledger, config, "alpha-k", 60)
    writes = {"n": 0}
    real = UsageTable.apply

    def flaky(self: UsageTable, *args: Any) -> bool:
        writes["n"] += 1
        if writes["n"] == 2:
            raise DurableStoreUnavailable("DynamoDB went away mid-batch")
        return real(self, *args)

    with monkeypatch.context() as m:
        m.setattr(UsageTable, "apply", flaky)
        m.setattr(run_module, "MAX_WRITES", 12)  # chunks of a few records: several writes
        monkeypatch.setattr("hardcap_core.rollup.table.MAX_WRITES", 12)
        with pytest.raises(DurableStoreUnavailable):
            await run_rollup(config, client, usage_table, batch=25)
        partial = totals(usage_table, "alpha")["requests"]
        assert 0 < partial < 60
        await run_rollup(config, client, usage_table, batch=25)
    assert totals(usage_table, "alpha")["requests"] == 60
    assert totals(usage_table, "alpha")["output_tokens"] == sum(o for _, o in done)


@pytest.mark.parametrize("with_lease", [True, False])
async def test_two_rollups_at_once_never_double_count(
    client: Any,
    config: Config,
    usage_table: UsageTable,
    monkeypatch: pytest.MonkeyPatch,
    with_lease: bool,
) -> None:
    """Also with the lease out of the way (as if it had run out mid-run): then the durable
    cursor and the contiguity check are all that stand between the runs."""
    ledger = Ledger(client)
    done = await spend(ledger, config, "alpha-k", 120)
    if not with_lease:
        monkeypatch.setattr(UsageStream, "lease", lambda self, owner, ttl: _true())
    monkeypatch.setattr(run_module, "MAX_WRITES", 12)
    monkeypatch.setattr("hardcap_core.rollup.table.MAX_WRITES", 12)
    reports = await asyncio.gather(
        *(
            run_rollup(config, client, usage_table, ledger=Ledger(client), batch=20)
            for _ in range(3)
        )
    )
    for _ in range(5):  # whatever the overlap left pending, later runs finish
        if totals(usage_table, "alpha")["requests"] == 120:
            break
        await run_rollup(config, client, usage_table, batch=20)
    assert totals(usage_table, "alpha")["requests"] == 120
    assert totals(usage_table, "alpha")["output_tokens"] == sum(o for _, o in done)
    assert sum(r.applied for r in reports) <= 120


async def _true() -> bool:
    return True


async def test_a_flushed_cache_gets_its_counters_back_before_admitting(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    ledger = durable_ledger(client, config, usage_table)
    principal = config.principal_by_id("beta-k")  # beta: 1,000,000 output tokens a day
    assert principal is not None
    big = await ledger.admit(principal.scope, input_tokens=1, output_estimate=900_000)
    assert isinstance(big, Admitted)
    await ledger.settle(big.reservation, input_tokens=1, output_tokens=900_000)
    await run_rollup(config, client, usage_table)
    await flush(client)  # the operator's FLUSHALL: every counter gone
    # A fresh process (no memory of anything) after the flush.
    fresh = durable_ledger(client, config, usage_table)
    usage = await fresh.usage(principal.scope)
    out = next(r for r in usage.rows if r.budget.dimension.value == "output_tokens")
    assert out.used == 900_000
    # So the budget still holds: 100,000 are left, not 1,000,000.
    refused = await fresh.admit(principal.scope, input_tokens=1, output_estimate=200_000)
    assert isinstance(refused, Refused)
    fits = await fresh.admit(principal.scope, input_tokens=1, output_estimate=90_000)
    assert isinstance(fits, Admitted)


async def test_restore_also_counts_records_not_yet_rolled_up(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    """The counters alone are lost (the stream survived): the records after the cursor count."""
    ledger = durable_ledger(client, config, usage_table)
    await spend(ledger, config, "alpha-k", 3)
    await run_rollup(config, client, usage_table)
    after = await spend(ledger, config, "alpha-k", 2)  # not rolled up
    scope = config.tenant_scope("alpha")
    now_ms = ledger.server_now_ms()
    for window in config.hierarchy(scope.root).windows():
        bounds = window.bounds(now_ms)
        await client.delete(ledger.keys.used(scope, bounds.spec, bounds.id))
    await client.delete(ledger.keys.ledger(scope)[8])  # the restored marker
    usage = await durable_ledger(client, config, usage_table).usage(scope)
    total = next(r for r in usage.rows if r.budget.level.id == "alpha")
    first = [(10 + i, 20 + i) for i in range(3)]
    assert total.used == sum(i + o for i, o in first + after)


async def test_a_run_out_of_time_stops_cleanly_and_the_next_goes_on(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    ledger = Ledger(client)
    await spend(ledger, config, "alpha-k", 30)
    first = await run_rollup(config, client, usage_table, batch=10, budget_s=0)
    assert first.applied == 10 and any("out of time" in s for s in first.stalled)
    assert totals(usage_table, "alpha")["requests"] == 10
    # Its lease was released: the next run takes the stream at once and finishes it.
    assert (await run_rollup(config, client, usage_table, batch=10)).applied == 20
    assert totals(usage_table, "alpha")["requests"] == 30
