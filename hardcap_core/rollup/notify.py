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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from hardcap_core.budgets import (
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
    """One threshold of one budget reached in one window."""

    root: Level
    budget: Budget
    window: WindowBounds
    threshold: int  # percent of the limit
    used: int  # tokens, or nano-USD
    at_ms: int  # server time it was read
    tenant: str | None  # the budget's tenant (None: an org's, or a level above tenants)

    @property
    def sk(self) -> str:
        """Its sort key under ``notified#<root>``: one item per threshold and window."""
        return f"{self.budget.field}#{self.window.id}#{self.threshold}"

    @property
    def event_id(self) -> str:
        return f"{self.root.tag}#{self.sk}"

    def detail(self) -> dict[str, Any]:
        """The event's detail: amounts in the budget's unit (tokens, or USD for cost)."""
        b = self.budget
        usd = b.dimension is Dimension.COST_USD

        def amount(n: int) -> int | float:
            return n / NANO_USD_PER_USD if usd else n

        return {
            "event_id": self.event_id,
            "tenant": self.tenant,
            "level": b.level.kind.value,
            "id": b.level.id,
            "dimension": b.dimension.value,
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


class Notifications:
    """The rollup's notifications through ``notifier``; kept across passes (and warm
    invocations), it remembers which notifications are taken so a pass asks DynamoDB only
    about thresholds newly reached."""

    def __init__(self, notifier: Notifier, owner: str) -> None:
        self.notifier = notifier
        self.owner = owner
        self._taken: dict[str, int] = {}  # root tag # sk -> window end (ms)

    async def check(
        self, ledger: Ledger, table: UsageTable, config: Config, root: Level,
        users: Iterable[str] = (),
    ) -> int:  # fmt: skip
        """Send what ``root``'s hierarchy newly reached; how many were sent. A cache or a
        table that fails is logged: the thresholds are still reached at the next pass."""
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
        self._forget(usage.server_time_ms)
        due = [n for n in crossings(usage, root, tenants) if n.event_id not in self._taken]
        if not due:
            return 0
        now_s = int(time.time())
        claimed: list[Notice] = []
        for n in due:
            expires = n.window.end_ms // 1000 + KEEP_S
            mine = await asyncio.to_thread(
                table.claim_notice, root.tag, n.sk, self.owner, now_s, STALE_S, expires
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
                await asyncio.to_thread(table.notice_sent, root.tag, n.sk, self.owner)
                self._remember(n)
                sent += 1
            else:
                await asyncio.to_thread(table.release_notice, root.tag, n.sk, self.owner)
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


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
