"""Counters back from the durable ledger after the cache lost them.

What a hierarchy used in each current window is the sum of three things: the usage totals in
DynamoDB (everything rolled up), the records still in the cache's stream after the rollup's
cursor (if the stream survived), and settles kept in DynamoDB because the cache missed them
(charged through the ledger right after the restore, under the stream's lease, so they are not
counted here). What is lost is what the cache held and nobody rolled up: the records since the
rollup's last pass (docs/design.md, "Losing the cache").

Before it reads, a restore moves the hierarchy's epoch on (:meth:`UsageTable.fence`): a rollup
run that began before writes nothing after that, so DynamoDB holds afterwards exactly what the
restore read plus what runs that began later apply — and those apply only records the restored
counters do not hold yet (the stream after the cursor the restore read, or records written
after the restore). The totals and that cursor are read until the cursor is the same before and
after: no write landed in between.

User levels (``<tenant>~<user>``) are made on first use, so the config does not list them: the
users restored are those the durable ledger's rows and the unrolled records name within their
tenant's ``users:`` template's windows, each given the template's budgets. A user with nothing
spent in a window of the template has nothing to restore for it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from typing import Any

from hardcap_core.budgets import USER_ID_PATTERN, Budget, Dimension, Level, LevelKind, Scope
from hardcap_core.config import Config
from hardcap_core.config.model import UserTemplate
from hardcap_core.errors import LedgerUnavailable
from hardcap_core.ledger import Ledger
from hardcap_core.ledger.restore import Restore
from hardcap_core.rollup.durable import replay_pending
from hardcap_core.rollup.records import UsageRecord, parse_entry
from hardcap_core.rollup.streams import LEASE_MS, UsageStream
from hardcap_core.rollup.table import UsageRow, UsageTable

# Reads of the totals and the cursor until no rollup write landed between them (one only moves
# the cursor while a stream that survived a partial loss is rolled up: seldom, and finitely).
SNAPSHOT_ATTEMPTS = 10
RESTORE = "restore-"  # how a restore's lease owner begins
# A rollup pass holds the lease for milliseconds to seconds: a restore waits this long for it
# (a pass of a running invocation does not charge kept settles; its first pass a minute on does).
LEASE_WAIT_S = 0.05
LEASE_TRIES = 40


class DurableCounters:
    """A :class:`~hardcap_core.ledger.restore.CounterSource` reading DynamoDB."""

    def __init__(self, config: Config, table: UsageTable, client: Any) -> None:
        self.config = config
        self.table = table
        self.client = client
        self.ledger: Ledger | None = None  # set by :func:`durable_ledger`

    async def used(self, scope: Scope, now_ms: int) -> Restore:
        whole = self.config.hierarchy(scope.root)
        tenants = sorted({lv.id for lv in whole.levels if lv.kind is LevelKind.TENANT})
        templates = {t: u for t in tenants if (u := self.config.user_template(t)) is not None}
        windows = {w.spec: w for w in whole.windows()}
        for template in templates.values():
            windows.update((w.spec, w) for _, _, w in template.budgets)
        await asyncio.to_thread(self.table.fence, whole.root.tag)
        for _ in range(SNAPSHOT_ATTEMPTS):
            generation, before = await self._cursor(whole)
            unrolled = await self._unrolled(whole, generation, before)
            spent: dict[str, tuple[list[UsageRow], list[UsageRecord]]] = {}
            for spec, window in windows.items():
                start = window.bounds(now_ms).start_ms
                rows = await asyncio.to_thread(self.table.usage, tenants, start, now_ms)
                spent[spec] = rows, [r for r in unrolled if r.at_ms >= start]
            full = _with_users(whole, templates, spent)
            used = {
                b.field: _sum(b, spent[b.window.spec][0]) + _sum_records(b, spent[b.window.spec][1])
                for b in full.budgets
            }
            if await self._cursor(whole) == (generation, before):
                return Restore(full, used, f"dynamodb:{self.table.name}")
        raise LedgerUnavailable("the rollup kept moving while the counters were read back")

    async def restored(self, scope: Scope) -> None:
        """Charge the settles kept for the hierarchy, under its stream's lease. Another restore
        holding it charges them; a rollup pass holding it is waited for (up to ~2 s)."""
        if self.ledger is None:
            return
        stream = UsageStream(self.client, self.ledger.scripts, self.ledger.keys, scope.root)
        owner = f"{RESTORE}{uuid.uuid4().hex[:12]}"
        for _ in range(LEASE_TRIES):
            if await stream.lease(owner, LEASE_MS):
                try:
                    await replay_pending(self.ledger, self.table, self.config, scope.root)
                finally:
                    await stream.release(owner)
                return
            holder = await stream.holder()
            if holder is not None and holder.startswith(RESTORE):
                return
            await asyncio.sleep(LEASE_WAIT_S)

    async def _cursor(self, whole: Scope) -> tuple[str | None, str | None]:
        """The stream's generation in the cache and the last entry of it the rollup applied."""
        if self.ledger is None:
            return None, None
        stream = UsageStream(self.client, self.ledger.scripts, self.ledger.keys, whole.root)
        generation = await stream.current_generation()
        if generation is None:
            return None, None
        return generation, await asyncio.to_thread(self.table.cursor, whole.root.tag, generation)

    async def _unrolled(
        self, whole: Scope, generation: str | None, cursor: str | None
    ) -> list[UsageRecord]:
        """Records still in the cache's stream that the durable ledger has not applied."""
        if self.ledger is None or generation is None:
            return []
        stream = UsageStream(self.client, self.ledger.scripts, self.ledger.keys, whole.root)
        return [parse_entry(i, f) for i, f in await stream.entries_after(cursor)]


def durable_ledger(client: Any, config: Config, table: UsageTable, **kwargs: Any) -> Ledger:
    """A ledger whose lost counters come back from ``table``."""
    counters = DurableCounters(config, table, client)
    ledger = Ledger(client, counters=counters, **kwargs)
    counters.ledger = ledger
    return ledger


def _with_users(
    whole: Scope,
    templates: dict[str, UserTemplate],
    spent: dict[str, tuple[list[UsageRow], list[UsageRecord]]],
) -> Scope:
    """``whole`` and, for every user with spend in a window of its tenant's template, a user
    level with the template's budgets."""
    users: set[tuple[str, str]] = set()
    for tenant, template in templates.items():
        for _, _, window in template.budgets:
            rows, records = spent[window.spec]
            named = [(r.tenant, r.user) for r in rows]
            named += [(r.tenant, r.user) for r in records if not r.refused]
            # The gateway names a user by its level id, which begins with the tenant's, so one
            # that does not (or does not match the pattern) never had a counter to restore.
            users.update(
                (tenant, u)
                for t, u in named
                if t == tenant and u.startswith(f"{tenant}~") and USER_ID_PATTERN.match(u)
            )
    if not users:
        return whole
    added = [(Level(LevelKind.USER, u), templates[t]) for t, u in sorted(users)]
    budgets = [Budget(lv, d, limit, w) for lv, t in added for d, limit, w in t.budgets]
    # Levels in the hierarchy's order: keys, users, tenants, root.
    at = next(i for i, lv in enumerate(whole.levels) if lv.kind is not LevelKind.KEY)
    return Scope(
        (*whole.levels[:at], *(lv for lv, _ in added), *whole.levels[at:]),
        (*whole.budgets, *budgets),
        whole.rate_limits,
    )


def _matches(b: Budget, tenant: str, org: str, key_id: str, user: str) -> bool:
    level = b.level
    if level.kind is LevelKind.KEY:
        return key_id == level.id
    if level.kind is LevelKind.USER:
        return user == level.id
    if level.kind is LevelKind.TENANT:
        return tenant == level.id
    return org == level.id


def _amount(b: Budget, inp: int, out: int, cost: int) -> int:
    return {
        Dimension.INPUT_TOKENS: inp,
        Dimension.OUTPUT_TOKENS: out,
        Dimension.TOTAL_TOKENS: inp + out,
        Dimension.COST_USD: cost,
    }[b.dimension]


def _sum(b: Budget, rows: Iterable[UsageRow]) -> int:
    return sum(
        _amount(b, r.input_tokens, r.output_tokens, r.cost_nusd)
        for r in rows
        if _matches(b, r.tenant, r.org, r.key_id, r.user)
    )


def _sum_records(b: Budget, records: Iterable[UsageRecord]) -> int:
    return sum(
        _amount(b, r.input_tokens, r.output_tokens, r.cost_nusd)
        for r in records
        if not r.refused and _matches(b, r.tenant, r.org, r.key_id, r.user)
    )
