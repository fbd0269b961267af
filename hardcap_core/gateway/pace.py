"""How fast a provider streams, read by read: the meter's guess of the tokens in flight.

When the gateway stops a stream, the provider has already generated the tokens in TCP buffers
and the ones it makes until it notices the close. :class:`Pace` keeps what that guess needs:
the provider's speed since its first read (the first read may carry a backlog from before it,
so the rate starts after it), when the last read came, and the most tokens one of the recent
reads brought (a gateway in step reads one at a time; one that was stalled lately may stall
again before it decides). docs/design.md "Tokens in flight".
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable

SPEED_MIN_S = 0.1  # the provider's speed is measured over at least this long
STALL_WINDOW = 32  # reads over which the largest read is remembered


class Pace:
    """The provider's pace in one stream, on ``clock`` (seconds)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._first_read: float | None = None
        self._read_at = 0.0
        self._arrived = 0  # output tokens read after the first read
        self._batches: collections.deque[int] = collections.deque(maxlen=STALL_WINDOW)
        self._stall = 0  # the most tokens one of those reads brought, less one

    def read(self, tokens: int) -> None:
        """One network read brought ``tokens`` output tokens."""
        now = self._clock()
        if self._first_read is None:
            self._first_read = now
        else:
            self._arrived += tokens
            evicted = self._batches[0] if len(self._batches) == STALL_WINDOW else -1
            self._batches.append(tokens)
            if tokens - 1 > self._stall:
                self._stall = tokens - 1
            elif evicted - 1 == self._stall:  # the largest left the window: find the next
                self._stall = max(max(self._batches) - 1, 0)
        self._read_at = now

    def in_flight(self, guard: int, guard_s: float, lag_s: float) -> int:
        """Tokens generated past what was read, or before a close sent now is noticed: the
        speed times (the time since the last read + ``guard_s`` to notice + ``lag_s``, how
        long the process stalled lately, as it may again before the close goes out), plus
        ``guard``, plus the stall margin (the largest recent read, less one)."""
        if self._first_read is None:
            return guard
        elapsed = max(self._read_at - self._first_read, SPEED_MIN_S)
        speed = self._arrived / elapsed  # tokens per second arriving since the first read
        behind = self._clock() - self._read_at + guard_s + lag_s
        return guard + self._stall + math.ceil(speed * behind)
