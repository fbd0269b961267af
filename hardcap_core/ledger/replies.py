"""What the ledger scripts answer, as typed values, and one named parser per script reply.

The scripts' reply layouts are documented in each ``lua/*.lua`` header and declared once, by
name, in :data:`.contract.REPLIES`; :class:`ReplyReader` walks a reply front to back through
them, so no caller does offset arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from hardcap_core.budgets import (
    DIMENSION_BY_SHORT,
    LEVEL_BY_SHORT,
    NANO_USD_PER_USD,
    Budget,
    Dimension,
    Level,
    LevelKind,
    Prices,
    RateLimit,
    Scope,
)
from hardcap_core.errors import (
    ConfigStale,
    LeaseNotFound,
    LedgerProtocolError,
    ReservationReused,
)
from hardcap_core.ledger.allowances import SharedBudget, SharedLimits
from hardcap_core.ledger.contract import REPLIES, named


class Refusal(StrEnum):
    """Why an admission was refused; each maps to the 429 code the client sees."""

    BUSY = "budget_busy"  # would fit if nothing were in flight: retry in about a second
    # spent for this window: retry when it resets; or (Refused.never_fits) larger than the
    # whole budget, so no retry helps
    EXCEEDED = "budget_exceeded"
    RATE_LIMITED = "rate_limited"  # requests or tokens per minute: retry when it refills


@dataclass(frozen=True, slots=True)
class BudgetState:
    budget: Budget
    remaining: int  # limit - used - reserved; negative after an allowed overshoot
    reset_ms: int


@dataclass(frozen=True, slots=True)
class RateState:
    limit: RateLimit
    requests_remaining: int | None
    requests_reset_ms: int | None
    tokens_remaining: int | None
    tokens_reset_ms: int | None


@dataclass(frozen=True, slots=True)
class ReservationMeta:
    """What a reservation record carries for the usage record its settle will write."""

    route: str = ""
    model: str = ""  # the upstream model the request was sent to
    key_id: str = ""
    request_id: str = ""
    tenant: str = ""  # the tenant id; Ledger.admit fills it from the scope when empty
    org: str = ""  # the org id, if any; Ledger.admit fills it from the scope when empty
    provider: str = ""  # the upstream (its config name) the request was sent to
    user: str = ""  # the user level's id (tenant~user), if the request has one
    lease: str = ""  # the lease the request draws from (x-hardcap-lease), if any

    def record(self) -> dict[str, str]:
        """The fields as the scripts store them (lib.lua: meta; short names: it is JSON). ``us``
        only when there is a user: a record without one stays format 2, which a rollup of the
        version before reads."""
        fields = {
            "rt": self.route,
            "md": self.model,
            "k": self.key_id,
            "rq": self.request_id,
            "tn": self.tenant,
            "og": self.org,
            "pv": self.provider,
        }
        if self.user:
            fields["us"] = self.user
        if self.lease:
            fields["ls"] = self.lease  # lib.lua: format 4, written only with a lease
        return fields


@dataclass(frozen=True, slots=True)
class SettleNote:
    """What a settle's usage record says beyond the counts it charges."""

    outcome: str = "completed"  # an Outcome value
    estimate: bool = False  # the counts are the gateway's estimate (a cut stream), not reported
    reasoning_tokens: int = 0  # part of the output tokens, as the provider reported them
    cached_input_tokens: int = 0  # part of the input tokens, as the provider reported them
    model: str = ""  # the model that served it, if not the reservation's (a fallback)
    provider: str = ""  # the upstream that served it, if not the reservation's

    def record(self, meta: ReservationMeta) -> dict[str, Any]:
        """settle.lua's ``u`` argument."""
        m = meta.record()
        if self.model:
            m["md"] = self.model
        if self.provider:
            m["pv"] = self.provider
        return {
            "m": m,
            "oc": self.outcome,
            "est": 1 if self.estimate else 0,
            "rs": max(self.reasoning_tokens, 0),
            "ci": max(self.cached_input_tokens, 0),
        }


NO_META = ReservationMeta()


@dataclass(frozen=True, slots=True)
class Reservation:
    """A live hold on budget, returned by admit and passed back to extend and settle."""

    id: str
    scope: Scope
    prices: Prices
    input_tokens: int
    output_reserved: int
    meta: ReservationMeta = NO_META
    # The limits spanning tenants it is held on too (its route's and upstream's), if any.
    shared: SharedLimits | None = None


@dataclass(frozen=True, slots=True)
class Admitted:
    reservation: Reservation
    budgets: tuple[BudgetState, ...]
    rates: tuple[RateState, ...]
    server_time_ms: int


@dataclass(frozen=True, slots=True)
class Refused:
    reason: Refusal
    level: Level
    dimension: str  # a budget dimension, or "requests" / "tokens" for rate limits
    budget: Budget | None
    retry_after_ms: int  # 0 when never_fits: no wait helps
    budgets: tuple[BudgetState, ...]
    rates: tuple[RateState, ...]
    server_time_ms: int
    # The request's input and least output exceed ``budget``'s whole limit even with nothing
    # used (reason EXCEEDED): it can never be admitted as it is, whatever the window.
    never_fits: bool = False
    lease: str = ""  # the lease whose envelope refused (dimension: "tokens" or "usd"), if one did
    # The route's or upstream's limit over every tenant that refused (``level``: the hierarchy
    # whose allowance of it is spent), if one did.
    shared: SharedBudget | None = None

    @property
    def message(self) -> str:
        if self.lease:
            return _lease_message(self)
        if self.shared is not None:
            return _shared_message(self, self.shared)
        what = f"{self.dimension} budget of {self.level}"
        if self.never_fits and self.budget is not None:
            return (
                f"This request is larger than the whole {what} ({_limit(self.budget)}), even "
                "with nothing used: send fewer input tokens or a lower max_tokens."
            )
        if self.reason is Refusal.BUSY:
            return f"The {what} is held by requests in flight; retry in about a second."
        if self.reason is Refusal.EXCEEDED:
            reset_s = self.retry_after_ms // 1000
            left = self.left()
            if left > 0 and self.budget is not None:
                # Not spent: what is left is less than this request needs. After a cut, a
                # long prompt (a coding agent's) would otherwise be told the budget is gone
                # when a shorter request still fits.
                return (
                    f"The {what} has {_amount(self.budget, left)} left, less than this request "
                    "needs (its input plus the least output it is admitted with): send fewer "
                    f"input tokens, or wait for the window to reset in {reset_s} s."
                )
            return f"The {what} is spent for this window; it resets in {reset_s} s."
        per = "requests" if self.dimension == "requests" else "tokens"
        return f"Too many {per} per minute for {self.level}; retry in {self.retry_after_ms} ms."

    def left(self) -> int:
        """What the refusing budget has left after what is used and held (0 if unknown)."""
        for state in self.budgets:
            if state.budget == self.budget:
                return max(state.remaining, 0)
        return 0


@dataclass(frozen=True, slots=True)
class Queued:
    """The request waits in its tenant's admission queue for holds in flight to settle; it is
    refused ``budget_busy`` (``as_refused``) if it stops waiting."""

    ahead: int  # requests waiting ahead of it (0: it is first in line)
    as_refused: Refused
    server_time_ms: int


@dataclass(frozen=True, slots=True)
class Unguarded:
    """The budget server could not be reached and the tenant fails open: the request goes ahead
    with no reservation. (Fail closed, the default, raises :class:`LedgerUnavailable` instead.)"""

    reason: str
    reservation_id: str


@dataclass(frozen=True, slots=True)
class Extended:
    granted: int
    output_reserved: int
    budgets: tuple[BudgetState, ...]
    server_time_ms: int


@dataclass(frozen=True, slots=True)
class ExtendRefused:
    """The extension does not fit: in ``budget``, or (``budget`` None) in the tokens-per-minute
    window of ``level``. The stream stops within what it holds either way."""

    budget: Budget | None
    budgets: tuple[BudgetState, ...]
    server_time_ms: int
    level: Level | None = None  # whose limit refused: the budget's level, or the tpm's
    shared: SharedBudget | None = None  # a route's or upstream's limit over every tenant refused

    @property
    def rate_limited(self) -> bool:
        """True when a tokens-per-minute window refused, not a budget."""
        return self.budget is None


@dataclass(frozen=True, slots=True)
class ReservationGone:
    """The reservation expired and was reclaimed; it is not resurrected. Stop generating."""

    server_time_ms: int


@dataclass(frozen=True, slots=True)
class Settled:
    duplicate: bool  # this id was settled before; nothing was charged this time
    had_reservation: bool  # False if it expired and was reclaimed first (usage still charged)
    budgets: tuple[BudgetState, ...]
    server_time_ms: int
    # The hold had expired and been CHARGED at expiry (admitted with charge_on_expiry) as an
    # estimate; this settle charged only the difference to the real counts (a refund in the
    # same window, never a refund into a later one). The usage record marks such a charge.
    expiry_charged: bool = False


@dataclass(frozen=True, slots=True)
class UsageRow:
    budget: Budget
    used: int
    reserved: int
    reset_ms: int

    @property
    def remaining(self) -> int:
        return self.budget.limit - self.used - self.reserved


@dataclass(frozen=True, slots=True)
class Usage:
    rows: tuple[UsageRow, ...]
    # Live reservations of the scope's tenant (its keys' requests in flight; without a tenant
    # level, of the scope's first level): never the siblings' in the same org.
    live_reservations: int
    server_time_ms: int
    live_by_level: tuple[tuple[Level, int], ...] = ()  # per level of the scope, key first
    rates: tuple[RateState, ...] = ()  # asked for (Ledger.usage(rates=True)): each rate limit

    def live_of(self, kind: LevelKind) -> int | None:
        """Live reservations holding on the scope's level of ``kind`` (None: no such level)."""
        return next((n for lv, n in self.live_by_level if lv.kind is kind), None)


AdmitResult = Admitted | Refused | Queued | Unguarded
ExtendResult = Extended | ExtendRefused | ReservationGone


@dataclass(frozen=True, slots=True)
class EstimatorStats:
    """A route's shared output-length quantile and how many replies it is drawn from."""

    value: int
    samples: int


@dataclass(frozen=True, slots=True)
class Consensus:
    """The upper median of the tenants' own quantiles on a route, and how many tenants voted."""

    value: int
    tenants: int


REFUSALS = {
    "busy": Refusal.BUSY,
    "exceeded": Refusal.EXCEEDED,
    "never": Refusal.EXCEEDED,
    "rate": Refusal.RATE_LIMITED,
}


class ReplyReader:
    """Reads a script reply front to back: status, server time, then fields in order."""

    def __init__(
        self, scope: Scope, reply: Sequence[Any], shared: SharedLimits | None = None
    ) -> None:
        self.scope = scope
        self.shared = shared  # rows after the scope's own (plan.py): limits spanning tenants
        self.reply = reply
        self.pos = 2
        self.status = str(reply[0])
        self.now_ms = int(reply[1])

    def fields(self, script: str) -> dict[str, Any]:
        """The named fields of this reply (``script``'s layout for its status) that follow the
        server time, up to its first group (read next by :meth:`budget_states` and
        :meth:`rate_states`)."""
        out = named(REPLIES[script][self.status][1:], self.reply, self.pos)
        self.pos += len(out)
        return out

    def int(self) -> int:
        value = int(self.reply[self.pos])
        self.pos += 1
        return value

    def text(self) -> str:
        value = self.reply[self.pos]
        self.pos += 1
        return value.decode() if isinstance(value, bytes) else str(value)

    def budget_states(self) -> tuple[BudgetState, ...]:
        """<budget state>: n, then n pairs (remaining, reset_ms) in the scope's budget order."""
        n = self.int()
        at, budgets = self.pos, self.scope.budgets
        values = [int(v) for v in self.reply[at : at + 2 * n]]
        self.pos = at + 2 * n
        n = min(n, len(budgets))  # the shared rows' states are this hierarchy's share: not shown
        return tuple(BudgetState(budgets[i], values[2 * i], values[2 * i + 1]) for i in range(n))

    def rate_states(self) -> tuple[RateState, ...]:
        """<rate state>: m, then m quads (rpm left, rpm reset, tpm left, tpm reset); -1 unset."""
        if self.pos >= len(self.reply):
            return ()
        n = self.int()
        out = []
        for limit in self.scope.rate_limits[:n]:
            at = self.pos
            self.pos = at + 4
            values = [None if v == -1 else v for v in map(int, self.reply[at : at + 4])]
            out.append(RateState(limit, *values))
        return tuple(out)

    def locate(self, what: str) -> tuple[Level, str, Budget | None]:
        """A script's ``what`` (a budget field, '<level tag>:rpm|tpm' or a lease's
        'l:<id>:tokens|usd', which names the scope's first level) as level and dimension."""
        if what.startswith(LEASE_PREFIX):
            return self.scope.levels[0], what.rsplit(":", 1)[-1], None
        for b in self.scope.budgets:
            if b.field == what:
                return b.level, b.dimension.value, b
        found = self.found(what)
        if found is not None:  # a limit spanning tenants: this hierarchy's allowance refused
            per = {"rpm": "requests", "tpm": "tokens"}.get(found.measure)
            return self.scope.root, per or DIMENSION_BY_SHORT[found.dim].value, None
        kind, ident, rest = what.split(":", 2) if what.count(":") >= 2 else ("", "", "")
        if kind not in LEVEL_BY_SHORT or rest not in ("rpm", "tpm"):
            raise LedgerProtocolError(f"a script named an unknown budget or limit {what!r}")
        level = Level(LEVEL_BY_SHORT[kind], ident)
        return level, "requests" if rest == "rpm" else "tokens", None

    def found(self, what: str) -> SharedBudget | None:
        """The shared row ``what`` names, if it names one."""
        return self.shared.find(what) if self.shared is not None else None

    def unexpected(self, script: str) -> LedgerProtocolError:
        return LedgerProtocolError(f"{script} replied {self.status!r}")


def parse_admit(reply: Sequence[Any], scope: Scope, reservation: Reservation) -> AdmitResult:
    """admit.lua's reply; ``reservation`` is the hold asked for (its output is the estimate)."""
    r = ReplyReader(scope, reply, reservation.shared)
    if r.status == "settled":
        raise ReservationReused(f"reservation id {reservation.id!r} was settled already")
    if r.status == "expired":
        raise ReservationReused(f"reservation id {reservation.id!r} expired and was charged")
    if r.status == "config":
        raise ConfigStale(int(r.fields("admit")["version"]))
    if r.status == "nolease":
        raise LeaseNotFound(f"The lease '{reservation.meta.lease}' does not exist or has ended.")
    if r.status == "ok":
        reserved = int(r.fields("admit")["output_reserved"])
        budgets = r.budget_states()
        held = Reservation(
            reservation.id, scope, reservation.prices, reservation.input_tokens, reserved,
            reservation.meta, reservation.shared,
        )  # fmt: skip
        return Admitted(held, budgets, r.rate_states(), r.now_ms)
    if r.status == "queued":
        f = r.fields("admit")
        what, ahead = str(f["what"]), int(f["waiting_ahead"])
        level, dimension, budget = r.locate(what)
        busy = Refused(
            Refusal.BUSY, level, dimension, budget, 1000, r.budget_states(), r.rate_states(),
            r.now_ms, shared=r.found(what),
        )  # fmt: skip
        return Queued(ahead, busy, r.now_ms)
    if r.status not in REFUSALS:
        raise r.unexpected("admit")
    f = r.fields("admit")
    what, retry_after_ms = str(f["what"]), int(f["retry_after_ms"])
    level, dimension, budget = r.locate(what)
    budgets = r.budget_states()
    reason, shared = REFUSALS[r.status], r.found(what)
    if shared is not None and shared.measure in ("rpm", "tpm") and r.status in ("exceeded", "busy"):
        # A shared per-minute rate: what its minute holds settles into it, so only the next
        # minute helps.
        reason = Refusal.RATE_LIMITED
        retry_after_ms = max(shared.window.bounds(r.now_ms).end_ms - r.now_ms, 1)
    return Refused(
        reason, level, dimension, budget, retry_after_ms, budgets, r.rate_states(),
        r.now_ms, never_fits=r.status == "never", lease=lease_of(what), shared=shared,
    )  # fmt: skip


def parse_extend(
    reply: Sequence[Any], scope: Scope, shared: SharedLimits | None = None
) -> ExtendResult:
    r = ReplyReader(scope, reply, shared)
    if r.status == "gone":
        return ReservationGone(r.now_ms)
    if r.status == "ok":
        f = r.fields("extend")
        granted, total = int(f["granted"]), int(f["output_reserved_total"])
        return Extended(granted, total, r.budget_states(), r.now_ms)
    if r.status == "no":
        what = str(r.fields("extend")["what"])
        level, dimension, budget = r.locate(what)
        found = r.found(what)
        if budget is None and dimension != "tokens" and not lease_of(what) and found is None:
            raise LedgerProtocolError("extend named a request rate limit")
        return ExtendRefused(budget, r.budget_states(), r.now_ms, level, shared=found)
    raise r.unexpected("extend")


def parse_settle(reply: Sequence[Any], scope: Scope) -> Settled:
    r = ReplyReader(scope, reply)
    if r.status == "dup":
        return Settled(True, False, (), r.now_ms)
    if r.status != "ok":
        raise r.unexpected("settle")
    f = r.fields("settle")
    had, expiry_charged = bool(int(f["had_reservation"])), bool(int(f["expiry_charged"]))
    return Settled(False, had, r.budget_states(), r.now_ms, expiry_charged=expiry_charged)


def parse_usage(reply: Sequence[Any], scope: Scope) -> Usage:
    """usage.lua: {'ok', now_ms, m, m live counts per level, n, then n (used, reserved, reset),
    then <rate state> if asked}."""
    r = ReplyReader(scope, reply)
    if r.status != "ok":
        raise r.unexpected("usage")
    m = r.int()
    live = tuple((level, r.int()) for level in scope.levels[:m])
    n = r.int()
    rows = tuple(UsageRow(b, r.int(), r.int(), r.int()) for b in scope.budgets[:n])
    own = next((c for lv, c in live if lv.kind is LevelKind.TENANT), live[0][1] if live else 0)
    return Usage(rows, own, r.now_ms, live, r.rate_states())


def parse_estimator(reply: Sequence[Any]) -> EstimatorStats:
    """estimator_record.lua's reply."""
    f = named(REPLIES["estimator_record"][""], reply)
    return EstimatorStats(int(f["quantile_value"]), int(f["sample_size"]))


def parse_consensus(reply: Sequence[Any]) -> Consensus:
    """estimator_vote.lua's reply."""
    f = named(REPLIES["estimator_vote"][""], reply)
    return Consensus(int(f["consensus_value"]), int(f["votes"]))


LEASE_PREFIX = "l:"


def lease_of(what: str) -> str:
    """The lease id a script's ``what`` names ('l:<id>:tokens|usd'), or ''."""
    if not what.startswith(LEASE_PREFIX):
        return ""
    return what[len(LEASE_PREFIX) :].rsplit(":", 1)[0]


def _lease_message(r: Refused) -> str:
    what = f"The lease {r.lease} ({'USD' if r.dimension == 'usd' else 'tokens'})"
    if r.never_fits:
        return f"This request is larger than the whole envelope of {what}."
    if r.reason is Refusal.BUSY:
        return f"{what} is held by its requests in flight; retry in about a second."
    return f"{what} is spent: open a new lease."


def _shared_message(r: Refused, shared: SharedBudget) -> str:
    """A refusal by a route's or upstream's limit over every tenant, named ``route:<name>`` /
    ``upstream:<name>``."""
    what = f"limit of {shared.owner} ({shared.describe()}, shared by every tenant)"
    if r.never_fits:
        return (
            f"This request is larger than the whole {what}, even with nothing used: send "
            "fewer input tokens or a lower max_tokens."
        )
    if r.reason is Refusal.BUSY:
        return f"The {what} is held by requests in flight; retry in about a second."
    if r.reason is Refusal.RATE_LIMITED:
        return f"The {what} is reached for this minute; retry in {r.retry_after_ms} ms."
    return f"The {what} is spent for this window; it resets in {r.retry_after_ms // 1000} s."


def _amount(budget: Budget, amount: int) -> str:
    """An amount of a budget's dimension as a person reads it."""
    if budget.dimension is Dimension.COST_USD:
        return f"${amount / NANO_USD_PER_USD:g}"
    return f"{amount} tokens"


def _limit(budget: Budget) -> str:
    """A budget's limit as a person reads it."""
    w = budget.window
    per = f"{w.seconds} s" if w.kind == "fixed" else w.kind
    if budget.dimension is Dimension.COST_USD:
        return f"${budget.limit / NANO_USD_PER_USD:g} per {per}"
    return f"{budget.limit} tokens per {per}"
