"""The rollup: every hierarchy's new usage records into the durable ledger, exactly once.

One pass (:func:`run_rollup`), per hierarchy (the config names every root): take the stream's
lease, charge the settles the cache missed (first pass of an invocation only), read the
hierarchy's restore epoch and the stream's cursor, claim what crashed runs left pending, read
new entries, and apply them in id order in transactions that also move the cursor — a
transaction whose cursor moved meanwhile, or that a restore began after, changes nothing — then
acknowledge and trim what was applied. Entries at or before the cursor were applied by a run
that died before its acknowledgement: they are acknowledged and not counted again. A run only
ever applies the entries right after the cursor; if another consumer holds some of them (a run
whose lease ran out still working), it stops and leaves them for the next run.

A scheduled invocation runs passes every :data:`INTERVAL_S` for most of its minute while they
find work, and stops once none has for ``ROLLUP_LINGER_SECONDS`` (:func:`rollup_loop`): what a
cache that loses its data forgets is what it held since the last pass (docs/design.md, "Losing
the cache"). A pass over a stream with no entries costs one ``XLEN``.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from hardcap_core.budgets import Level, LevelKind
from hardcap_core.config import Config
from hardcap_core.config.settings import ROLLUP_INTERVAL_SECONDS, ROLLUP_LINGER_SECONDS
from hardcap_core.errors import DurableStoreUnavailable, HardcapError, LedgerUnavailable
from hardcap_core.ledger import Ledger
from hardcap_core.logs import logger
from hardcap_core.rollup.durable import replay_pending
from hardcap_core.rollup.metrics import RollupMetrics
from hardcap_core.rollup.notify import Notifications
from hardcap_core.rollup.records import UsageRecord, parse_entry
from hardcap_core.rollup.streams import LEASE_MS, Entry, StreamLost, UsageStream, entry_key
from hardcap_core.rollup.table import MAX_WRITES, Bucket, Totals, UsageTable, Write

BATCH = 1000  # entries read per call
# A pass reads no new batch after this long, so it ends (acknowledged, lease released) inside
# the function's timeout; what is left waits for the next pass.
BUDGET_S = 40.0
# Passes of one invocation start this often, until RESERVE_S before its timeout: a cache that
# loses its data forgets at most what arrived since the last pass (~5 s, ~11 s across the
# boundary between two invocations of the one-minute schedule). One source for it and for
# `hardcap serve`'s timer: config/settings.py.
INTERVAL_S = ROLLUP_INTERVAL_SECONDS
RESERVE_S = 6.0


@dataclass(slots=True)
class RollupReport:
    applied: int = 0  # records written to the durable ledger
    streams: int = 0  # streams rolled up
    skipped_busy: int = 0  # streams another run held
    replayed: int = 0  # kept settles charged to the ledger
    lag_s: float = 0.0  # age of the oldest record not yet applied when the run began
    stalled: list[str] = field(default_factory=list)  # roots left for the next run, and why
    passes: int = 1
    notified: int = 0  # threshold notifications sent (rollup/notify.py)

    @property
    def found_work(self) -> bool:
        """The pass had something to do, or left something for the next: the stream is live."""
        return bool(self.applied or self.replayed or self.skipped_busy or self.stalled)

    def add(self, other: RollupReport) -> None:
        """Fold a later pass of the same invocation in."""
        self.applied += other.applied
        self.streams += other.streams
        self.skipped_busy += other.skipped_busy
        self.replayed += other.replayed
        self.lag_s = max(self.lag_s, other.lag_s)
        self.stalled += other.stalled
        self.passes += other.passes
        self.notified += other.notified


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


async def paced_passes(
    one_pass: Callable[[bool, float], Awaitable[RollupReport | None]],
    *,
    interval_s: float,
    until: float = math.inf,
    full_every_s: float = math.inf,
    linger_s: float = math.inf,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    stopped: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.monotonic,
) -> RollupReport | None:
    """The rollup's cadence, the Lambda's invocation's and ``hardcap serve``'s timer's alike:
    ``one_pass(full, started)`` started every ``interval_s`` from the start of the one before
    (at once after one that ran longer), until the next would start at or past ``until``
    (``time.monotonic``) or ``stopped()`` is true after a ``sleep`` (which may return early).
    ``full`` for the first pass that goes through, and again once ``full_every_s`` passed
    since the last full one; a pass that failed returns None, so the next is full in its
    place. ``linger_s``: no pass starts once none has found work (:attr:`RollupReport.found_work`)
    for that long, counted from the start of the last that did (the first pass always runs; a
    failed one counts as work: the next retries). The reports added up (None: not one went
    through)."""
    total: RollupReport | None = None
    full_at = -math.inf  # when the last full pass that went through started
    work_at = -math.inf  # when the last pass that found work (or failed) started
    while not stopped():
        started = clock()
        full = total is None or started - full_at >= full_every_s
        report = await one_pass(full, started)
        if report is None or report.found_work:
            work_at = started
        if report is not None:
            full_at = started if full else full_at
            if total is None:
                total = report
            else:
                total.add(report)
        next_at = max(started + interval_s, clock())  # a long pass ran into it
        if next_at >= until or next_at - work_at > linger_s:
            break
        await sleep(next_at - clock())
    return total


async def rollup_loop(
    config: Config,
    client: object,
    table: UsageTable,
    *,
    until: float,
    interval_s: float | None = None,
    linger_s: float = ROLLUP_LINGER_SECONDS,
    metrics: RollupMetrics | None = None,
    ledger: Ledger | None = None,
    batch: int = BATCH,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    notifications: Notifications | None = None,
) -> RollupReport:
    """Passes of :func:`run_rollup` every ``interval_s`` (:data:`INTERVAL_S`) until ``until``
    (``time.monotonic``), as :func:`paced_passes` paces them: the first replays kept settles
    and reports budgets; none starts past ``until``, nor once ``linger_s`` passed without work
    (an idle invocation is one pass)."""
    from hardcap_core.rollup.restore import durable_ledger

    interval = INTERVAL_S if interval_s is None else interval_s
    durable = ledger or durable_ledger(client, config, table)
    owner = f"run-{uuid.uuid4().hex[:12]}"
    failed: HardcapError | None = None

    async def one_pass(full: bool, started: float) -> RollupReport | None:
        nonlocal failed
        try:
            return await run_rollup(config, client, table, metrics=metrics, ledger=durable,
                                    batch=batch, budget_s=max(until - started, 0),
                                    first_pass=full, owner=owner,
                                    notifications=notifications)  # fmt: skip
        except (DurableStoreUnavailable, LedgerUnavailable) as e:
            # As the next invocation would, the next pass tries again: the streams keep what
            # this one did not apply.
            logger.warning("rollup pass failed; the next one retries", extra={"error": str(e)})
            failed = e
            return None

    total = await paced_passes(one_pass, interval_s=interval, until=until, linger_s=linger_s,
                               sleep=sleep)  # fmt: skip
    if total is None and failed is not None:
        raise failed  # not one pass went through: the invocation failed
    return total or RollupReport(passes=0)


async def run_rollup(
    config: Config,
    client: object,
    table: UsageTable,
    *,
    metrics: RollupMetrics | None = None,
    ledger: Ledger | None = None,
    batch: int = BATCH,
    budget_s: float = BUDGET_S,
    first_pass: bool = True,
    owner: str | None = None,
    notifications: Notifications | None = None,
) -> RollupReport:
    """One pass over every hierarchy the config names; ``client`` is the cache's redis client.
    ``first_pass``: also charge kept settles and report each tenant's budget use (once an
    invocation); later passes leave streams without entries alone. ``notifications``: send
    the thresholds reached, in every hierarchy on a first pass, else in those it rolled up,
    then those of route and upstream budgets, summed over the hierarchies read."""
    from hardcap_core.rollup.restore import durable_ledger

    ledger = ledger or durable_ledger(client, config, table)
    owner = owner or f"run-{uuid.uuid4().hex[:12]}"
    report = RollupReport()
    now_ms = int(time.time() * 1000)
    oldest: int | None = None
    deadline = time.monotonic() + min(budget_s, BUDGET_S)
    # Roots this pass applied records of, with their users: whose thresholds to check.
    touched: dict[Level, set[str]] = {}
    for root in config.roots():
        stream = UsageStream(ledger.client, ledger.scripts, ledger.keys, root)
        if not first_pass and await stream.length() == 0:
            continue  # nothing to roll up, nothing pending: no lease, no DynamoDB call
        applied, users = report.applied, set[str]()
        first = await _leased(ledger, table, config, root, stream, report, metrics, batch,
                              deadline, owner, first_pass, users)  # fmt: skip
        if report.applied > applied:
            touched[root] = users
        if first is not None:
            oldest = first if oldest is None else min(oldest, first)
    report.lag_s = 0.0 if oldest is None else max(now_ms - oldest, 0) / 1000
    if notifications is not None:
        checked = [root for root in config.roots() if first_pass or root in touched]
        for root in checked:
            users = touched.get(root, set())
            report.notified += await notifications.check(ledger, table, config, root, users)
        if checked:  # route and upstream budgets: summed over the hierarchies just read
            report.notified += await notifications.check_shared(table, config)
    if metrics is not None:
        if first_pass:
            await _budget_percents(ledger, config, metrics)
        if first_pass or report.applied:
            metrics.add_run(report.lag_s, report.applied)
        metrics.flush()
    return report


async def _leased(
    ledger: Ledger,
    table: UsageTable,
    config: Config,
    root: Level,
    stream: UsageStream,
    report: RollupReport,
    metrics: RollupMetrics | None,
    batch: int,
    deadline: float,
    owner: str,
    replay: bool,
    users: set[str],
) -> int | None:
    """Roll up ``root``'s stream under its lease (kept settles first, if ``replay``); returns
    the time of its oldest unapplied record at the start."""
    if not await stream.lease(owner, LEASE_MS):
        report.skipped_busy += 1
        return None
    try:
        if replay:
            # Under the lease: two runs never charge the same kept settle at once (the cache's
            # settled marker alone would stop the second, but not across a lost cache).
            report.replayed += await replay_pending(ledger, table, config, root)
            if await stream.length() == 0:
                report.streams += 1
                return None
        oldest = await _roll(table, root, stream, report, metrics, batch, deadline, owner, users)
        report.streams += 1
        return oldest
    except StreamLost:
        report.stalled.append(f"{root.tag}: the cache lost the stream; the next run reads anew")
        return None
    finally:
        await stream.release(owner)


async def _roll(
    table: UsageTable,
    root: Level,
    stream: UsageStream,
    report: RollupReport,
    metrics: RollupMetrics | None,
    batch: int,
    deadline: float,
    owner: str,
    users: set[str],
) -> int | None:
    """Apply what ``stream`` holds after the cursor; the time of its oldest such record. The
    users of the records applied go into ``users``."""
    generation = await stream.generation()
    # The epoch, then the generation once more: a cache lost after that check is restored after
    # it, and the restore's fence stops every write below that could hold a later generation's
    # records; a cache lost before it ends the pass here.
    epoch = await asyncio.to_thread(table.epoch, root.tag)
    await stream.still_current()
    cursor = await asyncio.to_thread(table.cursor, root.tag, generation)
    head = await stream.entries_after(cursor, 1)
    oldest = entry_key(head[0][0])[0] if head else None
    pending = await stream.claim(owner, batch)
    last_used: dict[tuple[str, str], int] = {}  # (tenant, key id) -> latest record applied
    while True:
        entries = sorted(
            pending + await stream.read_new(owner, batch), key=lambda e: entry_key(e[0])
        )
        pending = []
        if not entries:
            break
        seen = [i for i, _ in entries if cursor is not None and entry_key(i) <= entry_key(cursor)]
        todo = [e for e in entries if cursor is None or entry_key(e[0]) > entry_key(cursor)]
        await stream.ack(seen)  # applied by a run that died before acknowledging them
        if todo and [i for i, _ in await stream.entries_after(cursor, len(todo))] != [
            i for i, _ in todo
        ]:
            report.stalled.append(f"{root.tag}: entries after the cursor held by another run")
            break
        write, cursor, n = await _apply(
            table, root, generation, epoch, cursor, todo, metrics, last_used, users
        )
        report.applied += n
        if write is Write.FENCED:
            report.stalled.append(f"{root.tag}: a restore began after this run; the next goes on")
            break
        if write is Write.MOVED:
            report.stalled.append(f"{root.tag}: another run moved the cursor")
            break
        await stream.ack([i for i, _ in todo])
        if time.monotonic() > deadline:
            report.stalled.append(f"{root.tag}: out of time; the next run goes on")
            break
    if cursor is not None:
        await stream.trim(cursor)
    await stream.forget_consumers(owner, LEASE_MS)
    await _touch_last_used(table, last_used)
    return oldest


async def _touch_last_used(table: UsageTable, last_used: dict[tuple[str, str], int]) -> None:
    """One write per key per pass (not per record): when each key was last used."""
    for (tenant, key_id), at_ms in sorted(last_used.items()):
        try:
            await asyncio.to_thread(table.touch_last_used, tenant, key_id, at_ms)
        except DurableStoreUnavailable as e:
            # The usage itself is written; only `keys list`'s last use is late (the next pass
            # that applies a record of the key writes it).
            logger.warning("last use not written", extra={"key_id": key_id, "error": str(e)})


async def _apply(
    table: UsageTable,
    root: Level,
    generation: str,
    epoch: int,
    cursor: str | None,
    entries: Sequence[Entry],
    metrics: RollupMetrics | None,
    last_used: dict[tuple[str, str], int] | None = None,
    users: set[str] | None = None,
) -> tuple[Write, str | None, int]:
    """Write ``entries`` (the ones right after ``cursor``), chunk by chunk, while the epoch is
    ``epoch``: how the last write went, the new cursor and how many were written. The latest
    record of each key written goes into ``last_used``, the users of those charged into
    ``users``."""
    records = [parse_entry(i, f) for i, f in entries]
    n = 0
    for chunk in chunks(records):
        last = chunk.records[-1].entry_id
        args = (root.tag, generation, cursor, last, chunk.totals, len(chunk.records), epoch)
        write = await asyncio.to_thread(table.apply, *args)
        if write is not Write.APPLIED:
            return write, cursor, n
        # Metrics go out for each write as soon as it is made: never twice (only this run wrote
        # these records), and a run that dies next loses at most this write's.
        if metrics is not None:
            metrics.add_records(chunk.records)
            metrics.flush()
        if last_used is not None:
            for r in chunk.records:
                if r.key_id:
                    who = (r.tenant, r.key_id)
                    last_used[who] = max(last_used.get(who, 0), r.at_ms)
        if users is not None:
            users.update(r.user for r in chunk.records if r.user and not r.refused)
        cursor, n = last, n + len(chunk.records)
    return Write.APPLIED, cursor, n


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
