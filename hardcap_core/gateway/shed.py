"""Shedding load: refuse new chat requests while this process's event loop lags.

Checked before admission, so a shed request reaches no ledger script: it holds nothing and
costs the tenant nothing. Streams already admitted go on untouched; refusing new ones is what
lets their extends and settles run on time again (docs/design.md, "Shedding load").

The refusal is a 503 ``overloaded`` with ``Retry-After`` (whole seconds), ``retry-after-ms``
and ``x-should-retry: true`` (the refusals' own rule, :func:`retry_headers`: the hold is a
second, well within what the SDKs may sleep), which the official OpenAI and Anthropic SDKs
read to retry after that long. The warning it logs is rate-limited: one line per
``log_every_s`` at most, counting the requests shed since the last one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from hardcap_core.errors import Overloaded
from hardcap_core.gateway.answers import retry_headers
from hardcap_core.gateway.loop_lag import LoopLag
from hardcap_core.logs import logger

SHED_OUTCOME = "shed"  # the Outcome dimension of the request metric


class Shedder:
    def __init__(
        self,
        lag: LoopLag,
        *,
        log_every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lag = lag
        self.log_every_s = log_every_s
        self._clock = clock
        self._unlogged = 0  # requests shed since the last warning
        self._logged_at = -math.inf
        self.headers = retry_headers(int(lag.hold_s * 1000))

    def check(self) -> None:
        """Raise :class:`Overloaded` while the loop lags; otherwise return at once."""
        if not self.lag.shedding():
            return
        self._unlogged += 1
        now = self._clock()
        if now - self._logged_at >= self.log_every_s:
            logger.warning(
                "shedding load: the event loop lags",
                extra={
                    "shed_requests": self._unlogged,
                    "loop_lag_ms": round(self.lag.current_s() * 1000, 1),
                    "recent_max_lag_ms": round(self.lag.recent_max_s() * 1000, 1),
                    "threshold_ms": round(self.lag.threshold_s * 1000, 1),
                },
            )
            self._logged_at = now
            self._unlogged = 0
        raise Overloaded(
            "This gateway is overloaded; retry the request shortly.", headers=self.headers
        )
