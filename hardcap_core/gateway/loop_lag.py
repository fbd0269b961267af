"""How far behind this process's event loop runs, and whether it is too far to admit more.

A timer on the loop asks to run every ``interval_s`` and measures how late it ran: that
lateness is how long every other callback on the loop (a stream's next read, an extend, a
settle) waited too. The gateway reads it two ways:

- :meth:`LoopLag.recent_max_s`: the largest lateness over the last ``horizon_s`` (a windowed
  maximum in one-second buckets, so a stall is remembered for the horizon and then forgotten):
  "the gateway may stall this long again", a margin for the meter.
- :meth:`LoopLag.shedding`: true while the lag is above ``threshold_s``, and for ``hold_s``
  after the last tick above it (hysteresis, so it does not flap tick by tick). The app then
  refuses new chat requests with 503 before admission (see docs/design.md, "Shedding load"):
  a starved loop would otherwise admit more streams while the extends and settles of those in
  flight wait behind them.

It runs on every gateway process forever, so each tick is one ``call_later`` (a timer handle,
no task, no coroutine) and a few float operations on preallocated lists.

Not started on AWS Lambda: an execution environment serves one request at a time (there is
nothing to shed), and Lambda freezes it between invocations, which would read as a lag of
minutes on the first tick after the thaw.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable

# Set by Lambda in every execution environment.
LAMBDA_MARKER = "AWS_LAMBDA_FUNCTION_NAME"
BUCKET_S = 1.0  # width of one bucket of the windowed maximum


class LoopLag:
    """The lateness of a periodic timer on the running loop (see the module docstring).

    ``threshold_s`` 0 never sheds. ``clock`` is a monotonic clock in seconds (tests pass a
    fake one and feed :meth:`observe`)."""

    def __init__(
        self,
        *,
        interval_s: float = 0.025,
        threshold_s: float = 0.0,
        horizon_s: float = 10.0,
        hold_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0 or horizon_s <= 0 or hold_s < 0 or threshold_s < 0:
            raise ValueError("interval_s and horizon_s must be > 0, hold_s and threshold_s >= 0")
        self.interval_s = interval_s
        self.threshold_s = threshold_s
        self.hold_s = hold_s
        self._clock = clock
        self._buckets = max(1, math.ceil(horizon_s / BUCKET_S))
        self._max = [0.0] * self._buckets  # the largest lateness seen in each bucket
        self._epoch = [-1] * self._buckets  # which second each bucket holds
        self._current = 0.0
        self._recent = 0.0
        self._last_over = -math.inf  # when a tick was last above the threshold
        self._shedding = False
        self._due = 0.0  # when the pending tick was asked to run
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None

    # -- what the gateway reads -------------------------------------------------------------

    def current_s(self) -> float:
        """How late the last tick ran, in seconds."""
        return self._current

    def recent_max_s(self) -> float:
        """The largest lateness of the last ``horizon_s`` (to within a bucket), in seconds."""
        return self._recent

    def shedding(self) -> bool:
        """True while new requests should be refused: a tick ran more than ``threshold_s`` late
        less than ``hold_s`` ago."""
        return self._shedding

    @property
    def running(self) -> bool:
        return self._handle is not None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop it ticks on (None before :meth:`start`)."""
        return self._loop

    # -- the timer ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start ticking on the running loop (a second call does nothing)."""
        if self._handle is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._schedule()

    async def stop(self) -> None:
        """Stop ticking; the readings keep their last values."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self) -> None:
        assert self._loop is not None
        self._due = self._clock() + self.interval_s
        self._handle = self._loop.call_later(self.interval_s, self._tick)

    def _tick(self) -> None:
        self.observe(self._clock() - self._due)
        self._schedule()

    def observe(self, lateness_s: float) -> None:
        """Record one tick that ran ``lateness_s`` late, now (by the clock)."""
        now = self._clock()
        late = lateness_s if lateness_s > 0.0 else 0.0
        self._current = late
        epoch = int(now // BUCKET_S)
        i = epoch % self._buckets
        if self._epoch[i] != epoch:
            self._epoch[i] = epoch
            self._max[i] = late
        elif late > self._max[i]:
            self._max[i] = late
        oldest = epoch - self._buckets
        recent = 0.0
        for j in range(self._buckets):
            if self._epoch[j] > oldest and self._max[j] > recent:
                recent = self._max[j]
        self._recent = recent
        if self.threshold_s > 0.0:
            if late > self.threshold_s:
                self._last_over = now
            self._shedding = now - self._last_over < self.hold_s or late > self.threshold_s


def on_lambda() -> bool:
    """True in an AWS Lambda execution environment, where the monitor is not started."""
    return bool(os.environ.get(LAMBDA_MARKER))
