"""Circuit breakers per upstream, their state in the cache (``lua/breaker.lua``).

A Lambda execution environment lives minutes and serves one request at a time: a breaker of
its own would see a handful of failures before it is gone. In the cache, every instance's
failures count toward one breaker, and an upstream one instance found down is skipped by all.

One tenant cannot open it for the others: a failure counts as evidence from the tenant whose
request failed, and the breaker opens only on evidence from two tenants while two tenants use
the upstream (seen within :data:`SEEN_FOR_MS`); a deployment with one tenant opens it on that
tenant's. A failure no tenant shaped (no connection could be opened) is evidence alone. Which
failures count at all is decided by the caller (:mod:`hardcap_core.gateway.failover`).

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
from hardcap_core.ledger.contract import REPLIES, BreakerArgs, encode, named
from hardcap_core.ledger.keys import Keyspace
from hardcap_core.ledger.limits import (
    BREAKER_LOCAL_CLOSED_S,
    BREAKER_PROBE_TTL_MS,
    BREAKER_SEEN_FOR_MS,
)
from hardcap_core.ledger.scripts import Scripts
from hardcap_core.logs import logger

# Module names of the limits (tests shorten them here).
LOCAL_CLOSED_S = BREAKER_LOCAL_CLOSED_S
PROBE_TTL_MS = BREAKER_PROBE_TTL_MS
SEEN_FOR_MS = BREAKER_SEEN_FOR_MS
NO_TENANT = ""  # whose failure it is when no tenant shaped it (script ARGV[6])


@dataclass(frozen=True, slots=True)
class BreakerState:
    allowed: bool
    state: str  # closed | open | half_open
    failures: int  # consecutive
    retry_in_ms: int  # until an open breaker lets a probe through
    tenants: int = 0  # tenants whose failures counted since the last success or opening (0-2)
    needed: int = 1  # tenants whose failures it takes to open it


CLOSED = BreakerState(True, "closed", 0, 0)


class Breakers:
    """The shared breakers of every upstream; one per process."""

    def __init__(self, client: Any, scripts: Scripts, keys: Keyspace) -> None:
        self.client = client
        self.scripts = scripts
        self.keys = keys
        self._closed_at: dict[str, float] = {}  # upstream -> when it was last seen closed, clean

    async def check(self, upstream: str, settings: BreakerSettings, tenant: str) -> BreakerState:
        """May a request of ``tenant`` go to ``upstream`` now? (Takes a probe slot when
        half-open; records that ``tenant`` uses the upstream.)"""
        seen = self._closed_at.get(upstream)
        if seen is not None and time.monotonic() - seen < LOCAL_CLOSED_S:
            return CLOSED
        state = await self._call("check", upstream, settings, tenant)
        if state.state == "closed" and state.failures == 0:
            self._closed_at[upstream] = time.monotonic()
        else:
            self._closed_at.pop(upstream, None)
        return state

    async def succeeded(
        self, upstream: str, settings: BreakerSettings, before: BreakerState, tenant: str
    ) -> None:
        """A request to ``upstream`` got its answer; ``before`` is what :meth:`check` said."""
        if before.state != "closed" or before.failures > 0:
            await self._call("ok", upstream, settings, tenant)

    async def failed(
        self, upstream: str, settings: BreakerSettings, tenant: str | None
    ) -> BreakerState:
        """A request to ``upstream`` failed the way a breaker counts; ``tenant`` is whose
        request it was, None when no tenant shaped the failure (evidence enough alone)."""
        self._closed_at.pop(upstream, None)
        state = await self._call("fail", upstream, settings, tenant or NO_TENANT)
        if state.state == "closed" and state.failures >= settings.failures:
            # Enough failures, but from fewer tenants than it takes: the operator may look.
            logger.info("breaker held closed: the failures are one tenant's",
                        extra={"upstream": upstream, "failures": state.failures,
                               "tenant": tenant})  # fmt: skip
        return state

    async def released(
        self, upstream: str, settings: BreakerSettings, before: BreakerState, tenant: str
    ) -> None:
        """A request to ``upstream`` ended in a way that says nothing of the upstream (a 4xx,
        a timeout it asked for): it frees the probe slot :meth:`check` gave it, if any."""
        if before.state == "half_open":
            await self._call("pass", upstream, settings, tenant)

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

    async def _call(self, op: str, upstream: str, s: BreakerSettings, tenant: str) -> BreakerState:
        keys, args = encode(
            BreakerArgs(
                breaker=self.keys.breaker(upstream), op=op, failures=s.failures,
                cooldown_ms=int(s.cooldown_seconds * 1000), probes=s.half_open_probes,
                probe_ttl_ms=PROBE_TTL_MS, tenant=tenant, seen_for_ms=SEEN_FOR_MS,
            )
        )  # fmt: skip
        try:
            reply = await guarded(self.scripts.breaker(keys=keys, args=args))
        except (LedgerUnavailable, LedgerProtocolError) as e:
            logger.warning("breaker not reachable; letting the request through",
                           extra={"upstream": upstream, "error": str(e)})  # fmt: skip
            return CLOSED
        return parse_reply(reply)


def parse_reply(reply: Any) -> BreakerState:
    """``breaker.lua``'s reply (:data:`.contract.REPLIES`, as its header gives it)."""
    f = named(REPLIES["breaker"][""], reply)
    return BreakerState(
        bool(int(f["allowed"])), str(f["state"]), int(f["failures"]), int(f["ms until"]),
        int(f["tenants"]), int(f["needed"]),
    )  # fmt: skip
