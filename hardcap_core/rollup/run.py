"""One rollup run: every hierarchy's new usage records into the durable ledger, exactly once.

Per hierarchy (the config names every root): charge the settles the cache missed, take the
stream's lease, claim what crashed runs left pending, read new entries, and apply them in id
order in transactions that also move the stream's cursor — a transaction whose cursor moved
meanwhile changes nothing — then acknowledge and trim what was applied. Entries at or before
the cursor were applied by a run that died before its acknowledgement: they are acknowledged
and not counted again. A run only ever applies the entries right after the cursor; if another
consumer holds some of them (a run whose lease ran out still working), it stops and leaves them
for the next run instead of skipping them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from hardcap_core.budgets import Level, LevelKind
from hardcap_core.config import Config
from hardcap_core.errors import LedgerUnavailable
from hardcap_core.ledger import Ledger
from hardcap_core.logs import logger
from hardcap_core.rollup.durable import replay_pending
from hardcap_core.rollup.metrics import RollupMetrics
from hardcap_core.rollup.records import UsageRecord, parse_entry
from hardcap_core.rollup.streams import Entry, UsageStream, entry_key
from hardcap_core.rollup.table import MAX_WRITES, Bucket, Totals, UsageTable

BATCH = 1000  # entries read per call
LEASE_S = 60.0  # a run holds a stream at most this long (the function's timeout is shorter)
# A run reads no new batch after this long, so it ends (acknowledged, lease released) inside
# the function's 55 s timeout; what is left waits for the next run a minute later.
BUDGET_S = 40.0


@dataclass(slots=True)
class RollupReport:
    applied: int = 0  # records written to the durable ledger
    streams: int = 0  # streams rolled up
    skipped_busy: int = 0  # streams another run held
    replayed: int = 0  # kept settles charged to the ledger
    lag_s: float = 0.0  # age of the oldest record not yet applied when the run began
    stalled: list[str] = field(default_factory=list)  # roots left for the next run, and why


@dataclass(slots=True)
class Chunk:
    """Records applied in one transaction, and their totals per bucket."""

    records: list[UsageRecord] = field(default_factory=list)
    totals: dict[Bucket, Totals] = field(default_factory=dict)
    tenants: set[str] = field(default_factory=set)

    def fits(self, r: UsageRecord) -> bool:
        new = sum(1 for g in "mhd" if Bucket.of(r, g) not in self.totals)
        return len(self.totals) + new + len(self.tenants | {r.tenant}) <= MAX_WRITES

    def add(self, r: UsageRecord) -> None:
        self.records.append(r)
        self.tenants.add(r.tenant)
        for g in "mhd":
            self.totals.setdefault(Bucket.of(r, g), Totals()).add(r)


def chunks(records: Sequence[UsageRecord]) -> Iterator[Chunk]:
    """``records`` in order, cut into transactions of at most :data:`MAX_WRITES` items."""
    chunk = Chunk()
    for r in records:
        if chunk.records and not chunk.fits(r):
            yield chunk
            chunk = Chunk()
        chunk.add(r)
    if chunk.records:
        yield chunk


async def run_rollup(
    config: Config,
    client: object,
    table: UsageTable,
    *,
    metrics: RollupMetrics | None = None,
    ledger: Ledger | None = None,
    batch: int = BATCH,
    budget_s: float = BUDGET_S,
) -> RollupReport:
    """Roll up every hierarchy the config names; ``client`` is the cache's redis client."""
    from hardcap_core.rollup.restore import durable_ledger

    ledger = ledger or durable_ledger(client, config, table)
    report = RollupReport()
    now_ms = int(time.time() * 1000)
    oldest: int | None = None
    deadline = time.monotonic() + budget_s
    for root in config.roots():
        report.replayed += await replay_pending(ledger, table, config, root)
        first = await _roll(ledger, table, root, report, metrics, batch, deadline)
        if first is not None:
            oldest = first if oldest is None else min(oldest, first)
    report.lag_s = 0.0 if oldest is None else max(now_ms - oldest, 0) / 1000
    if metrics is not None:
        await _budget_percents(ledger, config, metrics)
        metrics.add_run(report.lag_s, report.applied)
        metrics.flush()
    return report


async def _roll(
    ledger: Ledger,
    table: UsageTable,
    root: Level,
    report: RollupReport,
    metrics: RollupMetrics | None,
    batch: int,
    deadline: float,
) -> int | None:
    """Roll up one stream; returns the time of its oldest unapplied record at the start."""
    stream = UsageStream(ledger.client, ledger.scripts, ledger.keys, root)
    owner = f"run-{uuid.uuid4().hex[:12]}"
    if not await stream.lease(owner, int(LEASE_S * 1000)):
        report.skipped_busy += 1
        return None
    try:
        generation = await stream.generation()
        cursor = await asyncio.to_thread(table.cursor, root.tag, generation)
        head = await stream.entries_after(cursor, 1)
        oldest = entry_key(head[0][0])[0] if head else None
        pending = await stream.claim(owner, batch)
        while True:
            entries = sorted(
                pending + await stream.read_new(owner, batch), key=lambda e: entry_key(e[0])
            )
            pending = []
            if not entries:
                break
            seen = [
                i for i, _ in entries if cursor is not None and entry_key(i) <= entry_key(cursor)
            ]
            todo = [e for e in entries if cursor is None or entry_key(e[0]) > entry_key(cursor)]
            await stream.ack(seen)  # applied by a run that died before acknowledging them
            if todo and [i for i, _ in await stream.entries_after(cursor, len(todo))] != [
                i for i, _ in todo
            ]:
                report.stalled.append(f"{root.tag}: entries after the cursor held by another run")
                break
            applied = await _apply(table, root, generation, cursor, todo, metrics)
            if applied is None:
                report.stalled.append(f"{root.tag}: another run moved the cursor")
                break
            cursor, n = applied
            report.applied += n
            await stream.ack([i for i, _ in todo])
            if cursor is not None:
                await stream.trim(cursor)
            if time.monotonic() > deadline:
                report.stalled.append(f"{root.tag}: out of time; the next run goes on")
                break
        await stream.forget_consumers(owner, int(LEASE_S * 1000))
        report.streams += 1
        return oldest
    finally:
        await stream.release(owner)


async def _apply(
    table: UsageTable,
    root: Level,
    generation: str,
    cursor: str | None,
    entries: Sequence[Entry],
    metrics: RollupMetrics | None,
) -> tuple[str | None, int] | None:
    """Write ``entries`` (the ones right after ``cursor``), chunk by chunk; the new cursor and
    how many were written, or None if another run moved the cursor first."""
    records = [parse_entry(i, f) for i, f in entries]
    n = 0
    for chunk in chunks(records):
        last = chunk.records[-1].entry_id
        args = (root.tag, generation, cursor, last, chunk.totals, len(chunk.records))
        if not await asyncio.to_thread(table.apply, *args):
            return None
        # Metrics go out only for records this run wrote: never twice, lost if the run dies
        # right here (the durable ledger is the one of record).
        if metrics is not None:
            metrics.add_records(chunk.records)
        cursor, n = last, n + len(chunk.records)
    return cursor, n


async def _budget_percents(ledger: Ledger, config: Config, metrics: RollupMetrics) -> None:
    """Each tenant's fullest own budget, in percent of its limit, for the alarms."""
    for tenant, scope in config.tenant_scopes.items():
        try:
            usage = await ledger.usage(scope)
        except LedgerUnavailable as e:
            logger.warning("budget use not read", extra={"tenant": tenant, "error": str(e)})
            continue
        own = [r for r in usage.rows if r.budget.level.kind is LevelKind.TENANT and r.budget.limit]
        if own:
            metrics.add_budget_used(tenant, max(100 * r.used / r.budget.limit for r in own))
