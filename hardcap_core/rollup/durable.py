"""Settles that could not reach the cache: kept in DynamoDB, charged once the cache answers.

The gateway's meter tries a settle a few times; if the cache still does not answer, it hands
the settle to :class:`DurableSettles`, which writes it as a ``pending#`` item. The next rollup
of that hierarchy (or the restore of its counters, whichever comes first) runs the settle
against the cache — settle is idempotent by reservation id, so a settle that did reach the
cache after all, or a replay that crashed before deleting its item, is never charged twice —
and its usage record then flows into the durable ledger like any other.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hardcap_core.budgets import USER_ID_PATTERN, Level, LevelKind, Prices, Scope
from hardcap_core.config import Config
from hardcap_core.errors import DurableStoreUnavailable, LedgerUnavailable
from hardcap_core.ledger import Ledger, Reservation, ReservationMeta
from hardcap_core.ledger.replies import SettleNote
from hardcap_core.logs import logger
from hardcap_core.rollup.table import UsageTable


def settle_payload(
    reservation: Reservation,
    input_tokens: int,
    output_tokens: int,
    note: SettleNote,
    cost_nusd: int | None = None,
) -> dict[str, Any]:
    """What a pending item holds: enough to run the same settle later. The user (its level's
    id) goes beside ``meta``, not in it, and only when there is one: a rollup of the release
    before builds its ReservationMeta from ``meta`` and would fail on a field it does not
    know; it ignores ``user`` (that settle's user counter and user column are then missed)."""
    m = reservation.meta
    payload: dict[str, Any] = {
        "in": input_tokens,
        "out": output_tokens,
        "cost": cost_nusd,
        "pi": reservation.prices.input_nusd,
        "po": reservation.prices.output_nusd,
        "meta": {
            "route": m.route,
            "model": m.model,
            "key_id": m.key_id,
            "request_id": m.request_id,
            "tenant": m.tenant,
            "org": m.org,
            "provider": m.provider,
        },
        "note": {
            "outcome": note.outcome,
            "estimate": note.estimate,
            "reasoning_tokens": note.reasoning_tokens,
            "cached_input_tokens": note.cached_input_tokens,
            "model": note.model,
            "provider": note.provider,
        },
    }
    if m.user:
        payload["user"] = m.user
    return payload


class DurableSettles:
    """The gateway's fallback for a settle the cache did not take."""

    def __init__(self, table: UsageTable) -> None:
        self.table = table

    async def keep(
        self,
        reservation: Reservation,
        input_tokens: int,
        output_tokens: int,
        note: SettleNote,
        cost_nusd: int | None = None,
    ) -> bool:
        """Write the settle durably; False (logged) if DynamoDB cannot take it either."""
        payload = settle_payload(reservation, input_tokens, output_tokens, note, cost_nusd)
        root = reservation.scope.root.tag
        try:
            await asyncio.to_thread(self.table.put_pending, root, reservation.id, payload)
        except DurableStoreUnavailable as e:
            logger.error("settle lost: neither the cache nor DynamoDB took it",
                         extra={"reservation_id": reservation.id, "error": str(e)})  # fmt: skip
            return False
        return True


async def replay_pending(ledger: Ledger, table: UsageTable, config: Config, root: Level) -> int:
    """Charge every settle kept for ``root``'s hierarchy; returns how many. One that cannot be
    charged now (the cache is still away) stays for the next run."""
    done = 0
    for rid, payload in await asyncio.to_thread(table.pending, root.tag):
        user = str(payload.get("user", ""))
        meta = ReservationMeta(**payload["meta"], user=user)
        principal = config.principal_by_id(meta.key_id)
        if principal is not None and principal.scope.root == root:
            scope = principal.scope
        elif meta.tenant in config.tenant_scopes:
            scope = config.tenant_scope(meta.tenant)  # the key left the config: its tenant pays
        else:
            logger.error("pending settle of an unknown tenant kept", extra={"reservation_id": rid})
            continue
        scope = _with_user(config, scope, meta.tenant, user)
        prices = Prices(int(payload["pi"]), int(payload["po"]))
        reservation = Reservation(rid, scope, prices, 0, 0, meta)
        try:
            await ledger.settle(reservation, input_tokens=int(payload["in"]),
                                output_tokens=int(payload["out"]),
                                note=SettleNote(**payload["note"]),
                                cost_nusd=payload.get("cost"))  # fmt: skip
        except LedgerUnavailable:
            return done
        await asyncio.to_thread(table.delete_pending, root.tag, rid)
        done += 1
    return done


def _with_user(config: Config, scope: Scope, tenant: str, user: str) -> Scope:
    """``scope`` with the settle's user level and its tenant's template budgets, so the replay
    charges the user's counters as the settle would have (as is, without a template now)."""

    template = config.user_template(tenant) if user else None
    if template is None or not user.startswith(f"{tenant}~") or not USER_ID_PATTERN.match(user):
        return scope
    return template.scope(scope, Level(LevelKind.USER, user))
