"""Budgets and rate limits that span tenants: a route's, or an upstream's (the org's own account
with a provider), checked in the same admit as the tenant's hierarchy.

A tenant's admit runs in its hierarchy's slot (``{t:acme}``); a counter of every tenant's spend
on an upstream would live in another slot, and one script cannot touch both. So the shared
limit hands out its capacity in **allowances**: ``lua/allowance_grant.lua``, in the limit's own
slot (``{up:<name>}``, ``{rt:<name>}``), grants a hierarchy at most what is left of the limit in
the current window (its ``granted`` never passes the limit); ``lua/allowance_credit.lua`` adds the
grant to the hierarchy's allowance, kept in its own slot in the window's used key; admit and
extend check a shared row like any budget row, against the allowance instead of a fixed limit
(``lua/lib.lua``, ``limits_of``). Where the allowance is short, admit answers ``grant`` and
:class:`Allowances` asks for ``max(need, 5% of the limit)``; when the limit has too little left,
it first takes back the unused allowance of the hierarchies holding most of it
(``lua/allowance_release.lua``) and returns it (``allowance_grant.lua`` 'return'), so small
tenants do not strand capacity. A new window starts every allowance at 0.

The bound, per shared row and window W: Σ over hierarchies of their spend charged in W
≤ granted(W) ≤ limit. granted(W) only grows in the grant script, by at most limit - granted(W),
atomically in one slot. A hierarchy's allowance(W) grows only by a credit of what a grant gave
(after the grant) and shrinks by a release (before its return shrinks granted), so at every
instant Σ allowance(W) ≤ granted(W): a failure between the two calls strands capacity, never
adds it. In the hierarchy's slot admit and extend keep used(W) + reserved ≤ allowance(W), the
ledger's invariant with the allowance as the limit, so each hierarchy's spend in W is within its
allowance and the sum within the limit — whatever slots and nodes the hierarchies live on, and
however many requests run at once. Window ids are the clients', checked by each script against
its own server's clock; spend and grants are both counted by window id, so clock skew between
nodes only moves which instant counts in which window. What the bound does not cover, as for any
budget: a settle that reports more than was held (policy ``allow`` / ``count_after``), and holds
admitted in W and settled in W+1 (charged to W+1 before W+1 granted for them: the next admit of
that hierarchy asks for them first).

Rate limits across tenants use the same allowance over a **fixed** minute window (``f60``):
requests per minute as a budget of requests (``req``: 1 per request), tokens per minute as one of
input + output tokens. A sliding window would need each hierarchy's per-second history in the
shared slot on every call; a fixed window's allowance is one counter per minute. The price: any 60
seconds that straddle a minute's boundary may hold up to twice the limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hardcap_core.budgets import DEFAULT_NOTIFY_AT, Dimension, Window, WindowBounds
from hardcap_core.errors import LedgerProtocolError
from hardcap_core.ledger.connection import guarded
from hardcap_core.ledger.contract import (
    REPLIES,
    AllowanceCreditArgs,
    AllowanceGrantArgs,
    AllowanceReleaseArgs,
    encode,
)
from hardcap_core.ledger.keys import Keyspace
from hardcap_core.ledger.limits import GRANT_ATTEMPTS, GRANT_CHUNK_DIVISOR
from hardcap_core.ledger.scripts import ALLOWANCE_SCRIPTS as ALLOWANCE_SCRIPTS  # its old home
from hardcap_core.ledger.scripts import Scripts

CHUNK_DIVISOR = GRANT_CHUNK_DIVISOR
MINUTE = Window("fixed", 60)

SharedKind = Literal["route", "upstream"]


@dataclass(frozen=True, slots=True)
class SharedBudget:
    """One limit of a route or an upstream, over every tenant: a budget, or a per-minute rate."""

    kind: SharedKind
    name: str  # the route's or upstream's config name
    dim: str  # what a request adds: 'in' | 'out' | 'tot' | 'usd' | 'req' (lib.lua: amount)
    measure: str  # the field's middle: dim for a budget, 'rpm' / 'tpm' for a rate
    limit: int  # tokens, requests or nano-USD per window
    window: Window
    # A budget's thresholds, percent of its limit (rollup/notify.py); a rate has none.
    notify_at: tuple[int, ...] = field(default=DEFAULT_NOTIFY_AT, compare=False)

    @property
    def tag(self) -> str:
        """Its slot's hash tag and its fields' prefix: ``up:<name>`` or ``rt:<name>``."""
        return f"{'up' if self.kind == 'upstream' else 'rt'}:{self.name}"

    @property
    def field(self) -> str:
        """Its hash field, in the hierarchy's slot and in its own: ``<tag>:<measure>:<spec>``."""
        return f"{self.tag}:{self.measure}:{self.window.spec}"

    @property
    def owner(self) -> str:
        """How a refusal names it: ``route:<name>`` or ``upstream:<name>``."""
        return f"{self.kind}:{self.name}"

    @property
    def chunk(self) -> int:
        """The least a grant asks for."""
        return max(1, self.limit // CHUNK_DIVISOR)

    def describe(self) -> str:
        """The limit as a person reads it, for a refusal's message."""
        if self.measure == "rpm":
            return f"{self.limit} requests per minute"
        if self.measure == "tpm":
            return f"{self.limit} tokens per minute"
        w = self.window
        per = f"{w.seconds} s" if w.kind == "fixed" else w.kind
        if self.dim == "usd":
            return f"${self.limit / 1_000_000_000:g} per {per}"
        return f"{self.limit} tokens per {per}"


@dataclass(frozen=True, slots=True)
class SharedLimits:
    """The limits spanning tenants that one route's requests are checked against: the route's
    own and its upstream's."""

    budgets: tuple[SharedBudget, ...]

    def find(self, field: str) -> SharedBudget | None:
        return next((b for b in self.budgets if b.field == field), None)


def shared_budgets(
    kind: SharedKind,
    name: str,
    budgets: Sequence[tuple[Dimension, int, Window]] = (),
    requests_per_minute: int | None = None,
    tokens_per_minute: int | None = None,
    notify_at: Sequence[tuple[int, ...]] = (),
) -> tuple[SharedBudget, ...]:
    """A route's or an upstream's limits as shared rows (rates over a fixed minute);
    ``notify_at``: each budget's thresholds, in order (none given: the default)."""
    at = list(notify_at) or [DEFAULT_NOTIFY_AT] * len(budgets)
    out = [
        SharedBudget(kind, name, d.short, d.short, limit, w, n)
        for (d, limit, w), n in zip(budgets, at, strict=True)
    ]
    if requests_per_minute:
        out.append(SharedBudget(kind, name, "req", "rpm", requests_per_minute, MINUTE, ()))
    if tokens_per_minute:
        out.append(SharedBudget(kind, name, "tot", "tpm", tokens_per_minute, MINUTE, ()))
    return tuple(out)


def _per_row(reply: Sequence[Any], script: str) -> Sequence[Any]:
    """What follows the named fields of ``script``'s 'ok' reply (its layout's last name is
    the rows': one value per row asked, in order, then for a grant k and the holders)."""
    return reply[len(REPLIES[script]["ok"]) :]


@dataclass(frozen=True, slots=True)
class _Group:
    """The rows of one shared limit (one slot) in one call, with their windows now."""

    tag: str
    rows: list[tuple[SharedBudget, int]]
    bounds: list[WindowBounds]
    index: dict[str, int]  # window spec -> 0-based index in bounds


def _group(tag: str, rows: list[tuple[SharedBudget, int]], now_ms: int) -> _Group:
    bounds: list[WindowBounds] = []
    index: dict[str, int] = {}
    for b, _ in rows:
        if b.window.spec not in index:
            index[b.window.spec] = len(bounds)
            bounds.append(b.window.bounds(now_ms))
    return _Group(tag, rows, bounds, index)


class Allowances:
    """Grants, credits and releases of the allowances of limits that span tenants."""

    def __init__(self, scripts: Scripts, keys: Keyspace) -> None:
        self.keys = keys
        self.grants = 0  # grant calls made (the benchmark reports them per 1,000 requests)
        self._clock = 0  # the server time of the last grant reply, ms
        # Per (hierarchy, limit tag): one grant call at a time, and the asks waiting for the next.
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._pending: dict[tuple[str, str], dict[str, tuple[SharedBudget, int]]] = {}
        # Registered with every other script (scripts.py: the one list).
        self._grant = scripts.allowance_grant
        self._credit = scripts.allowance_credit
        self._release = scripts.allowance_release

    async def grant(
        self, root_tag: str, wanted: Sequence[tuple[SharedBudget, int]], now_ms: int
    ) -> dict[str, int]:
        """Add to the allowances of hierarchy ``root_tag`` what it lacks (``wanted``: a row and
        the amount it needs), each at least the row's chunk, as far as each limit has room;
        returns what each field was given.

        Concurrent asks of one hierarchy on one limit in this process make one call: while one
        is in flight the others add their needs to the next, and an ask that a call took along
        is answered as given (its admit, called again, says whether it is enough)."""
        by_tag: dict[str, list[tuple[SharedBudget, int]]] = {}
        for b, need in wanted:
            if need > 0:
                by_tag.setdefault(b.tag, []).append((b, need))
        given: dict[str, int] = {}
        for tag, rows in by_tag.items():
            at = (root_tag, tag)
            pending = self._pending.setdefault(at, {})
            for b, need in rows:
                pending[b.field] = (b, pending.get(b.field, (b, 0))[1] + need)
            async with self._locks.setdefault(at, asyncio.Lock()):
                asks = self._pending.pop(at, None)
                if asks is None:  # taken along by the call that just ended
                    given.update({b.field: need for b, need in rows})
                    continue
                group = [(b, max(need, b.chunk)) for b, need in asks.values()]
                got = await self._grant_group(root_tag, tag, group, now_ms)
                given.update({b.field: got.get(b.field, 0) for b, _ in rows})
        return given

    async def release(
        self, root_tag: str, limits: Sequence[SharedBudget], now_ms: int
    ) -> dict[str, int]:
        """Take back hierarchy ``root_tag``'s unused allowance of ``limits`` (allowance - used -
        reserved) and return it to each limit; returns what was returned per field."""
        by_tag: dict[str, list[tuple[SharedBudget, int]]] = {}
        for b in limits:
            by_tag.setdefault(b.tag, []).append((b, 0))
        out: dict[str, int] = {}
        for tag, rows in by_tag.items():
            out.update(await self._release_group(root_tag, _group(tag, rows, now_ms)))
        return out

    async def _grant_group(
        self, root: str, tag: str, rows: list[tuple[SharedBudget, int]], now_ms: int
    ) -> dict[str, int]:
        reply: list[Any] | None = None
        for _ in range(GRANT_ATTEMPTS):
            g = _group(tag, rows, now_ms)
            reply = await self._call(root, "grant", g, rows)
            if reply is not None:
                break
            now_ms = self._clock  # the windows moved on meanwhile: ask in the server's
        if reply is None:
            raise LedgerProtocolError("allowance_grant: the server's clock keeps crossing a window")
        n = len(rows)
        per_row = _per_row(reply, "allowance_grant")
        given = [int(v) for v in per_row[:n]]
        holders = [h.decode() if isinstance(h, bytes) else str(h) for h in per_row[n + 1 :]]
        short = [(b, want - got) for (b, want), got in zip(rows, given, strict=True) if got < want]
        if short and holders:
            # Too little left: take back what others hold unused, the largest holders first, until
            # the shortfall is covered; then ask for it again, in the same windows (a window that
            # ended meanwhile answers 'clock': no more).
            lacking = {b.field: n for b, n in short}
            for holder in holders:
                want = [(b, lacking[b.field]) for b, _ in short if lacking[b.field] > 0]
                if not want:
                    break
                back = await self._release_group(holder, _Group(tag, want, g.bounds, g.index))
                for f, n in back.items():
                    lacking[f] -= n
            again = await self._call(root, "grant", g, short)
            if again is not None:
                back_rows = _per_row(again, "allowance_grant")
                extra = {b.field: int(v) for (b, _), v in zip(short, back_rows, strict=False)}
                given = [
                    got + extra.get(b.field, 0) for (b, _), got in zip(rows, given, strict=True)
                ]
        await self._credit_group(
            root, g, [(b, got) for (b, _), got in zip(rows, given, strict=True)]
        )
        return {b.field: got for (b, _), got in zip(rows, given, strict=True)}

    async def _call(
        self, root: str, mode: str, g: _Group, rows: list[tuple[SharedBudget, int]]
    ) -> list[Any] | None:
        """One allowance_grant.lua call in ``g``'s windows; None if its server is past them."""
        keys, args = encode(
            AllowanceGrantArgs(
                granted=[self.keys.granted(g.tag, w.spec, w.id) for w in g.bounds],
                mode=mode, root=root,
                windows=[[w.start_ms, w.end_ms] for w in g.bounds],
                rows=[[b.field, b.limit, amt, g.index[b.window.spec] + 1] for b, amt in rows],
            )
        )  # fmt: skip
        if mode == "grant":
            self.grants += 1
        reply = await guarded(self._grant(keys=keys, args=args))
        status = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        self._clock = int(reply[1])
        if status == "ok":
            return list(reply)
        if status != "clock":
            raise LedgerProtocolError(f"allowance_grant replied {status!r}")
        return None

    async def _credit_group(
        self, root: str, g: _Group, rows: list[tuple[SharedBudget, int]]
    ) -> None:
        rows = [(b, n) for b, n in rows if n > 0]
        if not rows:
            return
        keys, args = encode(
            AllowanceCreditArgs(
                used=[self.keys.used_of(root, w.spec, w.id) for w in g.bounds],
                rows=[
                    [b.field, n, at + 1, g.bounds[at].end_ms]
                    for b, n in rows
                    for at in (g.index[b.window.spec],)
                ],
            )
        )
        await guarded(self._credit(keys=keys, args=args))

    async def _release_group(self, root: str, g: _Group) -> dict[str, int]:
        """Take back ``root``'s unused allowance of ``g``'s rows (each at most its amount, if
        above 0) in ``g``'s windows, then return it there. A return that finds its window ended
        does nothing: that capacity is moot."""
        keys, args = encode(
            AllowanceReleaseArgs(
                reserved=self.keys.reserved_of(root),
                used=[self.keys.used_of(root, w.spec, w.id) for w in g.bounds],
                rows=[
                    [b.field, g.index[b.window.spec] + 1, *([most] if most > 0 else [])]
                    for b, most in g.rows
                ],
            )
        )
        reply = await guarded(self._release(keys=keys, args=args))
        per_row = _per_row(reply, "allowance_release")
        taken = [(b, int(v)) for (b, _), v in zip(g.rows, per_row, strict=True)]
        back = [(b, n) for b, n in taken if n > 0]
        if back:
            await self._call(root, "return", g, back)
        return {b.field: n for b, n in taken}
