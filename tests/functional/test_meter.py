"""The meter's cut decision and cut charge against a real ledger on a real Valkey.

Time is a hand-driven clock, so a gateway that reads behind its provider (starved of CPU, or
waiting on a round trip) can be replayed exactly. Each test reads like a stream: reads of
tokens arrive, the relay asks to forward them, and the budget refuses to grow.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import pytest

from hardcap_core.budgets import Dimension
from hardcap_core.config import parse_config
from hardcap_core.events import Usage
from hardcap_core.gateway.meter import Meter, MeterSettings
from hardcap_core.ledger import FREE, Admitted, Ledger
from hardcap_core.ledger.estimators import MaxTokensEstimator
from hardcap_core.outcome import Outcome
from tests.conftest import TENANT, scope

PACE_S = 0.01  # the provider: 100 tokens per second
# The meter's settings as the gateway builds them (gateway/pipeline.py) from a config that sets
# no `gateway:` field: what users get by default.
SETTINGS = MeterSettings.of(parse_config({}, environ={}).gateway)
# What a stream in step with its provider keeps in reserve at the cut: the guard, plus the
# provider's output while it notices the close.
GUARD = SETTINGS.guard + round(SETTINGS.guard_s / PACE_S)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def hold(client: Any, budget: int, reserve: int, clock: Clock) -> Meter:
    """A meter on a fresh reservation of ``reserve`` output tokens in a ``budget``-token budget."""
    ledger = Ledger(client)
    s = scope((TENANT, Dimension.OUTPUT_TOKENS, budget, "day"), levels=(TENANT,))
    admitted = await ledger.admit(s, input_tokens=0, output_estimate=reserve)
    assert isinstance(admitted, Admitted)
    return Meter(
        ledger,
        s,
        admitted.reservation,
        SETTINGS,
        input_estimate=0,
        estimator=MaxTokensEstimator(),
        route="r",
        prices=FREE,
        clock=clock,
    )


async def stream_in_step(meter: Meter, clock: Clock, tokens: int) -> int:
    """Read and forward ``tokens`` one per read at the provider's pace; how many went out."""
    sent = 0
    for _ in range(tokens):
        clock.now += PACE_S
        meter.note_read(1, least=1)
        if not await meter.make_room(1):
            return sent
        sent += 1
    return sent


async def test_a_gateway_in_step_forwards_up_to_a_small_guard_and_charges_it(
    standalone_client: Any,
) -> None:
    clock = Clock()
    meter = await hold(standalone_client, budget=100, reserve=100, clock=clock)
    meter.note_read(0)  # the role chunk
    sent = await stream_in_step(meter, clock, 200)
    assert meter.truncated and meter.exhausted  # the budget held nothing more to extend with
    # Stopped short by the guard: its tokens, and 100 tokens/s while the provider notices.
    assert 100 - GUARD - 1 <= sent <= 100 - GUARD
    charged = meter.estimated_output()
    assert sent + 1 < charged <= 100  # the refused token and the ones in flight, within the hold


async def test_a_gateway_behind_its_provider_stops_earlier_by_the_backlog(
    standalone_client: Any,
) -> None:
    clock = Clock()
    meter = await hold(standalone_client, budget=100, reserve=100, clock=clock)
    meter.note_read(0)
    assert await stream_in_step(meter, clock, 40) == 40
    # Starved for 300 ms: the next read brings 30 tokens at once, and the provider goes on.
    clock.now += 0.3
    meter.note_read(30)
    read_at, forwarded = clock.now, 0
    for _ in range(30):
        clock.now += 0.02  # slow to forward each (the CPU is still contended)
        if not await meter.make_room(1):
            break
        forwarded += 1
    assert meter.truncated
    # At the cut, what the provider has generated (what we read, plus its pace since the read)
    # still fits in the reservation, and the charge covers it: in hand counts, forwarded or not.
    provider_at_cut = 40 + 30 + round((clock.now - read_at) / PACE_S)
    assert provider_at_cut <= meter.estimated_output() <= 100
    assert forwarded < 30


async def test_a_first_read_with_a_backlog_does_not_inflate_the_speed(
    standalone_client: Any,
) -> None:
    clock = Clock()
    meter = await hold(standalone_client, budget=1000, reserve=1000, clock=clock)
    meter.note_read(200)  # the first read: everything since the request was sent
    clock.now += PACE_S
    meter.note_read(1)
    # 1 token in 10 ms is measured over at least 100 ms: 10 tokens/s, not 20,000.
    assert meter.in_flight() <= SETTINGS.guard + 1
    assert await meter.make_room(200)
    assert meter.in_hand == 1


async def test_received_tokens_are_charged_even_past_the_reservation(
    standalone_client: Any,
) -> None:
    clock = Clock()
    meter = await hold(standalone_client, budget=50, reserve=50, clock=clock)
    meter.note_read(0)
    assert await stream_in_step(meter, clock, 30) == 30
    clock.now += 0.5
    meter.note_read(40)  # a provider that ignored the pace: 70 tokens exist, 50 were held
    assert not await meter.make_room(1)
    assert meter.estimated_output() == 70  # what arrived, not the reservation: the ledger shows it
    await meter.settle(Outcome.TRUNCATED)
    remaining = {b.budget.dimension: b.remaining for b in meter.final_budgets}
    assert remaining[Dimension.OUTPUT_TOKENS] == 50 - 70


@pytest.mark.parametrize(
    ("pieces", "charged"),
    [
        # 45 pieces, which the count of their text (long words) puts at 70: the provider may
        # have obeyed max_tokens 50, so it billed at most 50.
        (15, 50),
        # 70 pieces against max_tokens 50: it ignored the cap, and every piece it sent is billed.
        (40, 70),
    ],
    ids=["may_have_obeyed", "proved_it_ignored"],
)
async def test_a_cut_charges_what_arrived_only_up_to_max_tokens_unless_more_pieces_came(
    standalone_client: Any, pieces: int, charged: int
) -> None:
    clock = Clock()
    meter = await hold(standalone_client, budget=50, reserve=50, clock=clock)
    meter.asked_for(50)
    meter.note_read(0)
    assert await stream_in_step(meter, clock, 30) == 30
    clock.now += 0.5
    meter.note_read(40, least=pieces)  # `pieces` pieces, counted at 40 tokens
    assert not await meter.make_room(1)
    assert meter.estimated_output() == charged
    await meter.settle(Outcome.TRUNCATED)
    remaining = {b.budget.dimension: b.remaining for b in meter.final_budgets}
    assert remaining[Dimension.OUTPUT_TOKENS] == 50 - charged


@pytest.mark.parametrize(
    ("outcome", "reported", "final", "charged"),
    [
        # Anthropic's message_start counts 1 output token; 50 stream; the stream drops before
        # message_delta: charged what arrived, not that 1.
        (Outcome.INCOMPLETE, Usage(25, 1), None, (25, 50)),
        # Cut with no final report: the in-flight estimate, unless a running report says more.
        (Outcome.CLIENT_GONE, Usage(25, 300), None, (25, 300)),
        # A final report is the bill, even below the gateway's count of the text.
        (Outcome.COMPLETED, Usage(25, 40), Usage(25, 40), (25, 40)),
    ],
    ids=["incomplete", "cut", "complete"],
)
async def test_a_running_report_is_a_floor_and_a_final_one_the_bill(
    standalone_client: Any,
    outcome: Outcome,
    reported: Usage,
    final: Usage | None,
    charged: tuple[int, int],
) -> None:
    clock = Clock()
    meter = await hold(standalone_client, budget=1000, reserve=100, clock=clock)
    meter.note_read(0)
    assert await stream_in_step(meter, clock, 50) == 50
    if final is not None:
        meter.note_read(0, final=final)  # the read that ends the reply with the report
    await meter.settle(outcome, reported)
    assert (meter.charged_input, meter.charged_output) == charged


async def test_a_cut_stream_is_charged_the_input_the_provider_reported(
    standalone_client: Any,
) -> None:
    """Anthropic's message_start reports the prompt's count before any output: a stream cut
    after it is charged that count, not the gateway's estimate of it (about 3x the bill; a
    stalled stream was charged 63 + 85 for 30 + 5 billed)."""
    clock = Clock()
    meter = await hold(standalone_client, budget=1000, reserve=100, clock=clock)
    meter.input_estimate = 90
    meter.note_read(0)
    assert await stream_in_step(meter, clock, 10) == 10
    await meter.settle(Outcome.CLIENT_GONE, Usage(30, 1))
    assert meter.charged_input == 30 and meter.charged_output >= 10


async def test_a_cut_after_a_hung_ledger_call_charges_what_the_provider_made_meanwhile() -> None:
    """An extend blocked on a frozen cache: the provider kept generating for as long as the
    call hung (seen: 274 generated, 180 charged, the in-flight guess capped at the hold)."""
    import asyncio
    import os
    import signal
    import time

    from hardcap_core.ledger.connection import connect
    from hardcap_core.local.valkey import LocalValkey

    with LocalValkey() as server:
        client = await connect(server.url)
        try:
            ledger = Ledger(client)
            s = scope((TENANT, Dimension.OUTPUT_TOKENS, 10_000, "day"), levels=(TENANT,))
            admitted = await ledger.admit(s, input_tokens=0, output_estimate=40)
            assert isinstance(admitted, Admitted)
            meter = Meter(
                ledger, s, admitted.reservation, SETTINGS, input_estimate=0,
                estimator=MaxTokensEstimator(), route="r", prices=FREE, clock=time.monotonic,
            )  # fmt: skip
            meter.note_read(0)
            for _ in range(5):  # 100 tokens a second, in step: no extend needed yet
                await asyncio.sleep(PACE_S)
                meter.note_read(1)
                assert await meter.make_room(1)
            assert server.proc is not None
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                hung = 0.0
                for _ in range(300):  # the next extend hangs until the socket timeout
                    await asyncio.sleep(PACE_S)
                    meter.note_read(1)
                    started = time.monotonic()
                    if not await meter.make_room(1):
                        hung = time.monotonic() - started
                        break
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            assert meter.truncated and meter.ledger_failed
            # The provider went on at 100 tokens a second while the call hung: all of it is
            # charged, not just what the 40-token hold would cover.
            assert meter.estimated_output() >= meter.seen + int(100 * hung * 0.8)
            assert meter.estimated_output() > meter.reserved
            charge = meter.estimated_output()  # the real clock runs on: the settle charges no less
            await meter.settle(Outcome.TRUNCATED)
            assert meter.charged_output >= charge
        finally:
            await client.aclose()


async def test_a_stall_of_the_event_loop_makes_a_stream_stop_earlier(
    standalone_client: Any,
) -> None:
    """The process stalled 300 ms lately (gateway/loop_lag.py): it may stall as long again
    before a close goes out, so at 100 tokens/s it stops about 30 tokens earlier than a
    gateway in step (the first test)."""
    clock = Clock()
    meter = await hold(standalone_client, budget=100, reserve=100, clock=clock)
    meter._loop_lag = lambda: 0.3
    meter.note_read(0)
    sent = await stream_in_step(meter, clock, 200)
    assert meter.truncated and 100 - GUARD - 1 - 31 <= sent <= 100 - GUARD - 29
    assert meter.estimated_output() <= 100


async def test_a_provider_cut_at_the_cap_has_its_tokens_in_flight_held_and_charged(
    standalone_client: Any,
) -> None:
    """Cut by the request's max_tokens with budget to spare, the hold grows over what the
    provider makes before it notices, so the charge counts it (not just the cap)."""
    clock = Clock()
    meter = await hold(standalone_client, budget=10_000, reserve=50, clock=clock)
    # Extends only once the hold is passed: it stays at the cap until the cut.
    meter.settings = dataclasses.replace(SETTINGS, within=0, step=1)
    meter.cap = 50
    meter.note_read(0)
    # A fast provider: 10 tokens per 10 ms read, 1,000 tokens/s.
    sent = 0
    for _ in range(20):
        clock.now += PACE_S
        meter.note_read(10)
        if not await meter.make_room(10, at_least=10):
            break
        sent += 10
    assert meter.truncated and sent == 50
    # Past the cap: the refused read, and the guess of what is in flight (the guard, the
    # batch margin, its speed x 50 ms), all of it within the hold.
    known = 50 + 10
    assert meter.in_flight() >= SETTINGS.guard + 9
    assert meter.estimated_output() == known + meter.in_flight() <= meter.reserved


async def test_the_stall_margin_is_the_largest_recent_read(standalone_client: Any) -> None:
    """The in-flight guess adds the most tokens one of the last reads brought, less one: kept
    as reads come and go out of the window, it is what a scan of the window would give."""
    from hardcap_core.gateway.pace import STALL_WINDOW

    clock = Clock()
    meter = await hold(standalone_client, budget=10**6, reserve=100, clock=clock)
    rng = random.Random(7)
    reads: list[int] = []
    meter.note_read(0)  # the first read starts the clock; it is not a batch
    start = clock.now
    for _ in range(500):
        n = rng.choice([0, 1, 1, 1, 2, rng.randrange(0, 60)])
        clock.now += PACE_S
        meter.note_read(n)
        reads.append(n)
        window = reads[-STALL_WINDOW:]
        speed = sum(reads) / max(clock.now - start, 0.1)
        guard = meter.settings.guard + math.ceil(speed * meter.settings.guard_s)
        assert meter.in_flight() == guard + max(max(window) - 1, 0)
