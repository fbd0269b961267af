"""Circuit breakers per upstream, their state in the cache (``lua/breaker.lua``).

A Lambda execution environment lives minutes and serves one request at a time: a breaker of
its own would see a handful of failures before it is gone. In the cache, every instance's
failures count toward one breaker, and an upstream one instance found down is skipped by all.

A breaker is advisory: when the cache cannot be reached it lets requests through (the
upstream's own answer then decides), and the happy path costs one round trip per request —
none while a closed breaker with no failures was checked in the last
:data:`LOCAL_CLOSED_S` (per process), which bounds how late an instance sees it open.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hardcap_core.config.settings import BreakerSettings
from hardcap_core.errors import LedgerProtocolError, LedgerUnavailable
from hardcap_core.ledger.connection import guarded
from hardcap_core.ledger.keys import Keyspace
from hardcap_core.ledger.scripts import Scripts
from hardcap_core.logs import logger

LOCAL_CLOSED_S = 0.25
PROBE_TTL_MS = 30_000  # a probe that never reported is forgotten after this long


@dataclass(frozen=True, slots=True)
class BreakerState:
    allowed: bool
    state: str  # closed | open | half_open
    failures: int  # consecutive
    retry_in_ms: int  # until an open breaker lets a probe through


CLOSED = BreakerState(True, "closed", 0, 0)


class Breakers:
    """The shared breakers of every upstream; one per process."""

    def __init__(self, client: Any, scripts: Scripts, keys: Keyspace) -> None:
        self.client = client
        self.scripts = scripts
        self.keys = keys
        self._closed_at: dict[str, float] = {}  # upstream -> when it was last seen closed, clean

    async def check(self, upstream: str, settings: BreakerSettings) -> BreakerState:
        """May a request go to ``upstream`` now? (Takes a probe slot when half-open.)"""
        seen = self._closed_at.get(upstream)
        if seen is not None and time.monotonic() - seen < LOCAL_CLOSED_S:
            return CLOSED
        state = await self._call("check", upstream, settings)
        if state.state == "closed" and state.failures == 0:
            self._closed_at[upstream] = time.monotonic()
        else:
            self._closed_at.pop(upstream, None)
        return state

    async def succeeded(
        self, upstream: str, settings: BreakerSettings, before: BreakerState
    ) -> None:
        """A request to ``upstream`` got its answer; ``before`` is what :meth:`check` said."""
        if before.state != "closed" or before.failures > 0:
            await self._call("ok", upstream, settings)

    async def failed(self, upstream: str, settings: BreakerSettings) -> BreakerState:
        """A request to ``upstream`` failed the way a breaker counts (429, 5xx, timeout, no
        connection)."""
        self._closed_at.pop(upstream, None)
        return await self._call("fail", upstream, settings)

    async def states(
        self, upstreams: Iterable[tuple[str, BreakerSettings]]
    ) -> dict[str, BreakerState]:
        """What each breaker says now, without taking a probe slot (for the usage endpoint)."""
        out = {}
        for name, _ in upstreams:
            raw = await guarded(self.client.hmget(self.keys.breaker(name), "s", "f"))
            code = raw[0].decode() if isinstance(raw[0], bytes) else raw[0]
            state = {"o": "open", "h": "half_open"}.get(code or "c", "closed")
            out[name] = BreakerState(state != "open", state, int(raw[1] or 0), 0)
        return out

    async def _call(self, op: str, upstream: str, s: BreakerSettings) -> BreakerState:
        args = [op, s.failures, int(s.cooldown_seconds * 1000), s.half_open_probes, PROBE_TTL_MS]
        try:
            reply = await guarded(
                self.scripts.breaker(keys=[self.keys.breaker(upstream)], args=args)
            )
        except (LedgerUnavailable, LedgerProtocolError) as e:
            logger.warning("breaker not reachable; letting the request through",
                           extra={"upstream": upstream, "error": str(e)})  # fmt: skip
            return CLOSED
        state = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        return BreakerState(bool(int(reply[0])), state, int(reply[2]), int(reply[3]))
