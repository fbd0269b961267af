"""Waiting to be admitted: a request that would be ``budget_busy`` waits its turn instead.

The queue itself is in the cache (``lua/admit.lua``: one per tenant, in the hierarchy's slot,
first come first served across every instance). This module is the waiting side: take a
ticket, ask again — sooner the nearer the front (:func:`poll_after`), at once when a settle in
this process freed budget of the same hierarchy — and give up after the configured wait or
before the Lambda deadline, leaving the queue so nobody waits behind a request that has gone.
A client that disconnects while its request waits takes it out of the queue at once: it is
never admitted, sent upstream or charged (:class:`ClientWatch`).

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
from starlette.types import Receive

from hardcap_core.budgets import Scope
from hardcap_core.errors import LedgerUnavailable
from hardcap_core.ledger import (
    AdmitResult,
    Admitted,
    Ledger,
    Queued,
    Refused,
    ReservationMeta,
    SettleNote,
)
from hardcap_core.outcome import Outcome

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


class ClientWatch:
    """Whether the client left while its request waits. The body was read already, so the next
    message on the ASGI receive channel is ``http.disconnect``: a task waits for it. (Under
    Mangum, a buffered invocation, it comes only after the reply: nobody leaves a queue.)"""

    def __init__(self, receive: Receive | None) -> None:
        self._task = None if receive is None else asyncio.ensure_future(_disconnect(receive))

    @property
    def gone(self) -> bool:
        task = self._task
        if task is None or not task.done() or task.cancelled():
            return False
        # A receive channel that failed says nothing of the client: it goes on waiting.
        return task.exception() is None and task.result()

    async def pause(self, wakeups: Wakeups, scope: Scope, seconds: float) -> None:
        """:meth:`Wakeups.pause`, cut short when the client leaves."""
        task = self._task
        if task is None or task.done():
            if not self.gone:
                await wakeups.pause(scope, seconds)
            return
        sleeping = asyncio.ensure_future(wakeups.pause(scope, seconds))
        try:
            await asyncio.wait((sleeping, task), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()

    def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()


async def _disconnect(receive: Receive) -> bool:
    while (await receive())["type"] != "http.disconnect":
        pass
    return True


@dataclass(frozen=True, slots=True)
class Waited:
    result: AdmitResult  # never Queued: admitted, refused (busy once it stopped waiting), ...
    seconds: float  # how long it waited in the queue (0: it did not)
    client_left: bool = False  # its client disconnected while it waited: result is a refusal


async def admit_in_turn(
    admit: Callable[[int], Awaitable[AdmitResult]],
    *,
    ledger: Ledger,
    scope: Scope,
    reservation_id: str,
    meta: ReservationMeta,
    wait_s: float,
    wakeups: Wakeups,
    receive: Receive | None = None,
) -> Waited:
    """``admit(ticket_ms)`` until it is not :class:`Queued` or ``wait_s`` has passed; then
    the last 'queued' answer becomes a ``budget_busy`` refusal and the ticket is given back.

    ``receive``: the request's ASGI receive channel, its body read. If the client disconnects
    while it waits, it leaves the queue at once (its record: a refusal ``client_gone``, at no
    cost) and the result says so (``client_left``); nothing was reserved for it."""
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
    last = result
    watch = ClientWatch(receive)  # only a request that waits pays for watching
    try:
        while isinstance(result, Queued):
            last = result
            left = end - loop.time()
            if left <= 0 or watch.gone:
                break
            pause = poll_after(result.ahead)
            await watch.pause(wakeups, scope, min(pause * random.uniform(1 - JITTER, 1), left))
            if watch.gone:
                break
            # Never cut short: an admit whose answer is lost would leave a hold nobody settles.
            result = await admit(_ticket_ms(pause))
    finally:
        watch.close()
        if isinstance(result, Queued):
            # Gone from the front at once (it stopped waiting, or its client left): nobody
            # waits behind it until its ticket would lapse.
            with anyio.CancelScope(shield=True), contextlib.suppress(LedgerUnavailable):
                await ledger.leave_queue(
                    scope, reservation_id, meta=meta,
                    outcome="client_gone" if watch.gone else "busy",
                )  # fmt: skip
    waited = loop.time() - began
    if watch.gone:
        if isinstance(result, Admitted):
            await _give_back(ledger, result, wakeups, scope)
        refused = result if isinstance(result, Refused) else last.as_refused
        return Waited(refused, waited, client_left=True)
    if isinstance(result, Queued):
        return Waited(result.as_refused, waited)
    return Waited(result, waited)


async def _give_back(ledger: Ledger, admitted: Admitted, wakeups: Wakeups, scope: Scope) -> None:
    """Release a hold admitted in the moment its client left (during that admit's round trip):
    nothing was sent, so it settles at zero. If the cache cannot be reached, the hold expires
    and is charged then (the residue of that moment, bounded by the hold)."""
    with anyio.CancelScope(shield=True), contextlib.suppress(LedgerUnavailable):
        await ledger.settle(
            admitted.reservation, input_tokens=0, output_tokens=0, cost_nusd=0,
            note=SettleNote(outcome=Outcome.CLIENT_GONE.value),
        )  # fmt: skip
        wakeups.freed(scope)


def poll_after(ahead: int) -> float:
    """Seconds a waiter with ``ahead`` requests before it waits before asking again."""
    return min(POLL_FIRST_S + POLL_PER_AHEAD_S * ahead, POLL_MAX_S)


def _ticket_ms(pause_s: float) -> int:
    return int((pause_s * (1 + JITTER) + TICKET_SLACK_S) * 1000)
