"""How fast a provider streams, read by read: the meter's guess of the tokens in flight.

When the gateway stops a stream, the provider has already generated the tokens in TCP buffers
and the ones it makes until it notices the close. :class:`Pace` keeps what that guess needs:
the provider's speed since its first read (the first read may carry a backlog from before it,
so the rate starts after it), when the last read came, the most tokens one of the recent
reads brought (a gateway in step reads one at a time; one that was stalled lately may stall
again before it decides), and since when the gateway has been waiting for the next read
(:class:`Listened`). docs/design.md "Tokens in flight".

What the provider may have generated since the last read is its speed times the time the
gateway was *behind* it: busy with something else (a ledger round trip, a slow client's
write) while output may have queued unread. Time the gateway spent waiting for the next read
is not behind: whatever the provider sent meanwhile would have been read at once, so a
provider that streams everything it generates, and sent nothing, generated nothing then (what
it sends in batches is in the stall margin; what is on the wire, in ``guard_s`` and the loop's
lag). A silent provider may still think unseen: that output is not in flight but unseen, and
is held and charged on its own (:mod:`.unseen`).

Deciding when to stop and charging a stream once stopped are two questions. Before the close,
the gateway may stall again before it goes out: :meth:`Pace.in_flight` adds the loop's recent
lag. Once the upstream is closed, the time it took is known: :meth:`Pace.charged` is the
provider's rate (this stream's, or the route's while the stream's is barely measured) times the
time since the last read (until the wait for the next one began, plus the loop's lag to notice
it), capped by that time: a loaded gateway's lag is no longer charged as tokens the provider
never made (a lease of 20,000 was fully charged for 65-67% of it generated).
"""

from __future__ import annotations

import collections
import math
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType

from hardcap_core.events import Read

SPEED_MIN_S = 0.1  # the provider's speed is measured over at least this long
# A stream's speed measured over less than this is no better than the route's: the charge
# takes the faster of the two (a route's rate is learnt from streams measured at least this long).
RATE_TRUSTED_S = 0.5
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
        self._listening: float | None = None  # waiting for the next read since then

    def read(self, tokens: int) -> None:
        """One network read brought ``tokens`` output tokens."""
        now = self._clock()
        self._listening = None
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

    def listen(self) -> None:
        """The gateway waits for the provider's next read from now until one comes (or the
        stream ends)."""
        if self._listening is None:
            self._listening = self._clock()

    def speed(self) -> float:
        """Output tokens per second arriving since the first read (0 before a second read)."""
        if self._first_read is None:
            return 0.0
        return self._arrived / max(self._read_at - self._first_read, SPEED_MIN_S)

    def measured_s(self) -> float:
        """How long the speed has been measured over."""
        return 0.0 if self._first_read is None else self._read_at - self._first_read

    def charged(self, guard: int, guard_s: float, lag_s: float, route_rate: float = 0.0) -> int:
        """The tokens in flight a stream whose upstream was closed by now is charged: the guard,
        the stall margin, and the rate (this stream's; the faster of it and ``route_rate``
        while it is measured over less than :data:`RATE_TRUSTED_S`) times the time since the
        last read plus ``guard_s`` for the provider to notice. Time the gateway spent waiting
        for a read counts only up to ``lag_s`` (it may have been that late to take a read that
        came); the loop's lag is otherwise not added: the clock already ran through it.

        Never more than :meth:`in_flight` with the same arguments at this moment, bar the
        route's rate."""
        if self._first_read is None:
            return guard
        speed = self.speed()
        if self.measured_s() < RATE_TRUSTED_S:
            speed = max(speed, route_rate)
        now = self._clock()
        until = now if self._listening is None else min(self._listening + lag_s, now)
        behind = until - self._read_at + guard_s
        return guard + self._stall + math.ceil(speed * behind)

    def in_flight(self, guard: int, guard_s: float, lag_s: float) -> int:
        """Tokens generated past what was read, or before a close sent now is noticed: the
        speed times (the time behind since the last read + ``guard_s`` to notice + ``lag_s``,
        how long the process stalled lately, as it may again before the close goes out), plus
        ``guard``, plus the stall margin (the largest recent read, less one). The time behind
        ends when the gateway began waiting for the next read (see the module)."""
        if self._first_read is None:
            return guard
        speed = self.speed()
        until = self._clock() if self._listening is None else self._listening
        behind = until - self._read_at + guard_s + lag_s
        return guard + self._stall + math.ceil(speed * behind)


class RouteRate:
    """How fast a route's provider streams in this process: the fastest of its recent streams
    whose speed was measured over at least :data:`RATE_TRUSTED_S` (each new one counts in full
    if faster, else pulls the rate a quarter of the way down), so a stream cut before its own
    rate is known is charged the route's."""

    def __init__(self) -> None:
        self.rate = 0.0  # tokens per second

    def observe(self, pace: Pace) -> None:
        """A stream of the route ended at ``pace``."""
        if pace.measured_s() < RATE_TRUSTED_S:
            return
        speed = pace.speed()
        self.rate = speed if speed > self.rate else self.rate + (speed - self.rate) / 4


class Listened(AbstractAsyncContextManager[AsyncIterator[Read]]):
    """A provider's stream (a :meth:`~hardcap_core.providers.base.Provider.stream` context)
    that tells ``pace`` whenever the gateway starts waiting for its next read."""

    def __init__(
        self, opened: AbstractAsyncContextManager[AsyncIterator[Read]], pace: Pace
    ) -> None:
        self._opened = opened
        self._pace = pace

    async def __aenter__(self) -> AsyncIterator[Read]:
        return _Reads(await self._opened.__aenter__(), self._pace)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._opened.__aexit__(kind, error, tb)


class _Reads(AsyncIterator[Read]):
    def __init__(self, reads: AsyncIterator[Read], pace: Pace) -> None:
        self._reads = reads
        self._pace = pace

    async def __anext__(self) -> Read:
        self._pace.listen()  # until a read comes, or the wait ends the stream
        return await anext(self._reads)
