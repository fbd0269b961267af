"""The rollup across a lost cache, with its DynamoDB calls delayed, on a real Valkey (standalone
and cluster) and moto's DynamoDB: nothing is counted twice, a write held past a restore changes
nothing, the ledger and DynamoDB agree once the restore and the runs in flight are done, kept
settles are charged under the stream's lease, and metrics go out per applied write."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from hardcap_core.budgets import Dimension, LevelKind
from hardcap_core.config import Config, parse_config
from hardcap_core.errors import DurableStoreUnavailable
from hardcap_core.ledger import Admitted, Ledger, ReservationMeta, SettleNote
from hardcap_core.local.aws import OneCallAtATime
from hardcap_core.rollup import run as run_module
from hardcap_core.rollup.durable import DurableSettles
from hardcap_core.rollup.metrics import RollupMetrics
from hardcap_core.rollup.records import parse_entry
from hardcap_core.rollup.restore import durable_ledger
from hardcap_core.rollup.run import RollupReport, chunks, rollup_loop, run_rollup
from hardcap_core.rollup.streams import UsageStream
from hardcap_core.rollup.table import UsageTable, Write, create_table
from tests.conftest import flush
from tests.functional.test_rollup import PRICES, spend, totals
from tests.stack import config_data

TABLE = "usage"


class Held:
    """A DynamoDB client whose ``nth`` call of ``operation`` waits until :attr:`release` is
    set, as a request delayed on the wire (or a run frozen mid-call) would; other calls, and
    other clients of the same table, go on meanwhile."""

    def __init__(self, client: Any, operation: str, nth: int = 1) -> None:
        self._client, self.operation, self.nth = client, operation, nth
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if name != self.operation:
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.nth:
                self.entered.set()
                assert self.release.wait(30), "never released"
            return method(*args, **kwargs)

        return call

    async def reached(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 30), f"{self.operation} never called"


@pytest.fixture
def moto() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        create_table(client, TABLE)
        yield OneCallAtATime(client)


@pytest.fixture
def table(moto: Any) -> UsageTable:
    return UsageTable(moto, TABLE)


@pytest.fixture
def config(backend: tuple[str, bool]) -> Config:
    return parse_config(config_data("http://127.0.0.1:9", backend[0]))


def tokens(table: UsageTable, tenant: str) -> int:
    t = totals(table, tenant)
    return t["input_tokens"] + t["output_tokens"]


async def ledger_used(ledger: Ledger, config: Config, tenant: str) -> int:
    """What the cache's ledger says the tenant used of its daily total-token budget."""
    usage = await ledger.usage(config.tenant_scope(tenant))
    (row,) = [
        r for r in usage.rows
        if r.budget.level.kind is LevelKind.TENANT and r.budget.level.id == tenant
        and r.budget.dimension is Dimension.TOTAL_TOKENS
    ]  # fmt: skip
    return row.used


def started(coro: Any) -> asyncio.Task[RollupReport]:
    return asyncio.get_running_loop().create_task(coro)


async def test_a_run_in_flight_at_a_flush_counts_nothing_twice(
    client: Any, config: Config, table: UsageTable, moto: Any
) -> None:
    """Run A reads the stream's generation, then its first DynamoDB read is held; the cache is
    flushed, a gateway restores the hierarchy and spends again, run B of the new generation
    reads those records and its write is held; A goes on, then B. Before, A claimed B's records
    through the one group name both generations had and applied them under its own
    generation's cursor while B applied them under the new one: 4 records counted 8 times."""
    gateway = durable_ledger(client, config, table)
    await spend(gateway, config, "alpha-k", 3)
    assert (await run_rollup(config, client, table)).applied == 3
    await spend(gateway, config, "alpha-k", 2)  # in the cache only: lost with it
    held_a = Held(moto, "get_item")
    a = started(run_rollup(config, client, UsageTable(held_a, TABLE), ledger=Ledger(client)))
    await held_a.reached()
    await flush(client)
    fresh = durable_ledger(client, config, table)  # a gateway that never saw the cache before
    after = await spend(fresh, config, "alpha-k", 4)
    held_b = Held(moto, "transact_write_items")
    b = started(run_rollup(config, client, UsageTable(held_b, TABLE), ledger=Ledger(client)))
    await held_b.reached()
    held_a.release.set()
    report_a = await a
    held_b.release.set()
    report_b = await b
    await run_rollup(config, client, table)
    assert report_a.applied == 0 and report_b.applied == 4
    assert totals(table, "alpha")["requests"] == 3 + 4
    first = sum(i + o for i, o in [(10 + i, 20 + i) for i in range(3)])
    assert tokens(table, "alpha") == first + sum(i + o for i, o in after)
    assert await ledger_used(fresh, config, "alpha") == tokens(table, "alpha")


async def test_a_write_held_past_the_restore_changes_nothing(
    client: Any, config: Config, table: UsageTable, moto: Any
) -> None:
    """A run's write of records the flush took is delayed until a gateway has restored the
    counters without them. Before, it landed: DynamoDB counted the records and the ledger never
    did, for good. Now the restore's epoch fences it: the two agree (the records are the gap)."""
    gateway = durable_ledger(client, config, table)
    await spend(gateway, config, "alpha-k", 3)
    held = Held(moto, "transact_write_items")
    a = started(run_rollup(config, client, UsageTable(held, TABLE), ledger=Ledger(client)))
    await held.reached()
    await flush(client)
    fresh = durable_ledger(client, config, table)
    after = await spend(fresh, config, "alpha-k", 2)
    held.release.set()
    report = await a
    assert report.applied == 0 and any("restore" in s for s in report.stalled)
    await run_rollup(config, client, table)
    assert tokens(table, "alpha") == sum(i + o for i, o in after)
    assert await ledger_used(fresh, config, "alpha") == tokens(table, "alpha")


async def test_kept_settles_are_charged_under_the_lease(
    client: Any, config: Config, table: UsageTable
) -> None:
    """A run that cannot take the stream's lease leaves the kept settles to the one holding it
    (before, every run charged them before taking the lease)."""
    ledger = durable_ledger(client, config, table)
    principal = config.principal_by_id("alpha-k")
    assert principal is not None
    meta = ReservationMeta("small", "mock-small", "alpha-k", "rq-kept", provider="mock")
    admitted = await ledger.admit(principal.scope, input_tokens=10, output_estimate=25,
                                  prices=PRICES, meta=meta)  # fmt: skip
    assert isinstance(admitted, Admitted)
    kept = DurableSettles(table)
    assert await kept.keep(admitted.reservation, 10, 20, SettleNote())
    root = principal.scope.root
    await client.set(ledger.keys.rollup_lease(root), "another-run", px=60_000)
    busy = await run_rollup(config, client, table)
    assert busy.replayed == 0 and busy.skipped_busy >= 1
    assert len(table.pending(root.tag)) == 1
    await client.delete(ledger.keys.rollup_lease(root))
    done = await run_rollup(config, client, table)
    assert done.replayed == 1 and done.applied == 1 and table.pending(root.tag) == []
    assert tokens(table, "alpha") == 30 == await ledger_used(ledger, config, "alpha")


def emf(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"_aws"')]


def emitted(blobs: list[dict[str, Any]], tenant: str, metric: str) -> float:
    """The sum of ``metric`` over the tenant's own objects (EMF values are lists)."""
    return sum(
        sum(b[metric])
        for b in blobs
        if b.get("Tenant") == tenant and metric in b and "Model" not in b
    )


async def test_a_run_that_dies_between_write_and_ack_has_sent_its_metrics(
    client: Any,
    config: Config,
    table: UsageTable,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before, metrics went out at the end of a run: one that died after its write lost them
    all (and the records, applied, are never applied, or reported, again)."""
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    ledger = Ledger(client)
    await spend(ledger, config, "alpha-k", 4)

    async def die(self: UsageStream, ids: Any) -> None:
        if ids:
            raise SystemExit("killed after the DynamoDB write, before XACK")

    with monkeypatch.context() as m:
        m.setattr(UsageStream, "ack", die)
        m.setattr(UsageStream, "release", lambda self, owner: asyncio.sleep(0))  # kept, as dead
        with pytest.raises(SystemExit):
            await run_rollup(config, client, table, metrics=RollupMetrics())
    blobs = emf(capsys.readouterr().out)
    assert emitted(blobs, "alpha", "Requests") == 4
    assert emitted(blobs, "alpha", "OutputTokens") == sum(20 + i for i in range(4))
    await client.delete(ledger.keys.rollup_lease(config.tenant_scope("alpha").root))
    again = await run_rollup(config, client, table, metrics=RollupMetrics())
    assert again.applied == 0
    assert emitted(emf(capsys.readouterr().out), "alpha", "Requests") == 0  # never twice
    assert totals(table, "alpha")["requests"] == 4


async def test_metrics_go_out_per_write_when_a_run_fails_mid_batch(
    client: Any,
    config: Config,
    table: UsageTable,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    ledger = Ledger(client)
    await spend(ledger, config, "alpha-k", 3)
    await spend(ledger, config, "beta-k", 2)  # same hierarchy, other buckets: a second write
    monkeypatch.setattr(run_module, "MAX_WRITES", 4)
    real, writes = UsageTable.apply, []

    def second_fails(self: UsageTable, *args: Any) -> Any:
        writes.append(args)
        if len(writes) == 2:
            raise DurableStoreUnavailable("DynamoDB went away")
        return real(self, *args)

    monkeypatch.setattr(UsageTable, "apply", second_fails)
    with pytest.raises(DurableStoreUnavailable):
        await run_rollup(config, client, table, metrics=RollupMetrics())
    blobs = emf(capsys.readouterr().out)
    assert emitted(blobs, "alpha", "Requests") == 3 and emitted(blobs, "beta", "Requests") == 0


async def test_passes_every_few_seconds_apply_what_arrives_between_them(
    client: Any, config: Config, table: UsageTable, moto: Any
) -> None:
    """A scheduled invocation rolls up in passes until its deadline; a pass over a stream
    without entries takes no lease and calls no DynamoDB."""
    ledger = Ledger(client)
    await spend(ledger, config, "alpha-k", 1)
    counting = Held(moto, "get_item", nth=0)  # holds nothing: counts the reads
    reads: list[int] = []  # DynamoDB reads made by the end of each pass

    async def sleep(s: float) -> None:
        reads.append(counting.calls)
        if len(reads) == 2:
            await spend(ledger, config, "alpha-k", 2)  # arrives between the 2nd and 3rd pass
        await asyncio.sleep(s)

    gateway = durable_ledger(client, config, table)
    until = time.monotonic() + 2.5
    table_ = UsageTable(counting, TABLE)
    report = await rollup_loop(
        config, client, table_, until=until, interval_s=0.25, ledger=gateway, sleep=sleep
    )
    assert report.passes >= 4 and report.applied == 3
    assert totals(table, "alpha")["requests"] == 3
    assert reads[0] > 0 and reads[1] == reads[0]  # the 2nd pass found the stream empty
    assert reads[2] > reads[1]


async def test_an_idle_invocation_ends_after_one_pass(
    client: Any, config: Config, table: UsageTable
) -> None:
    """Nothing to roll up: the scheduled invocation makes one pass and returns, instead of
    passing over empty streams until its deadline (the idle stack's largest line)."""
    report = await rollup_loop(config, client, table, until=time.monotonic() + 30, interval_s=0.2)
    assert (report.passes, report.applied) == (1, 0)


async def test_a_failed_pass_leaves_the_rest_of_the_invocation_to_the_next(
    client: Any, config: Config, table: UsageTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DynamoDB refuses a pass's write: the next pass, seconds later, applies the records
    (before, the invocation ended there and the records waited a minute)."""
    await spend(Ledger(client), config, "alpha-k", 2)
    real, writes = UsageTable.apply, []

    def first_fails(self: UsageTable, *args: Any) -> Any:
        writes.append(args)
        if len(writes) == 1:
            raise DurableStoreUnavailable("DynamoDB throttled")
        return real(self, *args)

    monkeypatch.setattr(UsageTable, "apply", first_fails)
    until = time.monotonic() + 1.0
    report = await rollup_loop(config, client, table, until=until, interval_s=0.2)
    assert report.applied == 2 and report.passes >= 2
    assert totals(table, "alpha")["requests"] == 2


async def test_a_stream_an_older_rollup_read_is_taken_over_by_its_generations_group(
    client: Any, config: Config, table: UsageTable
) -> None:
    """A deploy: the stream has a generation and the one ``rollup`` group of older versions,
    whose run applied two of the three entries it read and died before acknowledging them. The
    new rollup reads through its generation's group (the old one goes) and applies the rest,
    once."""
    ledger = Ledger(client)
    await spend(ledger, config, "alpha-k", 3)
    root = config.tenant_scope("alpha").root
    key, generation = ledger.keys.usage_stream(root), "0123456789abcdef0123456789abcdef"
    await client.set(ledger.keys.stream_generation(root), generation)
    await client.xgroup_create(key, "rollup", id="0")
    read = await client.xreadgroup("rollup", "run-old", {key: ">"})
    entries = read[key.encode()][0] if isinstance(read, dict) else read[0][1]
    (chunk,) = chunks([parse_entry(i, f) for i, f in entries[:2]])
    last = chunk.records[-1].entry_id
    assert table.apply(root.tag, generation, None, last, chunk.totals, 2) is Write.APPLIED
    await spend(ledger, config, "alpha-k", 2)
    report = await run_rollup(config, client, table)
    assert report.applied == 3 and report.stalled == []
    assert totals(table, "alpha")["requests"] == 5
    groups = [g["name"] for g in await client.xinfo_groups(key)]
    assert groups == [f"rollup:{generation}".encode()]
