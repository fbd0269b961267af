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
from typing import Any, Protocol

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from hardcap_core.errors import LedgerUnavailable
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
        _, stats_key = self.ledger.keys.estimator(route)
        try:
            raw = await self.ledger.client.hmget(stats_key, "q", "n")
        except (RedisConnectionError, RedisTimeoutError, RedisClusterException, OSError) as e:
            raise LedgerUnavailable(f"budget server unreachable: {e}") from e
        value, n = int(float(raw[0] or 0)), int(raw[1] or 0)
        self._cache[route] = (time.monotonic(), value, n)
        return value, n

    async def observe(self, route: str, output_tokens: int, *, truncated: bool) -> None:
        if truncated or output_tokens <= 0:
            return
        keys = self.ledger.keys.estimator(route)
        args: list[Any] = [output_tokens, self.keep, self.quantile, RECOMPUTE_EVERY]
        try:
            reply = await self.ledger.scripts.estimator_record(keys=keys, args=args)
        except (RedisConnectionError, RedisTimeoutError, RedisClusterException, OSError) as e:
            raise LedgerUnavailable(f"budget server unreachable: {e}") from e
        self._cache[route] = (time.monotonic(), int(reply[0]), int(reply[1]))
