"""Threshold notifications: one event per threshold, per budget, per window, exactly once.

Each budget carries the percents of its limit it notifies at (``notify_at``, by default 50, 80
and 100; ``[]`` never). After a pass applies a hierarchy's records (and on an invocation's
first pass, for every hierarchy), the rollup reads what every budget of the hierarchy has used
(``usage.lua``: the counters admission checks, so settles not yet rolled up count too) — its
keys', tenants', org's, and the users' whose records the pass applied — and finds each
threshold reached in the current window.

Exactly once: a threshold is sent only by the run whose conditional put in the usage table
creates its item (``pk = notified#<root>``, ``sk = <budget field>#<window id>#<percent>``;
rollup/table.py). Two runs racing, or a pass finding the threshold again, fail the condition
and send nothing. A new window has a new id, so a window's reset re-arms every threshold by
construction. A claim whose send failed is given back, so the next pass sends it; a claim left
by a run that died between its put and its send is taken over after :data:`STALE_S` (the one
case that can send twice: the run died after its send and before marking it sent, so every
event carries ``event_id``, the same for each send of one notification, for consumers that
must deduplicate).

Why the rollup and not the settle: a settle runs in the hierarchy's cache slot and must not
wait on DynamoDB or EventBridge (the request's latency, and a Lua script cannot call out), and
a settle cannot know that a parallel settle of another instance crossed the same threshold
first without a second write in the script. The rollup already reads the counters, holds the
stream's lease and writes DynamoDB; the cost is latency: an event follows the settle that
crossed by at most one pass (:data:`hardcap_core.rollup.run.INTERVAL_S`, 5 s) plus the pass.

Budgets that span tenants (a route's, an upstream's: ledger/allowances.py) have no counter of
their own: each hierarchy charges its spend on one in its own window key, under the shared row's
field. When the rollup reads a hierarchy's counters it reads those fields too (one ``HMGET`` per
window, no work on the request's path) and keeps each hierarchy's figure; after the pass, a
shared budget's use is the sum over every hierarchy (:meth:`Notifications.check_shared`), its
thresholds are claimed under ``notified#route:<name>`` / ``notified#upstream:<name>`` the same
way. That sum is a lower bound of the spend at that instant, never more: the counters are what
admission checks, so settled spend counts whether or not its record is rolled up yet, but holds
in flight do not, and a hierarchy counts as of the pass that last read it (every hierarchy on an
invocation's first pass, then those with new records), so an event may lag by a pass.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from hardcap_core.budgets import (
    DIMENSION_BY_SHORT,
    NANO_USD_PER_USD,
    Budget,
    Dimension,
    Level,
    LevelKind,
    Scope,
    WindowBounds,
)
from hardcap_core.config import Config
from hardcap_core.errors import DurableStoreUnavailable, LedgerUnavailable
from hardcap_core.ledger import Ledger
from hardcap_core.ledger.allowances import SharedBudget
from hardcap_core.ledger.connection import guarded
from hardcap_core.ledger.replies import Usage
from hardcap_core.logs import logger
from hardcap_core.rollup.table import UsageTable

SOURCE = "hardcap"
DETAIL_TYPE = "Budget threshold crossed"
# A claim this old and not sent was left by a run that died: another run sends it.
STALE_S = 120
KEEP_S = 7 * 86400  # a notification's item is kept this long after its window ends
# Notifications known taken, kept by a long-lived runner so that a pass does not ask DynamoDB
# again for each threshold already sent; at most this many (then forgotten and asked again).
MEMORY = 100_000


@dataclass(frozen=True, slots=True)
class Notice:
    """One threshold of one budget reached in one window: a budget of ``root``'s hierarchy,
    or (``root`` None) a route's or upstream's over every hierarchy."""

    root: Level | None
    budget: Budget | SharedBudget
    window: WindowBounds
    threshold: int  # percent of the limit
    used: int  # tokens, or nano-USD
    at_ms: int  # server time it was read
    tenant: str | None  # the budget's tenant (None: an org's, a level above tenants, shared)

    @property
    def subject(self) -> str:
        """Whose notifications it is one of (``notified#<subject>``): the hierarchy's root
        tag, or ``route:<name>`` / ``upstream:<name>``."""
        if isinstance(self.budget, SharedBudget):
            return self.budget.owner
        if self.root is None:
            raise ValueError("a hierarchy's budget notifies under its root")
        return self.root.tag

    @property
    def sk(self) -> str:
        """Its sort key under ``notified#<subject>``: one item per threshold and window."""
        return f"{self.budget.field}#{self.window.id}#{self.threshold}"

    @property
    def event_id(self) -> str:
        return f"{self.subject}#{self.sk}"

    def detail(self) -> dict[str, Any]:
        """The event's detail: amounts in the budget's unit (tokens, or USD for cost)."""
        b = self.budget
        level: str
        if isinstance(b, SharedBudget):
            level, ident, dimension = b.kind, b.name, DIMENSION_BY_SHORT[b.dim]
        else:
            level, ident, dimension = b.level.kind.value, b.level.id, b.dimension
        usd = dimension is Dimension.COST_USD

        def amount(n: int) -> int | float:
            return n / NANO_USD_PER_USD if usd else n

        return {
            "event_id": self.event_id,
            "tenant": self.tenant,
            "level": level,
            "id": ident,
            "dimension": dimension.value,
            "window": b.window.spec,
            "window_id": self.window.id,
            "window_start": _iso(self.window.start_ms),
            "window_end": _iso(self.window.end_ms),
            "threshold": self.threshold,
            "used": amount(self.used),
            "limit": amount(b.limit),
            "percent": round(100 * self.used / b.limit, 2),
            "at": _iso(self.at_ms),
        }

    def envelope(self) -> dict[str, Any]:
        """The event as EventBridge delivers it to a target (what ``hardcap serve`` prints)."""
        return {"source": SOURCE, "detail-type": DETAIL_TYPE, "time": _iso(self.at_ms),
                "detail": self.detail()}  # fmt: skip


class Notifier(Protocol):
    """Where notifications go: EventBridge on AWS (rollup/eventbridge.py), stdout and a webhook
    locally (local/notify_local.py)."""

    async def send(self, notices: Sequence[Notice]) -> list[bool]:
        """Send ``notices``; per notice, whether it was delivered (never raises for a target
        that failed: a notice not delivered is sent again by the next pass)."""
        ...


def crossings(usage: Usage, root: Level, tenants: Mapping[Level, str | None]) -> list[Notice]:
    """Every threshold of every budget in ``usage`` reached in its current window."""
    now = usage.server_time_ms
    out: list[Notice] = []
    for row in usage.rows:
        b = row.budget
        if b.limit <= 0 or not b.notify_at:
            continue  # a zero limit refuses everything: there is no spend to notify about
        window = b.window.bounds(now)
        tenant = tenants.get(b.level)
        for pct in b.notify_at:
            if row.used * 100 >= pct * b.limit:
                out.append(Notice(root, b, window, pct, row.used, now, tenant))
    return out


def watched(
    config: Config, root: Level, users: Iterable[str] = ()
) -> tuple[Scope, dict[Level, str | None]]:
    """The scope of every budget under ``root`` (its keys', tenants', org's, and ``users``'
    from their tenant's template), and each level's tenant."""
    scope = config.hierarchy(root)
    budgets = list(scope.budgets)
    added: list[Level] = []
    tenants: dict[Level, str | None] = {}
    for p in config.keys.principals():
        tenants[Level(LevelKind.KEY, p.key_id)] = p.tenant_id
    for lv in scope.levels:
        if lv.kind is LevelKind.TENANT:
            tenants[lv] = lv.id
    for user_id in sorted(set(users)):
        tenant = user_id.split("~", 1)[0]
        template = config.user_template(tenant)
        base = config.tenant_scopes.get(tenant)
        if template is None or base is None or base.root != root:
            continue  # the tenant lost its users: template (or moved): nothing to watch
        user = Level(LevelKind.USER, user_id)
        added.append(user)
        budgets += [b for b in template.scope(base, user).budgets if b.level == user]
        tenants[user] = tenant
    # Users below the tenants, the root last (the hierarchy's order: key, user, tenant, org).
    at = next(
        i for i, lv in enumerate(scope.levels) if lv.kind in (LevelKind.TENANT, LevelKind.ORG)
    )
    levels = (*scope.levels[:at], *added, *scope.levels[at:])
    return Scope(levels, tuple(budgets)), tenants


def shared_watched(config: Config) -> list[SharedBudget]:
    """Every route's and upstream's budget that notifies (rates never do), once each."""
    rows: dict[str, SharedBudget] = {}
    for route in config.routes.values():
        for b in route.shared.budgets if route.shared else ():
            rows.setdefault(b.field, b)
    for upstream in config.upstreams.values():
        for b in upstream.shared:
            rows.setdefault(b.field, b)
    return [b for b in rows.values() if b.measure == b.dim and b.limit > 0 and b.notify_at]


async def shared_used(
    ledger: Ledger, root: Level, budgets: Sequence[SharedBudget], now_ms: int
) -> list[tuple[SharedBudget, WindowBounds, int]]:
    """What ``root``'s hierarchy spent on each of ``budgets`` in its window at ``now_ms``: the
    shared row's field in the hierarchy's own window key (0 where it spent nothing)."""
    by_window: dict[str, list[SharedBudget]] = {}
    for b in budgets:
        by_window.setdefault(b.window.spec, []).append(b)
    out: list[tuple[SharedBudget, WindowBounds, int]] = []
    for rows in by_window.values():
        bounds = rows[0].window.bounds(now_ms)
        key = ledger.keys.used_of(root.tag, bounds.spec, bounds.id)
        values = await guarded(ledger.client.hmget(key, [b.field for b in rows]))
        out += [(b, bounds, int(v or 0)) for b, v in zip(rows, values, strict=True)]
    return out


@dataclass(slots=True)
class SharedSpend:
    """One shared budget's window as the hierarchies read so far saw it."""

    window: WindowBounds
    by_root: dict[str, int]  # root tag -> what its hierarchy spent
    at_ms: int  # server time of the latest read


class Notifications:
    """The rollup's notifications through ``notifier``; kept across passes (and warm
    invocations), it remembers which notifications are taken so a pass asks DynamoDB only
    about thresholds newly reached."""

    def __init__(self, notifier: Notifier, owner: str) -> None:
        self.notifier = notifier
        self.owner = owner
        self._taken: dict[str, int] = {}  # subject # sk -> window end (ms)
        # (shared field, window id) -> each hierarchy's spend, as of its last read.
        self._shared: dict[tuple[str, str], SharedSpend] = {}
        self._now_ms = 0  # the latest server time read

    async def check(
        self, ledger: Ledger, table: UsageTable, config: Config, root: Level,
        users: Iterable[str] = (),
    ) -> int:  # fmt: skip
        """Send what ``root``'s hierarchy newly reached; how many were sent. Its part of each
        route's and upstream's budget is kept for :meth:`check_shared`. A cache or a table
        that fails is logged: the thresholds are still reached at the next pass."""
        try:
            return await self._check(ledger, table, config, root, users)
        except (LedgerUnavailable, DurableStoreUnavailable) as e:
            logger.warning("threshold notifications not checked; the next pass does",
                           extra={"root": root.tag, "error": str(e)})  # fmt: skip
            return 0

    async def _check(
        self, ledger: Ledger, table: UsageTable, config: Config, root: Level, users: Iterable[str]
    ) -> int:
        scope, tenants = watched(config, root, users)
        usage = await ledger.usage(scope)
        now = usage.server_time_ms
        self._now_ms = max(self._now_ms, now)
        self._forget(now)
        for b, window, used in await shared_used(ledger, root, shared_watched(config), now):
            spend = self._shared.setdefault((b.field, window.id), SharedSpend(window, {}, now))
            spend.by_root[root.tag] = used
            spend.at_ms = max(spend.at_ms, now)
        due = [n for n in crossings(usage, root, tenants) if n.event_id not in self._taken]
        return await self._deliver(table, due)

    async def check_shared(self, table: UsageTable, config: Config) -> int:
        """Send what the route and upstream budgets newly reached, summed over the
        hierarchies read so far (:meth:`check` reads them); how many were sent. Call it after
        a pass's checks: a sum taken midway would only be lower."""
        self._forget(self._now_ms)
        budgets = {b.field: b for b in shared_watched(config)}
        due: list[Notice] = []
        for (field, _), spend in self._shared.items():
            b = budgets.get(field)
            if b is None:
                continue  # no longer in the config, or it notifies never
            used = sum(spend.by_root.values())
            for pct in b.notify_at:
                if used * 100 >= pct * b.limit:
                    n = Notice(None, b, spend.window, pct, used, spend.at_ms, None)
                    if n.event_id not in self._taken:
                        due.append(n)
        try:
            return await self._deliver(table, due)
        except DurableStoreUnavailable as e:
            logger.warning("shared threshold notifications not checked; the next pass does",
                           extra={"error": str(e)})  # fmt: skip
            return 0

    async def _deliver(self, table: UsageTable, due: Sequence[Notice]) -> int:
        """Claim each of ``due``, send those claimed, mark them sent (or give the claims of
        those not delivered back); how many were sent."""
        if not due:
            return 0
        now_s = int(time.time())
        claimed: list[Notice] = []
        for n in due:
            expires = n.window.end_ms // 1000 + KEEP_S
            mine = await asyncio.to_thread(
                table.claim_notice, n.subject, n.sk, self.owner, now_s, STALE_S, expires
            )
            if mine:
                claimed.append(n)
            else:
                self._remember(n)  # another run has it (sent, or sending)
        if not claimed:
            return 0
        delivered = await self.notifier.send(claimed)
        sent = 0
        for n, ok in zip(claimed, delivered, strict=True):
            if ok:
                await asyncio.to_thread(table.notice_sent, n.subject, n.sk, self.owner)
                self._remember(n)
                sent += 1
            else:
                await asyncio.to_thread(table.release_notice, n.subject, n.sk, self.owner)
        return sent

    def _remember(self, n: Notice) -> None:
        if len(self._taken) >= MEMORY:
            self._taken.clear()
        self._taken[n.event_id] = n.window.end_ms

    def _forget(self, now_ms: int) -> None:
        """Drop what ended windows took: their thresholds cannot be reached again."""
        ended = [k for k, end in self._taken.items() if end <= now_ms]
        for k in ended:
            del self._taken[k]
        for at in [at for at, spend in self._shared.items() if spend.window.end_ms <= now_ms]:
            del self._shared[at]


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
