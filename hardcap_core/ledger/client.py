"""The budget ledger: admit -> extend -> settle, each one atomic Lua script on Valkey/Redis.

The invariant ``used + reserved <= limit`` holds after every admit and every extend, for every
budget a request touches, because the server runs one script at a time. (Settle may push used
past a limit: it charges what was really billed. Admit then refuses, and extend never adds to a
budget beyond its limit.) This module turns
scopes into keys and arguments, calls the scripts, and turns replies into typed results;
callers never see a raw reply. Connection failures become :class:`LedgerUnavailable` here and
nowhere else.

Every key of a scope carries the hash tag of the hierarchy's root (``{t:acme}``), so the
scripts run unchanged on a cluster (ElastiCache Serverless is always cluster mode).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from hardcap_core.budgets import LEVEL_BY_SHORT, Budget, Level, Prices, RateLimit, Scope
from hardcap_core.errors import LedgerProtocolError, LedgerUnavailable, ReservationReused
from hardcap_core.ledger.scripts import Scripts

DEFAULT_RESERVATION_TTL_S = 120.0
FREE = Prices()
SETTLE_MEMORY_MS = 24 * 3600 * 1000
_CLOCK_RETRIES = 3


class Refusal(StrEnum):
    """Why an admission was refused; each maps to the 429 code the client sees."""

    BUSY = "budget_busy"  # would fit if nothing were in flight: retry in about a second
    EXCEEDED = "budget_exceeded"  # spent for this window: retry when it resets
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
class Reservation:
    """A live hold on budget, returned by admit and passed back to extend and settle."""

    id: str
    scope: Scope
    prices: Prices
    input_tokens: int
    output_reserved: int


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
    retry_after_ms: int
    budgets: tuple[BudgetState, ...]
    rates: tuple[RateState, ...]
    server_time_ms: int

    @property
    def message(self) -> str:
        what = f"{self.dimension} budget of {self.level}"
        if self.reason is Refusal.BUSY:
            return f"The {what} is held by requests in flight; retry in about a second."
        if self.reason is Refusal.EXCEEDED:
            reset_s = self.retry_after_ms // 1000
            return f"The {what} is spent for this window; it resets in {reset_s} s."
        per = "requests" if self.dimension == "requests" else "tokens"
        return f"Too many {per} per minute for {self.level}; retry in {self.retry_after_ms} ms."


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
    budget: Budget
    budgets: tuple[BudgetState, ...]
    server_time_ms: int


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
    live_reservations: int
    server_time_ms: int


AdmitResult = Admitted | Refused | Unguarded
ExtendResult = Extended | ExtendRefused | ReservationGone


class Keyspace:
    """Key names. Everything of one hierarchy shares the root's hash tag."""

    def __init__(self, prefix: str = "hc") -> None:
        self.prefix = prefix

    def _base(self, scope: Scope) -> str:
        return f"{self.prefix}:{{{scope.root.tag}}}"

    def core(self, scope: Scope) -> list[str]:
        """reserved, res, exp, rl."""
        b = self._base(scope)
        return [f"{b}:reserved", f"{b}:res", f"{b}:exp", f"{b}:rl"]

    def settled(self, scope: Scope, rid: str) -> str:
        return f"{self._base(scope)}:s:{rid}"

    def used(self, scope: Scope, spec: str, window_id: str) -> str:
        return f"{self._base(scope)}:u:{spec}:{window_id}"

    def estimator(self, route: str) -> list[str]:
        b = f"{self.prefix}:{{est:{route}}}"
        return [f"{b}:samples", f"{b}:stats"]


class Ledger:
    """Typed client of the ledger scripts. One per process; safe to share between tasks.

    ``client`` is a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster``.
    """

    def __init__(
        self,
        client: Any,
        *,
        reservation_ttl_s: float = DEFAULT_RESERVATION_TTL_S,
        prefix: str = "hc",
    ) -> None:
        self.client = client
        self.scripts = Scripts.register(client)
        self.keys = Keyspace(prefix)
        self.ttl_ms = int(reservation_ttl_s * 1000)
        # Server time minus local time, learned from every reply; only used to guess which
        # window keys to name. The scripts check the guess against the server's own clock.
        self._offset_ms = 0

    # -- public API ---------------------------------------------------------------------------

    async def admit(
        self,
        scope: Scope,
        *,
        input_tokens: int,
        output_estimate: int,
        min_output: int | None = None,
        prices: Prices = FREE,
        reservation_id: str | None = None,
        fail_open: bool = False,
    ) -> AdmitResult:
        """Check rate limits and every budget of ``scope``; reserve the estimate if it fits.

        Output is reserved up to ``output_estimate``, shrunk to what the budgets still hold, but
        never below ``min_output`` (default: the whole estimate, i.e. no shrinking).
        If the server cannot be reached: :class:`Unguarded` when ``fail_open``, else raise
        :class:`LedgerUnavailable`.
        """
        if input_tokens < 0 or output_estimate < 1:
            raise ValueError("input_tokens must be >= 0 and output_estimate >= 1")
        least = output_estimate if min_output is None else max(1, min(min_output, output_estimate))
        rid = reservation_id or uuid.uuid4().hex
        rates = [
            [r.level.tag, r.requests_per_minute or 0, r.tokens_per_minute or 0]
            for r in scope.rate_limits
        ]
        extra = {
            "r": rates,
            "i": input_tokens,
            "o": output_estimate,
            "mo": least,
            "pi": prices.input_nusd,
            "po": prices.output_nusd,
        }

        def build(now_ms: int) -> tuple[list[str], list[Any]]:
            used_keys, spec = self._budget_spec(scope, now_ms)
            spec.update(extra)
            keys = [*self.keys.core(scope), self.keys.settled(scope, rid), *used_keys]
            return keys, [rid, self.ttl_ms, _dumps(spec)]

        try:
            reply = await self._run(self.scripts.admit, build)
        except LedgerUnavailable as e:
            if fail_open:
                return Unguarded(str(e), rid)
            raise
        now = int(reply[1])
        if reply[0] == "settled":
            raise ReservationReused(f"reservation id {rid!r} was settled already")
        budgets, pos = self._budget_states(scope, reply, 4 if reply[0] != "ok" else 3)
        rate_states = self._rate_states(scope, reply, pos)
        if reply[0] == "ok":
            res = Reservation(rid, scope, prices, input_tokens, int(reply[2]))
            return Admitted(res, budgets, rate_states, now)
        reason = {"busy": Refusal.BUSY, "exceeded": Refusal.EXCEEDED, "rate": Refusal.RATE_LIMITED}
        if reply[0] not in reason:
            raise LedgerProtocolError(f"admit replied {reply[0]!r}")
        what = _text(reply[2])
        level, dimension, budget = self._locate(scope, what)
        return Refused(
            reason[reply[0]], level, dimension, budget, int(reply[3]), budgets, rate_states, now
        )

    async def extend(
        self, reservation: Reservation, tokens: int, *, least: int = 1
    ) -> ExtendResult:
        """Grow ``reservation`` by up to ``tokens`` output tokens (at least ``least``), or refuse.

        ``tokens=0`` only refreshes the expiry (a heartbeat for slow streams).
        """
        if tokens < 0:
            raise ValueError("tokens must be >= 0")
        scope = reservation.scope

        def build(now_ms: int) -> tuple[list[str], list[Any]]:
            used_keys, spec = self._budget_spec(scope, now_ms)
            keys = self.keys.core(scope)[:3] + used_keys
            return keys, [reservation.id, tokens, least, self.ttl_ms, _dumps(spec)]

        reply = await self._run(self.scripts.extend, build)
        now = int(reply[1])
        if reply[0] == "gone":
            return ReservationGone(now)
        if reply[0] == "ok":
            budgets, _ = self._budget_states(scope, reply, 4)
            return Extended(int(reply[2]), int(reply[3]), budgets, now)
        if reply[0] == "no":
            budgets, _ = self._budget_states(scope, reply, 3)
            _, _, budget = self._locate(scope, _text(reply[2]))
            if budget is None:
                raise LedgerProtocolError(f"extend named an unknown budget {reply[2]!r}")
            return ExtendRefused(budget, budgets, now)
        raise LedgerProtocolError(f"extend replied {reply[0]!r}")

    async def settle(
        self, reservation: Reservation, *, input_tokens: int, output_tokens: int
    ) -> Settled:
        """Release ``reservation`` and charge the real counts. Retry-safe: never charges twice."""
        scope = reservation.scope
        prices = reservation.prices

        def build(now_ms: int) -> tuple[list[str], list[Any]]:
            used_keys, spec = self._budget_spec(scope, now_ms)
            spec.update(pi=prices.input_nusd, po=prices.output_nusd)
            keys = [*self.keys.core(scope), self.keys.settled(scope, reservation.id), *used_keys]
            args = [
                reservation.id,
                max(input_tokens, 0),
                max(output_tokens, 0),
                SETTLE_MEMORY_MS,
                _dumps(spec),
            ]
            return keys, args

        reply = await self._run(self.scripts.settle, build)
        now = int(reply[1])
        if reply[0] == "dup":
            return Settled(True, False, (), now)
        if reply[0] != "ok":
            raise LedgerProtocolError(f"settle replied {reply[0]!r}")
        budgets, _ = self._budget_states(scope, reply, 3)
        return Settled(False, bool(int(reply[2])), budgets, now)

    async def usage(self, scope: Scope) -> Usage:
        """Used, reserved and reset of every budget in ``scope`` (expired holds reclaimed first)."""

        def build(now_ms: int) -> tuple[list[str], list[Any]]:
            used_keys, spec = self._budget_spec(scope, now_ms)
            return self.keys.core(scope)[:3] + used_keys, [_dumps(spec)]

        reply = await self._run(self.scripts.usage, build)
        rows = []
        for i, b in enumerate(scope.budgets):
            base = 4 + i * 3
            rows.append(UsageRow(b, int(reply[base]), int(reply[base + 1]), int(reply[base + 2])))
        return Usage(tuple(rows), int(reply[2]), int(reply[1]))

    async def ping(self) -> None:
        """Raise :class:`LedgerUnavailable` unless the server answers."""
        try:
            await self.client.ping()
        except (RedisConnectionError, RedisTimeoutError, RedisClusterException, OSError) as e:
            raise LedgerUnavailable(f"budget server unreachable: {e}") from e

    # -- internals ----------------------------------------------------------------------------

    def server_now_ms(self) -> int:
        """Best guess of the server's clock, from the offset seen in earlier replies."""
        return int(time.time() * 1000) + self._offset_ms

    def _budget_spec(self, scope: Scope, now_ms: int) -> tuple[list[str], dict[str, Any]]:
        windows = scope.windows()
        index = {w.spec: i for i, w in enumerate(windows)}
        bounds = [w.bounds(now_ms) for w in windows]
        used_keys = [self.keys.used(scope, b.spec, b.id) for b in bounds]
        rows = [
            [b.field, b.dimension.short, b.limit, index[b.window.spec] + 1] for b in scope.budgets
        ]
        return used_keys, {"b": rows, "w": [[b.start_ms, b.end_ms] for b in bounds]}

    async def _run(self, script: Any, build: Any) -> list[Any]:
        """Call ``script`` with keys and args built for the server's time; retry on 'clock'."""
        for _ in range(_CLOCK_RETRIES):
            keys, args = build(self.server_now_ms())
            try:
                reply = await script(keys=keys, args=args)
            except (RedisConnectionError, RedisTimeoutError, RedisClusterException, OSError) as e:
                raise LedgerUnavailable(f"budget server unreachable: {e}") from e
            except ResponseError as e:
                raise LedgerProtocolError(f"script error: {e}") from e
            reply = [_text(x) if isinstance(x, bytes) else x for x in reply]
            self._offset_ms = int(reply[1]) - int(time.time() * 1000)
            if reply[0] != "clock":
                return reply
        raise LedgerUnavailable("the budget server's clock keeps moving across a window boundary")

    @staticmethod
    def _budget_states(
        scope: Scope, reply: Sequence[Any], pos: int
    ) -> tuple[tuple[BudgetState, ...], int]:
        n = int(reply[pos])
        out = []
        for i in range(n):
            out.append(
                BudgetState(
                    scope.budgets[i], int(reply[pos + 1 + 2 * i]), int(reply[pos + 2 + 2 * i])
                )
            )
        return tuple(out), pos + 1 + 2 * n

    @staticmethod
    def _rate_states(scope: Scope, reply: Sequence[Any], pos: int) -> tuple[RateState, ...]:
        if pos >= len(reply):
            return ()
        n = int(reply[pos])
        out = []
        for i, lim in enumerate(scope.rate_limits[:n]):
            vals = [int(v) for v in reply[pos + 1 + 4 * i : pos + 5 + 4 * i]]
            out.append(RateState(lim, *[None if v == -1 else v for v in vals]))
        return tuple(out)

    @staticmethod
    def _locate(scope: Scope, what: str) -> tuple[Level, str, Budget | None]:
        """Turn a script's ``what`` (budget field or '<tag>:rpm|tpm') into level and dimension."""
        for b in scope.budgets:
            if b.field == what:
                return b.level, b.dimension.value, b
        kind, ident, rest = what.split(":", 2)
        if kind not in LEVEL_BY_SHORT or rest not in ("rpm", "tpm"):
            raise LedgerProtocolError(f"a script named an unknown budget or limit {what!r}")
        level = Level(LEVEL_BY_SHORT[kind], ident)
        return level, "requests" if rest == "rpm" else "tokens", None


def _dumps(spec: dict[str, Any]) -> str:
    return json.dumps(spec, separators=(",", ":"))


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
