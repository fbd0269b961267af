"""Waiting to be admitted: a request that would be ``budget_busy`` waits its turn instead.

The queue itself is in the cache (``lua/admit.lua``: one per tenant, in the hierarchy's slot,
first come first served across every instance). This module is the waiting side: take a
ticket, ask again — sooner the nearer the front (:func:`poll_after`), at once when a settle in
this process freed budget of the same hierarchy — and give up after the configured wait or
before the Lambda deadline, leaving the queue so nobody waits behind a request that has gone.

Waiting costs on Lambda: the invocation is billed for its whole duration, so a request that
waits 2 s costs 2 s of the function's memory (docs/design.md "The admission queue").
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from hardcap_core.budgets import Scope
from hardcap_core.errors import LedgerUnavailable
from hardcap_core.ledger import AdmitResult, Ledger, Queued, ReservationMeta

POLL_FIRST_S = 0.025  # the first in line asks again this soon ...
POLL_PER_AHEAD_S = 0.05  # ... and each one ahead adds this (it is admitted in turn first) ...
POLL_MAX_S = 2.0  # ... up to this
JITTER = 0.2  # +-20 % on every pause, so waiters on many instances do not ask in step
TICKET_SLACK_S = 0.5  # a ticket lapses this long after its waiter's next call was due


class Wakeups:
    """Settles in this process wake this process's waiters of the same hierarchy at once (a
    settle elsewhere is seen at the next poll)."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def freed(self, scope: Scope) -> None:
        """Budget of ``scope``'s hierarchy was released here."""
        event = self._events.pop(scope.root.tag, None)
        if event is not None:
            event.set()

    async def pause(self, scope: Scope, seconds: float) -> None:
        """Sleep ``seconds``, or less if budget of ``scope``'s hierarchy is freed meanwhile."""
        event = self._events.setdefault(scope.root.tag, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), seconds)


@dataclass(frozen=True, slots=True)
class Waited:
    result: AdmitResult  # never Queued: admitted, refused (busy once it stopped waiting), ...
    seconds: float  # how long it waited in the queue (0: it did not)


async def admit_in_turn(
    admit: Callable[[int], Awaitable[AdmitResult]],
    *,
    ledger: Ledger,
    scope: Scope,
    reservation_id: str,
    meta: ReservationMeta,
    wait_s: float,
    wakeups: Wakeups,
) -> Waited:
    """``admit(ticket_ms)`` until it is not :class:`Queued` or ``wait_s`` has passed; then
    the last 'queued' answer becomes a ``budget_busy`` refusal and the ticket is given back."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    if wait_s <= 0:
        return Waited(await admit(0), 0.0)
    # The first call does not know its place yet: its ticket covers the longest pause. Later
    # ones cover the pause their place gives (a place only moves forward).
    result = await admit(_ticket_ms(POLL_MAX_S))
    if not isinstance(result, Queued):
        return Waited(result, 0.0)
    end = began + wait_s
    try:
        while isinstance(result, Queued):
            left = end - loop.time()
            if left <= 0:
                break
            pause = poll_after(result.ahead)
            await wakeups.pause(scope, min(pause * random.uniform(1 - JITTER, 1), left))
            result = await admit(_ticket_ms(pause))
    finally:
        if isinstance(result, Queued):
            # Gone from the front at once (it stopped waiting, or its client left): nobody
            # waits behind it until its ticket would lapse.
            with anyio.CancelScope(shield=True), contextlib.suppress(LedgerUnavailable):
                await ledger.leave_queue(scope, reservation_id, meta=meta)
    waited = loop.time() - began
    if isinstance(result, Queued):
        return Waited(result.as_refused, waited)
    return Waited(result, waited)


def poll_after(ahead: int) -> float:
    """Seconds a waiter with ``ahead`` requests before it waits before asking again."""
    return min(POLL_FIRST_S + POLL_PER_AHEAD_S * ahead, POLL_MAX_S)


def _ticket_ms(pause_s: float) -> int:
    return int((pause_s * (1 + JITTER) + TICKET_SLACK_S) * 1000)
