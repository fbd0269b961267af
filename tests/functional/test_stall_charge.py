"""A provider that stalls: what a stream cut during the stall is charged, on a real ledger on a
real Valkey, with the real clock.

The relay reads the provider through :class:`~hardcap_core.gateway.pace.Listened`, as the
gateway does: time the gateway spent waiting for a read is not time it was behind the
provider, since anything sent meanwhile would have been read at once. So a provider that
streamed 5 tokens and then stalled, cut after 1.5 s of silence, is charged about what it sent,
not its speed times the silence (seen: 146-169 charged for 20 billed). A gateway that was busy
meanwhile (a slow client) is still charged for what the provider made while it was not
reading.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardcap_core.budgets import Dimension, Level, LevelKind
from hardcap_core.errors import UpstreamTimeout
from hardcap_core.gateway.meter import Meter, MeterSettings
from hardcap_core.gateway.pace import Listened
from hardcap_core.gateway.relay import Relay
from hardcap_core.ledger import FREE, Admitted
from hardcap_core.ledger.estimators import MaxTokensEstimator
from hardcap_core.outcome import Outcome
from hardcap_core.wire.openai_chat import OpenAIChat
from hardcap_core.wire.openai_request import parse_chat_request
from tests.conftest import TENANT, scope
from tests.functional.test_relay import CountingLedger, Script, Step, content, role

PACE_S = 0.01  # the provider: 100 tokens a second
STALL_S = 1.5
SENT = 5  # tokens it streams before it stalls
HOLD = 150
# What a cut may add to what arrived: the guard (4), the stall margin (one token a read: 0) and
# the provider's speed (5 tokens measured over at least 0.1 s: 50 a second) times the 50 ms it
# takes to notice, rounded up; one more for a slow machine's scheduling.
IN_FLIGHT = 4 + 3 + 1
REQUEST = parse_chat_request(json.dumps({
    "model": "small", "messages": [{"role": "user", "content": "hi"}], "stream": True,
    "stream_options": {"include_usage": True},
}).encode())  # fmt: skip


def stalling(then: list[Step] | None = None) -> Script:
    """``SENT`` tokens at the provider's pace, then a silence: ``then``, or for good."""
    reads: list[Step] = [[role()]]
    for i in range(SENT):
        reads += [PACE_S, [content(f"w{i} ")]]
    return Script([*reads, *(then or [])], stall=then is None)


async def relay(
    client: Any, script: Script, *, deadline: float | None = None, tenant: Level = TENANT
) -> Relay:
    ledger = CountingLedger(client)
    s = scope((tenant, Dimension.OUTPUT_TOKENS, 10_000, "day"), levels=(tenant,))
    admitted = await ledger.admit(s, input_tokens=20, output_estimate=HOLD)
    assert isinstance(admitted, Admitted)
    meter = Meter(
        ledger, s, admitted.reservation, MeterSettings(), input_estimate=20,
        estimator=MaxTokensEstimator(), route="small", prices=FREE, clock=time.monotonic,
    )  # fmt: skip
    encoder = OpenAIChat().encoder(REQUEST, model="small", same_dialect=True)
    return Relay(Listened(script.stream(), meter.pace), meter, encoder, deadline=deadline)


async def pull(r: Relay, out: list[bytes]) -> None:
    """As the ASGI response does: read every piece as soon as it is ready."""
    await r.open()
    async for data in r.chunks():
        out.append(data)


async def charged_output(r: Relay) -> int:
    usage = await r.meter.ledger.usage(r.meter.scope)
    rows = {row.budget.dimension: row for row in usage.rows}
    assert rows[Dimension.OUTPUT_TOKENS].reserved == 0
    assert rows[Dimension.OUTPUT_TOKENS].used == r.meter.charged_output
    return r.meter.charged_output


@pytest.mark.parametrize("ending", ["deadline", "upstream_timeout"])
async def test_a_stream_cut_during_a_stall_is_charged_what_the_provider_sent(
    standalone_client: Any, ending: str
) -> None:
    """Charged 5 + at most the guard's worth, where it was charged the provider's speed times
    the 1.5 s silence (87-88 of the 150 held)."""
    loop = asyncio.get_running_loop()
    timeout: list[Step] = [STALL_S, UpstreamTimeout("no byte")]
    script = stalling(timeout if ending == "upstream_timeout" else None)
    deadline = loop.time() + 0.1 + STALL_S if ending == "deadline" else None
    r = await relay(standalone_client, script, deadline=deadline)
    await pull(r, [])
    assert r.outcome is (Outcome.DEADLINE if ending == "deadline" else Outcome.UPSTREAM_ERROR)
    assert script.taken == 1 + SENT and script.exited == 1
    assert SENT <= await charged_output(r) <= SENT + IN_FLIGHT


async def test_a_client_that_leaves_is_charged_for_the_time_the_gateway_was_behind(
    standalone_client: Any,
) -> None:
    """Leaving during the provider's silence, while the gateway waits for it: about what it
    sent (it was charged 90). Leaving after a second of not reading, while the provider went on
    making tokens the gateway did not read (the relay waits on the client, not the provider):
    what the provider made meanwhile, its speed times that second."""
    script = stalling()
    r = await relay(standalone_client, script)
    reader = asyncio.create_task(pull(r, []))  # reads every piece as soon as it is ready
    await asyncio.sleep(0.1 + STALL_S)  # the client leaves during the silence
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    await r.end(Outcome.CLIENT_GONE)
    assert script.taken == 1 + SENT and script.exited == 1
    assert SENT <= await charged_output(r) <= SENT + IN_FLIGHT

    going_on: list[Step] = [PACE_S, [content("more ")]] * 200
    busy = await relay(standalone_client, stalling(going_on), tenant=Level(LevelKind.TENANT, "b"))
    await busy.open()
    chunks = busy.chunks()
    got = 0
    while got < SENT:
        got += (await anext(chunks)).count(b'"content"')
    await asyncio.sleep(1.0)  # the client reads nothing for a second
    await chunks.aclose()
    await busy.end(Outcome.CLIENT_GONE)
    assert await charged_output(busy) >= SENT + 40  # about 50 a second, measured after 5


async def test_the_time_behind_ends_when_the_gateway_waits_for_a_read() -> None:
    """On a hand clock: 5 tokens at 100 a second, then 3 s without a read. Waiting for it all
    along, the gateway is not behind; busy, it is 3 s behind."""
    from hardcap_core.gateway.pace import Pace

    now = [1000.0]
    waiting, busy = Pace(lambda: now[0]), Pace(lambda: now[0])
    for pace in (waiting, busy):
        pace.read(0)
    for _ in range(SENT):
        now[0] += PACE_S
        waiting.read(1)
        busy.read(1)
    waiting.listen()
    now[0] += 3.0
    # 5 tokens over the least 0.1 s: 50 a second; the guard 4; 50 ms to notice.
    assert waiting.in_flight(4, 0.05, 0.0) == 4 + 3
    assert busy.in_flight(4, 0.05, 0.0) == 4 + 153
    waiting.listen()  # a second call keeps the first time: it has waited since then
    now[0] += 1.0
    assert waiting.in_flight(4, 0.05, 0.0) == 4 + 3
    waiting.read(1)  # a read came: the next wait starts afresh
    assert waiting.in_flight(4, 0.05, 0.0) == 4 + 1


def test_the_loop_lag_stops_a_stream_earlier_but_is_not_charged() -> None:
    """On a hand clock: 100 tokens a second for a second, then 0.2 s without a read while the
    gateway was busy, its loop lately a second late. Deciding, that second is a margin (the
    close may go out that late); charging once the upstream is closed, the clock already ran
    through any stall: the provider made its speed times the 0.2 s, no more."""
    from hardcap_core.gateway.pace import Pace

    now = [1000.0]
    pace = Pace(lambda: now[0])
    pace.read(0)
    for _ in range(100):
        now[0] += PACE_S
        pace.read(1)
    now[0] += 0.2
    assert pace.in_flight(4, 0.05, 1.0) - 4 in (125, 126)  # (0.2 + 0.05 + 1.0) s at 100 a second
    assert pace.charged(4, 0.05, 1.0) - 4 in (25, 26)  # (0.2 + 0.05) s
    assert pace.charged(4, 0.05, 0.0) == pace.in_flight(4, 0.05, 0.0)
    pace.listen()  # waiting for a read from now: only the loop's lag may hide one that came
    now[0] += 3.0
    assert pace.charged(4, 0.05, 1.0) - 4 in (125, 126)
    assert pace.charged(4, 0.05, 0.1) - 4 in (35, 36)


def test_a_stream_cut_before_its_speed_is_known_is_charged_the_routes() -> None:
    """Two reads 20 ms apart say little of a provider's speed: the route's, learnt from a
    stream measured over a second, is charged while the stream's own is faster or unknown."""
    from hardcap_core.gateway.pace import Pace, RouteRate

    now = [1000.0]
    rate = RouteRate()
    long = Pace(lambda: now[0])
    long.read(0)
    for _ in range(100):
        now[0] += PACE_S
        long.read(1)
    rate.observe(long)
    assert rate.rate == pytest.approx(100.0)
    short = Pace(lambda: now[0])
    short.read(0)
    now[0] += 0.02
    short.read(1)
    rate.observe(short)  # too short to say anything of the route
    assert rate.rate == pytest.approx(100.0)
    now[0] += 0.2
    # Its own: 1 token over the least 0.1 s, 10 a second; the route's: 100 a second.
    assert short.charged(4, 0.05, 0.0) == 4 + 3
    assert short.charged(4, 0.05, 0.0, rate.rate) - 4 in (25, 26)
    assert long.charged(4, 0.05, 0.0, 1000.0) == long.charged(4, 0.05, 0.0)  # its own is known


@settings(max_examples=500, deadline=None)
@given(
    reads=st.lists(st.tuples(st.floats(0.0, 0.5), st.integers(0, 40)), min_size=1, max_size=60),
    idle=st.floats(0.0, 3.0),
    waiting=st.none() | st.floats(0.0, 3.0),
    lag=st.floats(0.0, 2.0),
)
def test_the_charge_of_a_cut_is_never_more_than_the_deciding_guess(
    reads: list[tuple[float, int]], idle: float, waiting: float | None, lag: float
) -> None:
    """Whatever the reads, the wait and the loop's lag: the tokens in flight a cut is charged
    are at most the guess that decided it (the same speed, margin and guard; no lag added but
    while waiting), and at least the guard and the margin."""
    from hardcap_core.gateway.pace import Pace

    now = [0.0]
    pace = Pace(lambda: now[0])
    pace.read(0)
    for gap, tokens in reads:
        now[0] += gap
        pace.read(tokens)
    if waiting is not None:
        now[0] += waiting
        pace.listen()
    now[0] += idle
    charged = pace.charged(4, 0.05, lag)
    assert 4 <= charged <= pace.in_flight(4, 0.05, lag)
    assert pace.charged(4, 0.05, lag, route_rate=1e6) >= charged
