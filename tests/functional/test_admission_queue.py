"""The admission queue, against a standalone server AND a 3-master cluster: a request that would
be ``budget_busy`` takes a ticket in its tenant's queue and is admitted in turn, first come
first served; one that can never fit is refused at once; a waiter that stops asking (or
leaves) stops blocking the line; streams in flight keep room to extend into."""

from __future__ import annotations

import asyncio
from typing import Any

from hardcap_core.budgets import Dimension, Level, LevelKind, RateLimit
from hardcap_core.gateway.queue import Wakeups, admit_in_turn
from hardcap_core.ledger import (
    Admitted,
    Extended,
    Ledger,
    Queued,
    Refusal,
    Refused,
    ReservationMeta,
)
from hardcap_core.rollup.records import parse_entry
from tests.conftest import KEY, TENANT, scope

TOT, OUT = Dimension.TOTAL_TOKENS, Dimension.OUTPUT_TOKENS
TICKET_MS = 2000


async def admit(ledger: Ledger, sc: Any, rid: str, est: int, **kw: Any) -> Any:
    kw.setdefault("queue_ticket_ms", TICKET_MS)
    return await ledger.admit(sc, input_tokens=0, output_estimate=est, reservation_id=rid, **kw)


async def test_a_busy_request_queues_and_is_admitted_in_turn(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    held = await admit(ledger, sc, "held", 800)
    assert isinstance(held, Admitted)
    first = await admit(ledger, sc, "first", 500)
    second = await admit(ledger, sc, "second", 100)
    # The second would fit now (100 of the 200 free), but the first came before it.
    assert isinstance(first, Queued) and first.ahead == 0
    assert isinstance(second, Queued) and second.ahead == 1
    assert first.as_refused.reason is Refusal.BUSY
    assert (first.as_refused.level, first.as_refused.dimension) == (TENANT, "total_tokens")
    # Asking again renews the ticket and keeps the place; nothing is reserved meanwhile.
    again = await admit(ledger, sc, "second", 100)
    assert isinstance(again, Queued) and again.ahead == 1
    assert (await ledger.usage(sc)).rows[0].reserved == 800

    await ledger.settle(held.reservation, input_tokens=0, output_tokens=300)
    got_first = await admit(ledger, sc, "first", 500)
    assert isinstance(got_first, Admitted) and got_first.reservation.output_reserved == 500
    got_second = await admit(ledger, sc, "second", 100)
    assert isinstance(got_second, Admitted) and got_second.reservation.output_reserved == 100
    assert (await ledger.usage(sc)).rows[0].reserved == 600


async def test_a_newcomer_does_not_pass_the_waiters(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    held = await admit(ledger, sc, "held", 800)
    assert isinstance(await admit(ledger, sc, "waiting", 500), Queued)
    await ledger.settle(held.reservation, input_tokens=0, output_tokens=100)
    # 900 free, but one waits ahead: a request that does not queue is told busy, not admitted.
    r = await admit(ledger, sc, "impatient", 10, queue_ticket_ms=0)
    assert isinstance(r, Refused) and r.reason is Refusal.BUSY
    assert isinstance(await admit(ledger, sc, "waiting", 500), Admitted)
    assert isinstance(await admit(ledger, sc, "impatient", 10, queue_ticket_ms=0), Admitted)


async def test_one_that_can_never_fit_is_refused_at_once_not_queued(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    spent = await admit(ledger, sc, "spent", 600)
    await ledger.settle(spent.reservation, input_tokens=0, output_tokens=600)
    held = await admit(ledger, sc, "held", 350)
    assert isinstance(await admit(ledger, sc, "waiting", 300), Queued)
    # 400 are left in the window: a 500-token request is exceeded even with nothing in flight,
    # and waiters ahead do not make it wait.
    r = await admit(ledger, sc, "too-big", 500)
    assert isinstance(r, Refused) and r.reason is Refusal.EXCEEDED and not r.never_fits
    never = await admit(ledger, sc, "huge", 2000)
    assert isinstance(never, Refused) and never.never_fits
    assert isinstance(held, Admitted)


async def test_a_ticket_that_is_not_renewed_lapses(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    held = await admit(ledger, sc, "held", 800)
    assert isinstance(await admit(ledger, sc, "gone", 500, queue_ticket_ms=150), Queued)
    behind = await admit(ledger, sc, "behind", 500)
    assert isinstance(behind, Queued) and behind.ahead == 1
    await asyncio.sleep(0.3)  # "gone" stopped asking: its waiter died
    await ledger.settle(held.reservation, input_tokens=0, output_tokens=100)
    assert isinstance(await admit(ledger, sc, "behind", 500), Admitted)


async def test_leaving_frees_the_front_and_records_one_refusal(ledger: Ledger, client: Any) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    held = await admit(ledger, sc, "held", 800)
    meta = ReservationMeta(route="small", request_id="req-1")
    for _ in range(3):
        assert isinstance(await admit(ledger, sc, "leaver", 500, meta=meta), Queued)
    assert await ledger.leave_queue(sc, "leaver", meta=meta)
    assert not await ledger.leave_queue(sc, "leaver", meta=meta)  # once
    await ledger.settle(held.reservation, input_tokens=0, output_tokens=100)
    assert isinstance(await admit(ledger, sc, "next", 500), Admitted)
    stream = ledger.keys.usage_stream(sc.root)
    records = [parse_entry(rid, fields) for rid, fields in await client.xrange(stream)]
    refusals = [r for r in records if r.refused]
    assert [(r.outcome, r.request_id, r.tenant) for r in refusals] == [("busy", "req-1", "acme")]


async def test_streams_in_flight_keep_room_to_extend(ledger: Ledger) -> None:
    sc = scope((TENANT, OUT, 1000, "day"))
    a = await admit(ledger, sc, "a", 400, headroom=100)
    b = await admit(ledger, sc, "b", 300, headroom=100)
    assert isinstance(a, Admitted) and isinstance(b, Admitted)
    # 300 are free, but the two streams keep 100 each: a 200-token request waits ...
    assert isinstance(await admit(ledger, sc, "c", 200, headroom=100), Queued)
    # ... and the room stays for the streams to grow into.
    assert isinstance(await ledger.extend(a.reservation, 150), Extended)
    await ledger.settle(b.reservation, input_tokens=0, output_tokens=120)
    assert isinstance(await admit(ledger, sc, "c", 200, headroom=100), Admitted)


async def test_the_tail_goes_to_one_request_once_the_holds_clear(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    spent = await admit(ledger, sc, "spent", 850)
    await ledger.settle(spent.reservation, input_tokens=0, output_tokens=850)
    small = await admit(ledger, sc, "small", 50)
    assert isinstance(small, Admitted)
    # 100 are free and 150 left in all: the 400-token request would be cut wherever it gets
    # in, so it waits for the hold in flight rather than take the 100 beside it.
    assert isinstance(await admit(ledger, sc, "tail", 400, min_output=16), Queued)
    await ledger.settle(small.reservation, input_tokens=0, output_tokens=30)
    last = await admit(ledger, sc, "tail", 400, min_output=16)
    assert isinstance(last, Admitted) and last.reservation.output_reserved == 120


async def test_queues_are_per_tenant(ledger: Ledger) -> None:
    other = Level(LevelKind.TENANT, "other")
    acme = scope((TENANT, TOT, 1000, "day"))
    beta = scope((other, TOT, 1000, "day"), levels=(other,))
    assert isinstance(await admit(ledger, acme, "acme-held", 900), Admitted)
    assert isinstance(await admit(ledger, acme, "acme-waits", 500), Queued)
    assert isinstance(await admit(ledger, beta, "beta", 500), Admitted)


async def test_a_rate_limited_waiter_leaves_the_queue(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"), rates=(RateLimit(KEY, requests_per_minute=2),))
    held = await admit(ledger, sc, "held", 900)
    assert isinstance(await admit(ledger, sc, "waits", 500), Queued)
    assert isinstance(await admit(ledger, sc, "other", 10, queue_ticket_ms=0), Refused)
    await admit(ledger, sc, "second", 10)  # queued behind "waits" (no request slot used)
    await ledger.settle(held.reservation, input_tokens=0, output_tokens=10)
    assert isinstance(await admit(ledger, sc, "waits", 500), Admitted)


async def test_waiting_in_turn_admits_when_a_local_settle_frees_room(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    held = await admit(ledger, sc, "held", 900)
    wakeups = Wakeups()

    def call(ticket_ms: int) -> Any:
        return admit(ledger, sc, "waiter", 500, queue_ticket_ms=ticket_ms)

    async def settle_soon() -> None:
        await asyncio.sleep(0.3)
        await ledger.settle(held.reservation, input_tokens=0, output_tokens=100)
        wakeups.freed(sc)

    settling = asyncio.create_task(settle_soon())
    waited = await admit_in_turn(
        call, ledger=ledger, scope=sc, reservation_id="waiter", meta=ReservationMeta(),
        wait_s=10.0, wakeups=wakeups,
    )  # fmt: skip
    await settling
    assert isinstance(waited.result, Admitted)
    assert 0.25 < waited.seconds < 5.0


async def test_waiting_in_turn_gives_up_busy_and_leaves(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    assert isinstance(await admit(ledger, sc, "held", 900), Admitted)

    def call(ticket_ms: int) -> Any:
        return admit(ledger, sc, "waiter", 500, queue_ticket_ms=ticket_ms)

    waited = await admit_in_turn(
        call, ledger=ledger, scope=sc, reservation_id="waiter", meta=ReservationMeta(),
        wait_s=0.3, wakeups=Wakeups(),
    )  # fmt: skip
    assert isinstance(waited.result, Refused) and waited.result.reason is Refusal.BUSY
    assert waited.seconds >= 0.3
    # It left: the next request is first in line.
    nxt = await admit(ledger, sc, "next", 500)
    assert isinstance(nxt, Queued) and nxt.ahead == 0


async def test_a_higher_priority_class_waits_ahead(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    held = await admit(ledger, sc, "held", 900)
    assert isinstance(await admit(ledger, sc, "early", 500), Queued)
    assert isinstance(await admit(ledger, sc, "early-2", 500), Queued)
    urgent = await admit(ledger, sc, "urgent", 500, queue_priority=2)
    assert isinstance(urgent, Queued) and urgent.ahead == 0
    behind = await admit(ledger, sc, "early", 500)
    assert isinstance(behind, Queued) and behind.ahead == 1
    await ledger.settle(held.reservation, input_tokens=0, output_tokens=100)
    assert isinstance(await admit(ledger, sc, "early", 500), Queued)  # not its turn yet
    assert isinstance(await admit(ledger, sc, "urgent", 500, queue_priority=2), Admitted)
    assert isinstance(await admit(ledger, sc, "early", 500), Queued)  # 100 of the 500 free


async def test_waiters_that_join_in_the_same_millisecond_keep_their_order(ledger: Ledger) -> None:
    """Two requests sent one right after the other (one connection, in order) join within the
    same millisecond or two: the one sent first is first in line, whatever their ids."""
    for i in range(10):
        tenant = Level(LevelKind.TENANT, f"same-ms-{i}")
        sc = scope((tenant, TOT, 1000, "day"), levels=(tenant,))
        held = await admit(ledger, sc, f"held-{i}", 900)
        first, second = await asyncio.gather(
            admit(ledger, sc, f"zz-{i}", 500), admit(ledger, sc, f"aa-{i}", 500)
        )
        assert isinstance(first, Queued) and isinstance(second, Queued)
        await ledger.settle(held.reservation, input_tokens=0, output_tokens=10)
        assert isinstance(await admit(ledger, sc, f"aa-{i}", 500), Queued)  # still second
        assert isinstance(await admit(ledger, sc, f"zz-{i}", 500), Admitted)


def leaves_after(seconds: float | None = None, when: asyncio.Event | None = None) -> Any:
    """An ASGI receive channel whose body was read: its client disconnects after ``seconds``,
    or once ``when`` is set."""

    async def receive() -> dict[str, Any]:
        if when is not None:
            await when.wait()
        else:
            await asyncio.sleep(seconds or 0)
        return {"type": "http.disconnect"}

    return receive


async def records_of(ledger: Ledger, client: Any, sc: Any) -> list[Any]:
    stream = ledger.keys.usage_stream(sc.root)
    return [parse_entry(rid, fields) for rid, fields in await client.xrange(stream)]


async def test_a_waiter_whose_client_leaves_leaves_the_queue_at_once(
    ledger: Ledger, client: Any
) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    held = await admit(ledger, sc, "held", 900)
    meta = ReservationMeta(route="small", request_id="req-gone")

    def call(ticket_ms: int) -> Any:
        return admit(ledger, sc, "leaver", 500, queue_ticket_ms=ticket_ms, meta=meta)

    started = asyncio.get_running_loop().time()
    waited = await admit_in_turn(
        call, ledger=ledger, scope=sc, reservation_id="leaver", meta=meta, wait_s=10.0,
        wakeups=Wakeups(), receive=leaves_after(0.2),
    )  # fmt: skip
    # It left when its client did, not when it would have been admitted or given up.
    assert asyncio.get_running_loop().time() - started < 1.0
    assert waited.client_left and isinstance(waited.result, Refused)
    nxt = await admit(ledger, sc, "next", 500)
    assert isinstance(nxt, Queued) and nxt.ahead == 0  # its ticket is gone
    assert (await ledger.usage(sc)).rows[0].reserved == 900  # nothing was reserved for it
    refusals = [r for r in await records_of(ledger, client, sc) if r.refused]
    assert [(r.outcome, r.request_id, r.cost_nusd, r.input_tokens) for r in refusals] == [
        ("client_gone", "req-gone", 0, 0)
    ]
    assert isinstance(held, Admitted)


async def test_one_admitted_the_moment_its_client_left_is_given_back_at_no_cost(
    ledger: Ledger, client: Any
) -> None:
    """The client leaves during the admit call that admits it: that admit is never cut short
    (its hold would be left to expire and be charged), and the hold goes back at zero."""
    sc = scope((TENANT, TOT, 1000, "day"))
    held = await admit(ledger, sc, "held", 900)
    gone = asyncio.Event()
    calls = 0

    async def call(ticket_ms: int) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            await ledger.settle(held.reservation, input_tokens=0, output_tokens=100)
            gone.set()  # the client leaves while this admit is on its way
        return await admit(ledger, sc, "lucky", 500, queue_ticket_ms=ticket_ms)

    waited = await admit_in_turn(
        call, ledger=ledger, scope=sc, reservation_id="lucky", meta=ReservationMeta(),
        wait_s=10.0, wakeups=Wakeups(), receive=leaves_after(when=gone),
    )  # fmt: skip
    assert waited.client_left and isinstance(waited.result, Refused)
    row = (await ledger.usage(sc)).rows[0]
    assert (row.used, row.reserved) == (100, 0)  # the held stream's 100; nothing for "lucky"
    settles = [r for r in await records_of(ledger, client, sc) if r.reservation_id == "lucky"]
    assert [(r.outcome, r.cost_nusd, r.input_tokens, r.output_tokens) for r in settles] == [
        ("client_gone", 0, 0, 0)
    ]


async def test_a_waiter_whose_client_stays_is_admitted_as_before(ledger: Ledger) -> None:
    sc = scope((TENANT, TOT, 1000, "day"))
    held = await admit(ledger, sc, "held", 900)
    wakeups = Wakeups()

    def call(ticket_ms: int) -> Any:
        return admit(ledger, sc, "stays", 500, queue_ticket_ms=ticket_ms)

    async def settle_soon() -> None:
        await asyncio.sleep(0.2)
        await ledger.settle(held.reservation, input_tokens=0, output_tokens=100)
        wakeups.freed(sc)

    settling = asyncio.create_task(settle_soon())
    waited = await admit_in_turn(
        call, ledger=ledger, scope=sc, reservation_id="stays", meta=ReservationMeta(),
        wait_s=10.0, wakeups=wakeups, receive=leaves_after(60.0),
    )  # fmt: skip
    await settling
    assert isinstance(waited.result, Admitted) and not waited.client_left
