"""A pure-Python reference model of the ledger scripts, for property tests only (never at runtime).

It holds what the server holds for one scope: used per budget field and window, reserved per
field, the live reservations with their expiry, the live count per level, what expiry charged
per reservation id, and the ids settled. Every operation takes the server time ``now_ms`` the
real reply carried, so the model applies each step at exactly the instant the script ran, and
expiry needs no guessing. Rate limits are left out; so are the windows of other scopes (one
scope names every window its reservations count against, so no script asks for more).

The rules mirror ``lua/*.lua`` deliberately, including the parts that are easy to get wrong:
only admit, extend and usage reclaim expired reservations (settle does not, so settling an
expired but unreclaimed reservation still finds it, and charges it as usual); an expiry equal to
``now`` has expired (``ZRANGEBYSCORE -inf now``); reclaim takes at most 256 per call, earliest
first; a reservation admitted with ``charge_on_expiry`` is charged its hold at reclaim, to the
window current then, and a later settle charges the difference (a refund only in that window);
ids are single-use: admitting a settled or expiry-charged id is refused before anything else,
but an expired id that was returned (not charged) may be admitted again as a new hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hardcap_core.budgets import Budget, Prices

RECLAIM_BATCH = 256
FORGET_BATCH = 64
BUSY_RETRY_MS = 1000
HUGE = 2**53  # admit.lua's "no limit from this budget"
MEMORY_MS = 24 * 3600 * 1000  # how long an expiry charge waits for a late settle


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
    expiry_ms: int
    charge_on_expiry: bool = False
    levels: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ExpiryCharge:
    """What reclaim charged an expired reservation (the ``expired`` hash and ``expired_at``)."""

    rows: tuple[tuple[str, str, str], ...]  # (field, dim, window id it was charged to)
    input_tokens: int
    output_tokens: int
    prices: Prices
    forget_ms: int

    def charged(self, dim: str) -> int:
        return amount(dim, self.input_tokens, self.output_tokens, self.prices)


@dataclass(frozen=True, slots=True)
class AdmitOutcome:
    kind: str  # "ok" | "busy" | "exceeded" | "never" | "settled" | "expired" | "late"
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
    expiry_charged: bool = False


@dataclass(frozen=True, slots=True)
class UsageOutcome:
    used: tuple[int, ...]
    reserved: tuple[int, ...]
    reset_ms: tuple[int, ...]
    live_by_level: tuple[int, ...]  # aligned with the model's levels


@dataclass
class LedgerModel:
    """The ledger of one scope with ``budgets`` on ``levels`` (tags, key first), reservations
    held for ``ttl_ms``."""

    budgets: Sequence[Budget]
    ttl_ms: int
    levels: Sequence[str] = ()
    used: dict[tuple[str, str], int] = field(default_factory=dict)  # (field, window id) -> used
    reserved: dict[str, int] = field(default_factory=dict)
    live: dict[str, Held] = field(default_factory=dict)
    live_count: dict[str, int] = field(default_factory=dict)  # level tag -> live reservations
    expired: dict[str, ExpiryCharge] = field(default_factory=dict)
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
        charge_on_expiry: bool = False,
        not_after: int = 0,
    ) -> AdmitOutcome:
        """admit.lua without a queue or headroom: reserve ``estimate`` output; at a budget's
        tail (it would not fit even with nothing in flight) shrunk to what is left, not below
        ``min_output``, once no hold in flight makes that smaller; refused 'busy' while holds
        in flight stand in the way, 'never' if it would not fit even with nothing used, else
        'exceeded'. Past ``not_after`` it reserves
        nothing ('late'). A live ``rid`` is a replay: its reservation is answered and nothing
        more is held."""
        if rid in self.settled:
            # admit.lua answers 'settled' before reclaiming anything: ids are single-use.
            return AdmitOutcome("settled", 0, None, 0, (), ())
        if rid in self.expired:
            return AdmitOutcome("expired", 0, None, 0, (), ())
        if not_after and now > not_after:
            return AdmitOutcome("late", 0, None, 0, (), ())
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
        busy_field = self.budgets[tight].field if tight >= 0 else None
        if fit_idle < min_output:
            for b in self.budgets:
                dim = b.dimension.short
                room = b.limit - amount(dim, input_tokens, 0, prices)
                per = per_output(dim, prices)
                if (per == 0 and room < 0) or (per > 0 and room // per < min_output):
                    return self._admit_reply(now, "never", 0, b.field, 0)
            b = self.budgets[tight_idle]
            retry = b.window.bounds(now).end_ms - now
            return self._admit_reply(now, "exceeded", 0, b.field, retry)
        if fit_idle >= estimate:
            # The whole estimate fits once the holds in flight settle: until then it waits.
            if fit < estimate:
                return self._admit_reply(now, "busy", 0, busy_field, BUSY_RETRY_MS)
            out = estimate
        else:
            # A budget's tail: shrunk to what is left, once no hold in flight makes it smaller.
            if fit < fit_idle or fit < min_output:
                return self._admit_reply(now, "busy", 0, busy_field, BUSY_RETRY_MS)
            out = min(estimate, fit)
        for b in self.budgets:
            self._hold(b.field, amount(b.dimension.short, input_tokens, out, prices))
        for tag in self.levels:
            self.live_count[tag] = self.live_count.get(tag, 0) + 1
        self.live[rid] = Held(
            fields=tuple(b.field for b in self.budgets),
            dims=tuple(b.dimension.short for b in self.budgets),
            input_tokens=input_tokens,
            output_tokens=out,
            prices=prices,
            expiry_ms=now + self.ttl_ms,
            charge_on_expiry=charge_on_expiry,
            levels=tuple(self.levels),
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
        counts to the window current at ``now``, once per id; 'dup' after that. If expiry
        charged the hold, charge only the difference: in the window it went to, a refund when
        lower; in a later one, only what exceeds it."""
        if rid in self.settled:
            return SettleOutcome("dup")
        held = self.live.pop(rid, None)
        before: dict[str, tuple[int, str]] = {}
        charge = None
        if held is not None:
            self._release(held)
        else:
            charge = self.expired.pop(rid, None)
            if charge is not None:
                before = {f: (charge.charged(d), w) for f, d, w in charge.rows}
        for b in self.budgets:
            a = amount(b.dimension.short, input_tokens, output_tokens, prices)
            window = b.window.bounds(now).id
            if b.field in before:
                prev, prev_window = before[b.field]
                a = a - prev if prev_window == window else max(a - prev, 0)
            key = (b.field, window)
            self.used[key] = self.used.get(key, 0) + a
        self.settled.add(rid)
        remaining, reset = self._state(now)
        return SettleOutcome(
            "ok", held is not None, remaining, reset, expiry_charged=charge is not None
        )

    def usage(self, now: int) -> UsageOutcome:
        """usage.lua: reclaim, then used, reserved and ms to reset per budget, and the live
        reservations of each level."""
        self.reclaim(now)
        return UsageOutcome(
            used=tuple(self.used_now(b, now) for b in self.budgets),
            reserved=tuple(self.reserved_of(b) for b in self.budgets),
            reset_ms=tuple(b.window.bounds(now).end_ms - now for b in self.budgets),
            live_by_level=tuple(self.live_count.get(tag, 0) for tag in self.levels),
        )

    def reclaim(self, now: int) -> int:
        """Settle expired reservations (expiry <= now), earliest first, at most a batch: charge
        the hold of those admitted with ``charge_on_expiry`` (to the window current at ``now``),
        return the others. Then forget expiry charges older than the settle memory."""
        expired = sorted((h.expiry_ms, rid) for rid, h in self.live.items() if h.expiry_ms <= now)
        for _, rid in expired[:RECLAIM_BATCH]:
            held = self.live.pop(rid)
            self._release(held)
            if held.charge_on_expiry:
                self._charge_expired(now, rid, held)
        old = sorted((c.forget_ms, rid) for rid, c in self.expired.items() if c.forget_ms <= now)
        for _, rid in old[:FORGET_BATCH]:
            del self.expired[rid]
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
        for tag in held.levels:
            self.live_count[tag] -= 1
            if self.live_count[tag] <= 0:
                del self.live_count[tag]

    def _charge_expired(self, now: int, rid: str, held: Held) -> None:
        by_field = {b.field: b for b in self.budgets}
        rows = []
        for f, d in zip(held.fields, held.dims, strict=True):
            window = by_field[f].window.bounds(now).id
            a = amount(d, held.input_tokens, held.output_tokens, held.prices)
            self.used[(f, window)] = self.used.get((f, window), 0) + a
            rows.append((f, d, window))
        self.expired[rid] = ExpiryCharge(
            tuple(rows), held.input_tokens, held.output_tokens, held.prices, now + MEMORY_MS
        )

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
