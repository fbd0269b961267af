"""What the ledger scripts are sent for one scope, worked out once and reused on every call.

A scope's key names, its budget rows, rate limits and level tags never change; its windows'
bounds change only when a window ends. Building them for every call (window bounds from
``datetime``, key names, a ``json.dumps`` of the whole spec) cost the client more CPU than
redis-py's own work on the call. A :class:`ScopePlan` holds them, pre-encoded as JSON (with
:func:`.contract.dumps`, handed to :func:`.contract.encode` as its ``raw`` members), and the
bounds of the windows current at the last call, reused while the server-time guess stays inside
them (so the result is exactly what building them again would give).
"""

from __future__ import annotations

from typing import Any

from hardcap_core.budgets import Scope, Window, WindowBounds
from hardcap_core.ledger.allowances import SharedLimits
from hardcap_core.ledger.contract import dumps
from hardcap_core.ledger.keys import Keyspace, org_of, tenant_of
from hardcap_core.ledger.limits import MAX_PLANS
from hardcap_core.ledger.replies import ReservationMeta


class ScopePlan:
    """Keys and pre-encoded spec parts of one scope (``lua/lib.lua``: a budget spec row, a
    window row)."""

    __slots__ = (
        "_bounds",
        "_keys",
        "_used_keys",
        "_windows",
        "_windows_json",
        "config_key",
        "ledger_keys",
        "levels",
        "levels_json",
        "no_meta",
        "org",
        "queue_keys",
        "rates_json",
        "rows_json",
        "scope",
        "settled_prefix",
        "shared",
        "tenant",
    )  # fmt: skip

    def __init__(self, scope: Scope, keys: Keyspace, shared: SharedLimits | None = None) -> None:
        self.scope = scope
        # Rows of limits spanning tenants (a route's, its upstream's) after the scope's own,
        # flagged shared (lib.lua: limits_of): checked against this hierarchy's allowances.
        self.shared = shared
        self._keys = keys
        self.ledger_keys = keys.ledger(scope)
        self.settled_prefix = keys.settled(scope, "")
        self.queue_keys = keys.queue(scope)
        self.config_key = keys.config_version(scope.root.tag)
        self._windows = shared_windows(scope, shared)
        index = {w.spec: i + 1 for i, w in enumerate(self._windows)}
        self.rows_json = dumps(
            [[b.field, b.dimension.short, b.limit, index[b.window.spec]] for b in scope.budgets]
            + shared_rows(shared, index)
        )
        self.rates_json = dumps(
            [
                [r.level.tag, r.requests_per_minute or 0, r.tokens_per_minute or 0]
                for r in scope.rate_limits
            ]
        )
        self.levels = [level.tag for level in scope.levels]
        self.levels_json = dumps(self.levels)
        # What a reservation's meta is filled with where it names no tenant or org.
        self.tenant, self.org = tenant_of(scope) or "", org_of(scope) or ""
        self.no_meta = ReservationMeta(tenant=self.tenant, org=self.org)
        self._bounds: tuple[WindowBounds, ...] = ()
        self._used_keys: list[str] = []
        self._windows_json = "[]"

    def current(self, now_ms: int) -> tuple[list[str], str]:
        """The used keys and the JSON window rows of the scope's windows containing ``now_ms``."""
        for b in self._bounds:
            if not b.start_ms <= now_ms < b.end_ms:
                break
        else:
            if self._bounds or not self._windows:
                return self._used_keys, self._windows_json
        bounds = tuple(w.bounds(now_ms) for w in self._windows)
        self._used_keys = [self._keys.used(self.scope, b.spec, b.id) for b in bounds]
        self._windows_json = dumps([[b.start_ms, b.end_ms, b.spec] for b in bounds])
        self._bounds = bounds
        return self._used_keys, self._windows_json


def shared_windows(scope: Scope, shared: SharedLimits | None) -> tuple[Window, ...]:
    """The scope's windows, then those only its shared rows use."""
    seen = {w.spec: w for w in scope.windows()}
    for b in shared.budgets if shared else ():
        seen.setdefault(b.window.spec, b.window)
    return tuple(seen.values())


def shared_rows(shared: SharedLimits | None, index: dict[str, int]) -> list[list[Any]]:
    """Budget spec rows of the shared limits, flagged (``index``: window spec -> 1-based)."""
    rows = shared.budgets if shared else ()
    return [[b.field, b.dim, b.limit, index[b.window.spec], 1] for b in rows]


class Plans:
    """The plan of each scope a ledger is called with, by identity (config scopes live as long
    as the process)."""

    def __init__(self, keys: Keyspace) -> None:
        self.keys = keys
        self._plans: dict[tuple[int, int], ScopePlan] = {}

    def of(self, scope: Scope, shared: SharedLimits | None = None) -> ScopePlan:
        """The plan of ``scope``, with the rows of ``shared`` (a route's) if given."""
        at = (id(scope), id(shared))
        plan = self._plans.get(at)
        if plan is not None and plan.scope is scope and plan.shared is shared:
            return plan
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        plan = self._plans[at] = ScopePlan(scope, self.keys, shared)
        return plan
