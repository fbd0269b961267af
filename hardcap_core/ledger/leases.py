"""Leases: an envelope of tokens and/or USD held out of a scope's budgets for a while, which
requests (and sub-leases) then draw from (``lua/lease_open.lua``, ``lua/lease_close.lua``;
the lease's level in ``lua/admit.lua``, ``extend.lua`` and ``settle.lua``; its record and the
bookkeeping in ``lua/lib.lua``).

A lease is a hold like a request's, made by one script in the hierarchy's slot: the tenant's
reserved counts the envelope once, whether the lease still holds it or its requests do, and
closing it (or its expiry, reclaimed like an expired hold) returns what is unspent in the same
script. Without the budget server there is no lease: every call here raises
:class:`LedgerUnavailable` whatever the tenant's fail mode.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hardcap_core.budgets import NANO_USD_PER_USD, Scope
from hardcap_core.config.settings import DEFAULT_GATEWAY
from hardcap_core.errors import InvalidRequest, LeaseNotFound, LedgerProtocolError
from hardcap_core.ledger.client import Ledger
from hardcap_core.ledger.connection import guarded
from hardcap_core.ledger.contract import REPLIES, LeaseCloseArgs, LeaseOpenArgs, encode, named
from hardcap_core.ledger.limits import SETTLE_MEMORY_MS
from hardcap_core.ledger.replies import BudgetState, Refusal, Refused, ReplyReader, lease_of

DEFAULT_MAX_DEPTH = DEFAULT_GATEWAY.lease_max_depth  # the config's gateway.lease_max_depth


@dataclass(frozen=True, slots=True)
class LeaseOwner:
    """Who may use and close a lease: its tenant, and its user when opened with one."""

    tenant: str
    user: str = ""


@dataclass(frozen=True, slots=True)
class LeaseState:
    """A lease as its script read it (closing: its last state)."""

    id: str
    expires_at_ms: int
    tokens: int | None  # the envelope; None where it names no tokens
    usd_nusd: int | None  # the envelope in nUSD; None where it names no USD
    spent_tokens: int
    spent_nusd: int
    held_tokens: int  # by its live requests and sub-leases
    held_nusd: int
    depth: int
    parent: str | None
    server_time_ms: int

    @property
    def remaining_tokens(self) -> int | None:
        if self.tokens is None:
            return None
        return max(self.tokens - self.spent_tokens - self.held_tokens, 0)

    @property
    def remaining_nusd(self) -> int | None:
        if self.usd_nusd is None:
            return None
        return max(self.usd_nusd - self.spent_nusd - self.held_nusd, 0)

    def to_json(self) -> dict[str, Any]:
        """The body the lease endpoints answer (USD as floats for reading)."""
        return {
            "id": self.id,
            "object": "hardcap.lease",
            "expires_at": self.expires_at_ms / 1000,
            "tokens": self.tokens,
            "usd": _usd(self.usd_nusd),
            "spent": {"tokens": self.spent_tokens, "usd": self.spent_nusd / NANO_USD_PER_USD},
            "held": {"tokens": self.held_tokens, "usd": self.held_nusd / NANO_USD_PER_USD},
            "remaining": {"tokens": self.remaining_tokens, "usd": _usd(self.remaining_nusd)},
            "depth": self.depth,
            "parent": self.parent,
        }


@dataclass(frozen=True, slots=True)
class LeaseOpened:
    id: str
    expires_at_ms: int
    tokens: int | None
    usd_nusd: int | None
    budgets: tuple[BudgetState, ...]
    server_time_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "hardcap.lease",
            "expires_at": self.expires_at_ms / 1000,
            "tokens": self.tokens,
            "usd": _usd(self.usd_nusd),
        }


class Leases:
    """Open, read and close leases on a :class:`Ledger`'s server (its scripts and plans)."""

    def __init__(self, ledger: Ledger, *, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self.ledger = ledger
        self.max_depth = max_depth

    async def open(
        self,
        scope: Scope,
        owner: LeaseOwner,
        *,
        ttl_s: float,
        tokens: int | None = None,
        usd_nusd: int | None = None,
        parent: str | None = None,
        lease_id: str | None = None,
    ) -> LeaseOpened | Refused:
        """Hold ``tokens`` and/or ``usd_nusd`` on every budget of ``scope`` for ``ttl_s`` (out
        of ``parent``'s hold, when named); :class:`Refused` where it does not fit."""
        if tokens is None and usd_nusd is None:
            raise InvalidRequest("A lease needs 'tokens', 'usd' or both.", param="tokens")
        if (tokens is not None and tokens < 1) or (usd_nusd is not None and usd_nusd < 1):
            raise InvalidRequest("A lease's 'tokens' and 'usd' must be positive.", param="tokens")
        if ttl_s <= 0:
            raise InvalidRequest("'ttl_seconds' must be positive.", param="ttl_seconds")
        lid = lease_id or uuid.uuid4().hex
        ledger = self.ledger
        plan = ledger.plans.of(scope)

        def build(now_ms: int, more: tuple[str, ...]) -> tuple[list[str], list[Any]]:
            used_keys, rows, windows = ledger._spec(plan, now_ms, more)
            return encode(
                LeaseOpenArgs(
                    ledger=plan.ledger_keys, used=used_keys, lease_id=lid, rows=rows,
                    windows=windows, settle_memory_ms=SETTLE_MEMORY_MS, ttl_ms=int(ttl_s * 1000),
                    max_depth=self.max_depth, tenant=owner.tenant, user=owner.user,
                    tokens=tokens, usd_nusd=usd_nusd, parent=parent or None,
                )
            )  # fmt: skip

        reply = await ledger._run(ledger.scripts.lease_open, build, scope=scope)
        r = ReplyReader(scope, reply)
        if r.status == "ok":
            expires = int(r.fields("lease_open")["expires_at_ms"])
            return LeaseOpened(lid, expires, tokens, usd_nusd, r.budget_states(), r.now_ms)
        if r.status == "nolease":
            raise LeaseNotFound(f"The parent lease '{parent}' does not exist or has ended.")
        if r.status == "depth":
            raise InvalidRequest(
                f"Leases nest at most {r.fields('lease_open')['md']} deep: this one would be "
                "deeper.",
                param="parent",
            )
        if r.status == "dims":
            dim = r.text()
            raise InvalidRequest(
                f"The parent lease limits {dim}: a sub-lease must name '{dim}' too.", param=dim
            )
        if r.status == "exists":
            raise InvalidRequest(f"The lease id '{lid}' is taken.", param="id")
        if r.status not in ("exceeded", "never"):
            raise r.unexpected("lease_open")
        f = r.fields("lease_open")
        what, retry = str(f["what"]), int(f["retry_after_ms"])
        level, dimension, budget = r.locate(what)
        reason = Refusal.BUSY if lease_of(what) and r.status == "exceeded" else Refusal.EXCEEDED
        return Refused(
            reason, level, dimension, budget, retry, r.budget_states(), (), r.now_ms,
            never_fits=r.status == "never", lease=lease_of(what),
        )  # fmt: skip

    async def read(self, scope: Scope, owner: LeaseOwner, lease_id: str) -> LeaseState:
        """The lease's envelope, spend, holds and expiry; :class:`LeaseNotFound` unless it is
        a live lease of ``owner``."""
        return await self._call(scope, owner, lease_id, close=False)

    async def close(self, scope: Scope, owner: LeaseOwner, lease_id: str) -> LeaseState:
        """End the lease now: what it holds unspent goes back (to its parent while that lives,
        else to the budgets). Returns its last state: ``remaining`` is what went back."""
        return await self._call(scope, owner, lease_id, close=True)

    async def _call(
        self, scope: Scope, owner: LeaseOwner, lease_id: str, close: bool
    ) -> LeaseState:
        ledger = self.ledger
        plan = ledger.plans.of(scope)
        keys, args = encode(
            LeaseCloseArgs(ledger=plan.ledger_keys, lease_id=lease_id, close=1 if close else 0,
                           tenant=owner.tenant, user=owner.user)
        )  # fmt: skip
        for _ in range(2):
            reply = await guarded(ledger.scripts.lease_close(keys=keys, args=args))
            status = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
            if status != "hydrate":
                break
            await ledger.restore(scope)
        return parse_lease(lease_id, status, reply)


def parse_lease(lease_id: str, status: str, reply: Sequence[Any]) -> LeaseState:
    """lease_close.lua's reply."""
    if status == "nolease":
        raise LeaseNotFound(f"The lease '{lease_id}' does not exist or has ended.")
    if status != "ok":
        raise LedgerProtocolError(f"lease_close replied {status!r}")
    f = named(REPLIES["lease_close"]["ok"], reply, 1)
    tokens, usd = int(f["tokens"]), int(f["usd"])
    return LeaseState(
        lease_id, int(f["expires_at_ms"]), None if tokens < 0 else tokens,
        None if usd < 0 else usd, int(f["spent_tokens"]), int(f["spent_usd"]),
        int(f["held_tokens"]), int(f["held_usd"]), int(f["depth"]), str(f["parent"]) or None,
        int(f["now_ms"]),
    )  # fmt: skip


def _usd(nusd: int | None) -> float | None:
    return None if nusd is None else nusd / NANO_USD_PER_USD
