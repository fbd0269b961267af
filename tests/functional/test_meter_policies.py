"""One stream, four hold policies (gateway/money.py), against a real ledger on a real Valkey.

The same provider (one token per read, 100 tokens per second, 200 tokens) streams into a
100-token budget under each route policy, and under a tenant that failed open (admission got
no answer: nothing held). What the client receives and what the ledger is charged is what
docs/config.md promises of each policy.
"""

from __future__ import annotations

from typing import Any

import pytest

from hardcap_core.budgets import Dimension, Scope
from hardcap_core.config import Policy
from hardcap_core.events import Usage
from hardcap_core.gateway.meter import Meter, MeterSettings
from hardcap_core.ledger import FREE, Admitted, ExtendResult, Ledger, Reservation
from hardcap_core.ledger.estimators import MaxTokensEstimator
from hardcap_core.outcome import Outcome
from tests.conftest import TENANT, scope

PACE_S = 0.01  # the provider: 100 tokens per second
BUDGET = 100
MADE = 200  # what the provider generates if nothing stops it


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingLedger(Ledger):
    """The real ledger, counting the calls that grow or refresh a hold."""

    extends = 0

    async def extend(
        self, reservation: Reservation, tokens: int, *, least: int = 1
    ) -> ExtendResult:
        self.extends += 1
        return await super().extend(reservation, tokens, least=least)


def budget() -> Scope:
    return scope((TENANT, Dimension.OUTPUT_TOKENS, BUDGET, "day"), levels=(TENANT,))


async def meter_for(
    ledger: Ledger, policy: Policy, clock: Clock, *, held: bool, cap: int | None = None
) -> Meter:
    s = budget()
    reservation = None
    if held:
        admitted = await ledger.admit(s, input_tokens=0, output_estimate=40)
        assert isinstance(admitted, Admitted)
        reservation = admitted.reservation
    return Meter(
        ledger, s, reservation, MeterSettings(), policy=policy, input_estimate=0,
        estimator=MaxTokensEstimator(), route="r", prices=FREE, cap=cap, clock=clock,
    )  # fmt: skip


async def stream(meter: Meter, clock: Clock) -> int:
    """Forward the provider's output one token per read at its pace; how many went out."""
    meter.note_read(0)  # the role chunk
    for sent in range(MADE):
        clock.now += PACE_S
        meter.note_read(1, least=1)
        if not await meter.make_room(1):
            return sent
    return MADE


async def used(ledger: Ledger) -> int:
    return (await ledger.usage(budget())).rows[0].used


async def test_truncate_stops_the_stream_within_the_budget_and_charges_what_it_made(
    standalone_client: Any,
) -> None:
    clock, ledger = Clock(), CountingLedger(standalone_client)
    meter = await meter_for(ledger, Policy.TRUNCATE, clock, held=True)
    sent = await stream(meter, clock)
    assert meter.truncated and ledger.extends > 0 and sent < BUDGET
    await meter.settle(Outcome.TRUNCATED)
    assert sent < meter.charged_output <= BUDGET == meter.reserved
    assert await used(ledger) == meter.charged_output


async def test_allow_grows_the_hold_then_runs_past_the_budget_and_charges_it_all(
    standalone_client: Any,
) -> None:
    clock, ledger = Clock(), CountingLedger(standalone_client)
    meter = await meter_for(ledger, Policy.ALLOW, clock, held=True)
    assert await stream(meter, clock) == MADE
    assert not meter.truncated and ledger.extends > 0 and meter.reserved == BUDGET
    await meter.settle(Outcome.COMPLETED, Usage(0, MADE))
    assert await used(ledger) == MADE  # the ledger shows the overshoot


async def test_count_after_holds_only_what_admission_reserved_and_charges_at_the_end(
    standalone_client: Any,
) -> None:
    clock, ledger = Clock(), CountingLedger(standalone_client)
    meter = await meter_for(ledger, Policy.COUNT_AFTER, clock, held=True)
    assert await stream(meter, clock) == MADE
    assert ledger.extends == 0 and meter.reserved == 40
    await meter.keep_alive()  # returns at once: nothing to keep alive
    await meter.settle(Outcome.COMPLETED, Usage(0, MADE))
    assert await used(ledger) == MADE


@pytest.mark.parametrize("policy", list(Policy))
async def test_without_a_hold_only_the_cap_stops_a_stream_and_its_cut_charges_all_in_flight(
    standalone_client: Any, policy: Policy
) -> None:
    """A fail-open tenant whose admission got no answer: whatever the route's policy, nothing
    grows or refreshes a hold, the cap still stops it, and a cut charges every token the
    provider made by the estimate (no hold bounds the guess); the settle reaches the ledger."""
    clock, ledger = Clock(), CountingLedger(standalone_client)
    meter = await meter_for(ledger, policy, clock, held=False, cap=150)
    sent = await stream(meter, clock)
    assert sent == 150 and meter.truncated and ledger.extends == 0
    assert await meter.heartbeat()  # nothing held, nothing to refresh
    estimate = meter.estimated_output()
    assert estimate == meter.seen + meter.in_hand + meter.in_flight() > sent
    await meter.settle(Outcome.CLIENT_GONE)
    assert meter.charged_output == estimate
    assert await used(ledger) == estimate  # past the budget: nothing held it back
