"""How many output tokens to reserve at admission.

- ``max_tokens``: the request's cap. Never overshoots; holds ~6x what a typical reply uses.
- ``fixed``: a constant, for routes whose replies have a known size.
- ``p95``: the rolling 95th percentile of the last ~1,000 completed, non-truncated replies of the
  tenant on the route, SHARED by every instance through the budget server. On Lambda each
  execution environment sees too few requests to learn its own. Until the tenant has
  ``min_samples`` replies it reserves the route's consensus (the upper median of the tenants'
  own p95s, once at least ``min_tenants`` have one), else max_tokens. So no tenant's traffic can
  shrink or inflate another's estimate: its own sample is its own, and in the consensus it has
  one vote, which moves the upper median of three or more only between the others' values.

Every estimate is capped by the request's max_tokens. Truncated replies never enter the sample:
they would drag the estimate down, cause more truncation, and spiral. When the budget server
cannot be read, the estimate is max_tokens, the conservative value: the admission that follows
meets the tenant's fail mode, the estimate never decides it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from hardcap_core.errors import LedgerUnavailable
from hardcap_core.ledger.client import Ledger
from hardcap_core.ledger.limits import (
    ESTIMATOR_MIN_TENANTS,
    ESTIMATOR_QUANTILE,
    ESTIMATOR_RECOMPUTE_EVERY,
    ESTIMATOR_SAMPLES_KEPT,
)
from hardcap_core.ledger.replies import Consensus
from hardcap_core.logs import logger

SAMPLES_KEPT = ESTIMATOR_SAMPLES_KEPT
QUANTILE = ESTIMATOR_QUANTILE
RECOMPUTE_EVERY = ESTIMATOR_RECOMPUTE_EVERY
MIN_TENANTS = ESTIMATOR_MIN_TENANTS  # votes the consensus needs before a tenant without a sample


class Estimator(Protocol):
    async def estimate(self, route: str, max_tokens: int, *, tenant: str | None = None) -> int:
        """Output tokens to reserve for ``tenant``'s request on ``route`` capped at
        ``max_tokens``. Never raises :class:`LedgerUnavailable`."""
        ...

    async def observe(
        self, route: str, output_tokens: int, *, truncated: bool, tenant: str | None = None
    ) -> None:
        """Learn from one finished reply of ``tenant``. May raise :class:`LedgerUnavailable`
        (a lost sample is harmless)."""
        ...


class MaxTokensEstimator:
    async def estimate(self, route: str, max_tokens: int, *, tenant: str | None = None) -> int:
        return max_tokens

    async def observe(
        self, route: str, output_tokens: int, *, truncated: bool, tenant: str | None = None
    ) -> None:
        return None


@dataclass(frozen=True)
class FixedEstimator:
    tokens: int

    async def estimate(self, route: str, max_tokens: int, *, tenant: str | None = None) -> int:
        return max(1, min(self.tokens, max_tokens))

    async def observe(
        self, route: str, output_tokens: int, *, truncated: bool, tenant: str | None = None
    ) -> None:
        return None


class SharedP95Estimator:
    """Rolling quantile per route and tenant, kept on the budget server by
    ``estimator_record.lua``, with the route's consensus of tenants by ``estimator_vote.lua``.

    Called with no tenant, it keeps one pooled sample per route (every caller without a tenant
    shares it). Values are cached per process for ``cache_seconds``: a fresh Lambda environment
    reads them once, then every few seconds, instead of on every request.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        min_samples: int = 50,
        cache_seconds: float = 2.0,
        keep: int = SAMPLES_KEPT,
        quantile: float = QUANTILE,
        min_tenants: int = MIN_TENANTS,
    ) -> None:
        self.ledger = ledger
        self.min_samples = min_samples
        self.cache_seconds = cache_seconds
        self.keep = keep
        self.quantile = quantile
        self.min_tenants = min_tenants
        # (route, tenant) -> (read at, value, n)
        self._cache: dict[tuple[str, str | None], tuple[float, int, int]] = {}
        self._consensus: dict[str, tuple[float, Consensus]] = {}
        self._voted: dict[tuple[str, str], int] = {}  # (route, tenant) -> the value last voted
        # While the server is unreachable, every estimate is max_tokens without asking again
        # (until this monotonic time), so a request does not wait out a timeout twice.
        self._down_until = 0.0

    async def estimate(self, route: str, max_tokens: int, *, tenant: str | None = None) -> int:
        if time.monotonic() < self._down_until:
            return max_tokens
        try:
            value, n = await self.current(route, tenant)
            if n >= self.min_samples and value > 0:
                return max(1, min(value, max_tokens))
            if tenant is None:
                return max_tokens
            consensus = await self.consensus(route)
        except LedgerUnavailable as e:
            logger.warning(
                "output estimate unavailable: reserving max_tokens",
                extra={"route": route, "error": str(e)},
            )
            self._down_until = time.monotonic() + self.cache_seconds
            return max_tokens
        if consensus.tenants >= self.min_tenants and consensus.value > 0:
            return max(1, min(consensus.value, max_tokens))
        return max_tokens

    async def current(self, route: str, tenant: str | None = None) -> tuple[int, int]:
        """(quantile value, sample size) of ``tenant`` on ``route`` (no tenant: the pooled
        sample), from the cache or the server."""
        hit = self._cache.get((route, tenant))
        if hit and time.monotonic() - hit[0] < self.cache_seconds:
            return hit[1], hit[2]
        stats = await self.ledger.estimator_stats(route, tenant)
        self._cache[(route, tenant)] = (time.monotonic(), stats.value, stats.samples)
        return stats.value, stats.samples

    async def consensus(self, route: str) -> Consensus:
        """The route's consensus of tenants, from the cache or the server."""
        hit = self._consensus.get(route)
        if hit and time.monotonic() - hit[0] < self.cache_seconds:
            return hit[1]
        found = await self.ledger.output_consensus(route)
        self._consensus[route] = (time.monotonic(), found)
        return found

    async def observe(
        self, route: str, output_tokens: int, *, truncated: bool, tenant: str | None = None
    ) -> None:
        if truncated or output_tokens <= 0:
            return
        stats = await self.ledger.record_output(
            route,
            output_tokens,
            keep=self.keep,
            quantile=self.quantile,
            recompute_every=RECOMPUTE_EVERY,
            tenant=tenant,
        )
        now = time.monotonic()
        self._cache[(route, tenant)] = (now, stats.value, stats.samples)
        if tenant is None or stats.samples < self.min_samples or stats.value <= 0:
            return
        # The tenant's vote is its quantile, which the server recomputes every
        # RECOMPUTE_EVERY samples: voting again an unchanged value changes nothing, and would
        # cost every completed reply a second round trip. Voted when it changed, or when this
        # process's view of the consensus is older than the cache allows.
        key = (route, tenant)
        known = self._consensus.get(route)
        if self._voted.get(key) == stats.value and known and now - known[0] < self.cache_seconds:
            return
        found = await self.ledger.vote_output(route, tenant, stats.value)
        self._voted[key] = stats.value
        self._consensus[route] = (time.monotonic(), found)
