"""A pure-Python reference model of the ledger scripts, for property tests only (never at runtime).

It holds what the server holds for one scope: used per budget field and window, reserved per
field, the live reservations with their expiry, and the ids settled. Every operation takes the
server time ``now_ms`` the real reply carried, so the model applies each step at exactly the
instant the script ran, and expiry needs no guessing. Rate limits are left out.

The rules mirror ``lua/*.lua`` deliberately, including the parts that are easy to get wrong:
only admit, extend and usage reclaim expired reservations (settle does not, so settling an
expired but unreclaimed reservation still finds it); an expiry equal to ``now`` has expired
(``ZRANGEBYSCORE -inf now``); reclaim takes at most 256 per call, earliest first; admit does not
look at settled ids, so re-admitting a settled id holds a new reservation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hardcap_core.budgets import Budget, Prices

RECLAIM_BATCH = 256
BUSY_RETRY_MS = 1000
HUGE = 2**53  # admit.lua's "no limit from this budget"


def amount(dim: str, inp: int, out: int, prices: Prices) -> int:
    """What ``inp`` input and ``out`` output tokens add to a budget of dimension ``dim``."""
    if dim == "in":
        return inp
    if dim == "out":
        return out
    if dim == "tot":
        return inp + out
    return prices.cost(inp, out)


def per_output(dim: str, prices: Prices) -> int:
    """What one more output token adds to a budget of dimension ``dim``."""
    if dim in ("out", "tot"):
        return 1
    if dim == "usd":
        return prices.output_nusd
    return 0


@dataclass(slots=True)
class Held:
    """One live reservation, as the ``res`` hash and ``exp`` zset hold it."""

    fields: tuple[str, ...]
    dims: tuple[str, ...]
    input_tokens: int
    output_tokens: int
    prices: Prices
    bucket_take: int
    expiry_ms: int


@dataclass(frozen=True, slots=True)
class AdmitOutcome:
    kind: str  # "ok" | "busy" | "exceeded" | "settled"
    output_reserved: int  # 0 when refused
    field: str | None  # the budget named by a refusal
    retry_after_ms: int  # 0 when admitted
    remaining: tuple[int, ...]
    reset_ms: tuple[int, ...]
    replay: bool = False


@dataclass(frozen=True, slots=True)
class ExtendOutcome:
    kind: str  # "ok" | "no" | "gone"
    granted: int = 0
    output_reserved: int = 0
    field: str | None = None
    remaining: tuple[int, ...] = ()
    reset_ms: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SettleOutcome:
    kind: str  # "ok" | "dup"
    had_reservation: bool = False
    remaining: tuple[int, ...] = ()
    reset_ms: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class UsageOutcome:
    used: tuple[int, ...]
    reserved: tuple[int, ...]
    reset_ms: tuple[int, ...]
    live_reservations: int


@dataclass
class LedgerModel:
    """The ledger of one scope with ``budgets``, reservations held for ``ttl_ms``."""

    budgets: Sequence[Budget]
    ttl_ms: int
    used: dict[tuple[str, str], int] = field(default_factory=dict)  # (field, window id) -> used
    reserved: dict[str, int] = field(default_factory=dict)
    live: dict[str, Held] = field(default_factory=dict)
    settled: set[str] = field(default_factory=set)

    # -- operations ---------------------------------------------------------------------------

    def admit(
        self,
        now: int,
        rid: str,
        *,
        input_tokens: int,
        estimate: int,
        min_output: int,
        prices: Prices,
    ) -> AdmitOutcome:
        """admit.lua: reserve up to ``estimate`` output, shrunk to fit but not below
        ``min_output``; refused 'busy' if it would fit with nothing in flight, else 'exceeded'.
        A live ``rid`` is a replay: its reservation is answered and nothing more is held."""
        if rid in self.settled:
            # admit.lua answers 'settled' before reclaiming anything: ids are single-use.
            return AdmitOutcome("settled", 0, None, 0, (), ())
        self.reclaim(now)
        held = self.live.get(rid)
        if held is not None:
            return self._admit_reply(now, "ok", held.output_tokens, None, 0, replay=True)
        fit = fit_idle = HUGE
        tight = tight_idle = -1
        for i, b in enumerate(self.budgets):
            dim = b.dimension.short
            fixed = amount(dim, input_tokens, 0, prices)
            per = per_output(dim, prices)
            free = b.limit - self.used_now(b, now) - self.reserved_of(b) - fixed
            idle = b.limit - self.used_now(b, now) - fixed
            if per == 0:
                f = HUGE if free >= 0 else -1
                fi = HUGE if idle >= 0 else -1
            else:
                f, fi = free // per, idle // per
            if f < fit:
                fit, tight = f, i
            if fi < fit_idle:
                fit_idle, tight_idle = fi, i
        out = min(estimate, fit)
        if out < estimate and fit_idle >= estimate:
            # Shrink only at a budget's tail; while holds are in flight the request waits.
            return self._admit_reply(now, "busy", 0, self.budgets[tight].field, BUSY_RETRY_MS)
        if out < min_output:
            if fit_idle >= min_output:
                field_ = self.budgets[tight].field
                return self._admit_reply(now, "busy", 0, field_, BUSY_RETRY_MS)
            b = self.budgets[tight_idle]
            retry = b.window.bounds(now).end_ms - now
            return self._admit_reply(now, "exceeded", 0, b.field, retry)
        for b in self.budgets:
            self._hold(b.field, amount(b.dimension.short, input_tokens, out, prices))
        self.live[rid] = Held(
            fields=tuple(b.field for b in self.budgets),
            dims=tuple(b.dimension.short for b in self.budgets),
            input_tokens=input_tokens,
            output_tokens=out,
            prices=prices,
            bucket_take=input_tokens + out,
            expiry_ms=now + self.ttl_ms,
        )
        return self._admit_reply(now, "ok", out, None, 0)

    def extend(self, now: int, rid: str, *, want: int, least: int) -> ExtendOutcome:
        """extend.lua: grant min(want, what fits in every budget output counts against), or
        'no' below ``least`` (taken as 1..want); 'gone' once reclaimed or settled. Refreshes
        the expiry."""
        least = max(min(least, want), 1)
        self.reclaim(now)
        held = self.live.get(rid)
        if held is None:
            return ExtendOutcome("gone")
        grant, tight = want, -1
        for i, b in enumerate(self.budgets):
            per = per_output(b.dimension.short, held.prices)
            if per > 0:
                fit = (b.limit - self.used_now(b, now) - self.reserved_of(b)) // per
                if fit < grant:
                    grant, tight = max(fit, 0), i
        if want > 0 and grant < least:
            field_ = self.budgets[tight].field  # grant < least <= want: a budget lowered it
            remaining, reset = self._state(now)
            return ExtendOutcome("no", field=field_, remaining=remaining, reset_ms=reset)
        if grant > 0:
            for b in self.budgets:
                self._hold(b.field, grant * per_output(b.dimension.short, held.prices))
            held.output_tokens += grant
        held.expiry_ms = now + self.ttl_ms
        remaining, reset = self._state(now)
        return ExtendOutcome("ok", grant, held.output_tokens, remaining=remaining, reset_ms=reset)

    def settle(
        self, now: int, rid: str, *, input_tokens: int, output_tokens: int, prices: Prices
    ) -> SettleOutcome:
        """settle.lua: release the hold if still there (expired or not) and charge the actual
        counts to the window current at ``now``, once per id; 'dup' after that."""
        if rid in self.settled:
            return SettleOutcome("dup")
        held = self.live.pop(rid, None)
        if held is not None:
            self._release(held)
        for b in self.budgets:
            a = amount(b.dimension.short, input_tokens, output_tokens, prices)
            key = (b.field, b.window.bounds(now).id)
            self.used[key] = self.used.get(key, 0) + a
        self.settled.add(rid)
        remaining, reset = self._state(now)
        return SettleOutcome("ok", held is not None, remaining=remaining, reset_ms=reset)

    def usage(self, now: int) -> UsageOutcome:
        """usage.lua: reclaim, then used, reserved and ms to reset per budget."""
        self.reclaim(now)
        return UsageOutcome(
            used=tuple(self.used_now(b, now) for b in self.budgets),
            reserved=tuple(self.reserved_of(b) for b in self.budgets),
            reset_ms=tuple(b.window.bounds(now).end_ms - now for b in self.budgets),
            live_reservations=len(self.live),
        )

    def reclaim(self, now: int) -> int:
        """Return expired reservations (expiry <= now), earliest first, at most a batch."""
        expired = sorted((h.expiry_ms, rid) for rid, h in self.live.items() if h.expiry_ms <= now)
        for _, rid in expired[:RECLAIM_BATCH]:
            self._release(self.live.pop(rid))
        return len(expired[:RECLAIM_BATCH])

    # -- reads --------------------------------------------------------------------------------

    def used_now(self, budget: Budget, now: int) -> int:
        return self.used.get((budget.field, budget.window.bounds(now).id), 0)

    def reserved_of(self, budget: Budget) -> int:
        return self.reserved.get(budget.field, 0)

    def remaining(self, now: int) -> tuple[int, ...]:
        return tuple(b.limit - self.used_now(b, now) - self.reserved_of(b) for b in self.budgets)

    # -- internals ----------------------------------------------------------------------------

    def _hold(self, field_: str, a: int) -> None:
        if a:
            self.reserved[field_] = self.reserved.get(field_, 0) + a

    def _release(self, held: Held) -> None:
        for f, d in zip(held.fields, held.dims, strict=True):
            self._hold(f, -amount(d, held.input_tokens, held.output_tokens, held.prices))

    def _state(self, now: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The budget state every reply carries: remaining and ms to reset, per budget."""
        return self.remaining(now), tuple(b.window.bounds(now).end_ms - now for b in self.budgets)

    def _admit_reply(
        self,
        now: int,
        kind: str,
        out: int,
        field_: str | None,
        retry: int,
        *,
        replay: bool = False,
    ) -> AdmitOutcome:
        remaining, reset = self._state(now)
        return AdmitOutcome(kind, out, field_, retry, remaining, reset, replay=replay)
