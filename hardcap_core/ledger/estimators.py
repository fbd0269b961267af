"""How many output tokens to reserve at admission.

- ``max_tokens``: the request's cap. Never overshoots; holds ~6x what a typical reply uses.
- ``fixed``: a constant, for routes whose replies have a known size.
- ``p95``: the rolling 95th percentile of the last ~1,000 completed, non-truncated replies on the
  route, SHARED by every instance through the budget server. On Lambda each execution
  environment sees too few requests to learn its own (the seed's per-replica p95 is one of its
  listed limitations). Until ``min_samples`` replies are in, it reserves max_tokens.

Every estimate is capped by the request's max_tokens. Truncated replies never enter the sample:
they would drag the estimate down, cause more truncation, and spiral.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from hardcap_core.ledger.client import Ledger

SAMPLES_KEPT = 1000
QUANTILE = 0.95
RECOMPUTE_EVERY = 16


class Estimator(Protocol):
    async def estimate(self, route: str, max_tokens: int) -> int:
        """Output tokens to reserve for a request on ``route`` capped at ``max_tokens``."""
        ...

    async def observe(self, route: str, output_tokens: int, *, truncated: bool) -> None:
        """Learn from one finished reply."""
        ...


class MaxTokensEstimator:
    async def estimate(self, route: str, max_tokens: int) -> int:
        return max_tokens

    async def observe(self, route: str, output_tokens: int, *, truncated: bool) -> None:
        return None


@dataclass(frozen=True)
class FixedEstimator:
    tokens: int

    async def estimate(self, route: str, max_tokens: int) -> int:
        return max(1, min(self.tokens, max_tokens))

    async def observe(self, route: str, output_tokens: int, *, truncated: bool) -> None:
        return None


class SharedP95Estimator:
    """Rolling quantile per route, kept on the budget server by ``estimator_record.lua``.

    The quantile is cached per process for ``cache_seconds``: a fresh Lambda environment reads
    it once, then every few seconds, instead of on every request.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        min_samples: int = 50,
        cache_seconds: float = 2.0,
        keep: int = SAMPLES_KEPT,
        quantile: float = QUANTILE,
    ) -> None:
        self.ledger = ledger
        self.min_samples = min_samples
        self.cache_seconds = cache_seconds
        self.keep = keep
        self.quantile = quantile
        self._cache: dict[str, tuple[float, int, int]] = {}  # route -> (read at, value, n)

    async def estimate(self, route: str, max_tokens: int) -> int:
        value, n = await self.current(route)
        if n < self.min_samples or value <= 0:
            return max_tokens
        return max(1, min(value, max_tokens))

    async def current(self, route: str) -> tuple[int, int]:
        """(quantile value, sample size) for ``route``, from the cache or the server."""
        hit = self._cache.get(route)
        if hit and time.monotonic() - hit[0] < self.cache_seconds:
            return hit[1], hit[2]
        stats = await self.ledger.estimator_stats(route)
        self._cache[route] = (time.monotonic(), stats.value, stats.samples)
        return stats.value, stats.samples

    async def observe(self, route: str, output_tokens: int, *, truncated: bool) -> None:
        if truncated or output_tokens <= 0:
            return
        stats = await self.ledger.record_output(
            route,
            output_tokens,
            keep=self.keep,
            quantile=self.quantile,
            recompute_every=RECOMPUTE_EVERY,
        )
        self._cache[route] = (time.monotonic(), stats.value, stats.samples)
