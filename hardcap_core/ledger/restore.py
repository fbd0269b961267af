"""Putting a hierarchy's counters back when the cache has lost them (or never had them).

Every ledger script refuses to read or change a hierarchy's counters until its ``restored``
marker is set (``lua/hydrate.lua``); the ledger client then asks its :class:`CounterSource`
what the hierarchy used in each current window, hands that to ``hydrate.lua`` once, and calls
the script again. Without a durable store (:class:`NoCounterSource`) the counters start from
zero, as they always did; :mod:`hardcap_core.rollup.restore` reads the durable ledger in
DynamoDB instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from hardcap_core.budgets import Scope


@dataclass(frozen=True, slots=True)
class Restore:
    """What to put back: ``scope`` holds every budget of the hierarchy (every key, tenant and
    org level under its root), ``used`` the amount each budget field used in its window current
    at the time asked, and ``source`` a note kept in the marker."""

    scope: Scope
    used: Mapping[str, int] = field(default_factory=dict)
    source: str = ""


class CounterSource(Protocol):
    """Where a lost hierarchy's usage is read back from."""

    async def used(self, scope: Scope, now_ms: int) -> Restore:
        """Every budget of ``scope``'s hierarchy and what each used in its window at ``now_ms``."""
        ...

    async def restored(self, scope: Scope) -> None:
        """Called once the counters are back: charge what the durable store still holds for the
        hierarchy that the cache never saw (settles that could not reach it)."""
        ...


class NoCounterSource:
    """No durable store: a hierarchy's counters start from zero."""

    async def used(self, scope: Scope, now_ms: int) -> Restore:
        return Restore(scope, {}, "none")

    async def restored(self, scope: Scope) -> None:
        return None
