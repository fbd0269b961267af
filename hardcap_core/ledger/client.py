"""The budget ledger: admit -> extend -> settle, each one atomic Lua script on Valkey/Redis.

The invariant ``used + reserved <= limit`` holds after every admit and every extend, for every
budget a request touches, because the server runs one script at a time. (Settle may push used
past a limit: it charges what was really billed. Admit then refuses, and extend never adds to a
budget beyond its limit.) This module turns scopes into keys and arguments and calls the
scripts; :mod:`.replies` turns replies into typed results, so callers never see a raw reply.
Connection failures become :class:`LedgerUnavailable` in :mod:`.connection` and nowhere else.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from hardcap_core.budgets import Prices, Scope
from hardcap_core.errors import LedgerProtocolError, LedgerUnavailable
from hardcap_core.ledger.connection import guarded
from hardcap_core.ledger.keys import Keyspace
from hardcap_core.ledger.replies import (
    NO_META,
    AdmitResult,
    EstimatorStats,
    ExtendResult,
    Reservation,
    ReservationMeta,
    Settled,
    Unguarded,
    Usage,
    parse_admit,
    parse_estimator,
    parse_extend,
    parse_settle,
    parse_usage,
)
from hardcap_core.ledger.scripts import Script, Scripts

DEFAULT_RESERVATION_TTL_S = 120.0
FREE = Prices()
SETTLE_MEMORY_MS = 24 * 3600 * 1000
_CLOCK_RETRIES = 3

Build = Callable[[int], tuple[list[str], list[Any]]]


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
        meta: ReservationMeta = NO_META,
    ) -> AdmitResult:
        """Check rate limits and every budget of ``scope``; reserve the estimate if it fits.

        Output is reserved up to ``output_estimate``, shrunk to what the budgets still hold, but
        never below ``min_output`` (default: the whole estimate, i.e. no shrinking). ``meta``
        goes on the reservation record for the usage record its settle writes.
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
            "m": meta.record(),
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
        asked = Reservation(rid, scope, prices, input_tokens, output_estimate, meta)
        return parse_admit(reply, scope, asked)

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

        return parse_extend(await self._run(self.scripts.extend, build), scope)

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

        return parse_settle(await self._run(self.scripts.settle, build), scope)

    async def usage(self, scope: Scope) -> Usage:
        """Used, reserved and reset of every budget in ``scope`` (expired holds reclaimed first)."""

        def build(now_ms: int) -> tuple[list[str], list[Any]]:
            used_keys, spec = self._budget_spec(scope, now_ms)
            return self.keys.core(scope)[:3] + used_keys, [_dumps(spec)]

        return parse_usage(await self._run(self.scripts.usage, build), scope)

    async def estimator_stats(self, route: str) -> EstimatorStats:
        """The shared output-length quantile of ``route`` (0 and 0 before any sample)."""
        _, stats_key = self.keys.estimator(route)
        raw = await guarded(self.client.hmget(stats_key, "q", "n"))
        return EstimatorStats(int(float(raw[0] or 0)), int(raw[1] or 0))

    async def record_output(
        self, route: str, tokens: int, *, keep: int, quantile: float, recompute_every: int
    ) -> EstimatorStats:
        """Add one completed reply's output length to ``route``'s shared sample."""
        keys = self.keys.estimator(route)
        args: list[Any] = [tokens, keep, quantile, recompute_every]
        return parse_estimator(await guarded(self.scripts.estimator_record(keys=keys, args=args)))

    async def ping(self) -> None:
        """Raise :class:`LedgerUnavailable` unless the server answers."""
        await guarded(self.client.ping())

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

    async def _run(self, script: Script, build: Build) -> list[Any]:
        """Call ``script`` with keys and args built for the server's time; retry on 'clock'."""
        for _ in range(_CLOCK_RETRIES):
            keys, args = build(self.server_now_ms())
            reply = await guarded(script(keys=keys, args=args))
            if not isinstance(reply, list) or len(reply) < 2:
                raise LedgerProtocolError(f"a script replied {reply!r}")
            reply = [x.decode() if isinstance(x, bytes) else x for x in reply]
            self._offset_ms = int(reply[1]) - int(time.time() * 1000)
            if reply[0] != "clock":
                return reply
        raise LedgerUnavailable("the budget server's clock keeps moving across a window boundary")


def _dumps(spec: dict[str, Any]) -> str:
    return json.dumps(spec, separators=(",", ":"))
