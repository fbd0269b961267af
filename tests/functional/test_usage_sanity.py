"""A provider's usage report is believed only within what it could have billed.

Against a real ledger on a real Valkey: a report that says more than the cap the provider was
sent (9,007,199,254,740,993 output tokens for a cap of 50), less than nothing, or past what a
64-bit integer holds is no bill. The request is charged as one whose provider reported
nothing, never past its hold; the gateway logs the raw value and writes an
``UpstreamUsageRejected`` metric. A report within the bounds is the bill, as before.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from hardcap_core.budgets import Dimension
from hardcap_core.events import Usage
from hardcap_core.gateway.meter import Meter
from hardcap_core.gateway.money import (
    REPORTED_INPUT_ALLOWANCE,
    REPORTED_INPUT_FACTOR,
    REPORTED_OUTPUT_ALLOWANCE,
    REPORTED_OUTPUT_FACTOR,
    implausible,
)
from hardcap_core.ledger import FREE, Admitted, Ledger
from hardcap_core.ledger.estimators import MaxTokensEstimator
from hardcap_core.outcome import Outcome
from tests.conftest import TENANT, scope
from tests.functional.test_meter import SETTINGS, Clock

BUDGET = 1000
CAP = 50  # the max_tokens the provider was sent
INPUT = 30  # the gateway's bound of the request's input
HUGE = 9_007_199_254_740_993  # 2^53 + 1: past what a double holds exactly
INT64_MAX = (1 << 63) - 1
MOST_INPUT = INPUT * REPORTED_INPUT_FACTOR + REPORTED_INPUT_ALLOWANCE
MOST_OUTPUT = CAP + REPORTED_OUTPUT_ALLOWANCE

LIES = {
    "output-2^53+1": Usage(25, HUGE),
    "output-negative": Usage(25, -1_000_000_000),
    "output-int64-max": Usage(25, INT64_MAX),
    "output-past-the-cap": Usage(25, MOST_OUTPUT + 1),
    "input-2^53+1": Usage(HUGE, 20),
    "input-negative": Usage(-1_000_000_000, 20),
    "input-past-its-bound": Usage(MOST_INPUT + 1, 20),
    "reasoning-int64-max": Usage(25, 20, reasoning_tokens=INT64_MAX),
    "cached-past-the-input": Usage(25, 20, cached_input_tokens=26),
    "cache-writes-negative": Usage(25, 20, cache_write_input_tokens=-5),
}


async def meter_for(client: Any, *, reserve: int = CAP) -> Meter:
    """A meter on a fresh hold of ``reserve`` output tokens in an output budget of
    :data:`BUDGET`, for a request whose provider was sent ``max_tokens`` :data:`CAP`."""
    ledger = Ledger(client)
    s = scope((TENANT, Dimension.OUTPUT_TOKENS, BUDGET, "day"), levels=(TENANT,))
    admitted = await ledger.admit(s, input_tokens=INPUT, output_estimate=reserve)
    assert isinstance(admitted, Admitted)
    meter = Meter(
        ledger, s, admitted.reservation, SETTINGS, input_estimate=INPUT,
        estimator=MaxTokensEstimator(), route="r", prices=FREE, cap=CAP, upstream="liar",
        clock=Clock(),
    )  # fmt: skip
    meter.asked_for(CAP)
    return meter


def used(meter: Meter) -> int:
    (state,) = [b for b in meter.final_budgets if b.budget.dimension is Dimension.OUTPUT_TOKENS]
    return BUDGET - state.remaining


def rejections(out: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [line for line in lines if "UpstreamUsageRejected" in line]


async def settled_reply(client: Any, report: Usage) -> Meter:
    """A meter that read 20 output tokens (held), then the read that ends the reply, with
    ``report``, and settled the reply as completed with it."""
    meter = await meter_for(client)
    meter.note_read(20, least=20)
    assert await meter.make_room(20, at_least=20)
    meter.note_read(0, final=report)  # the read that ends the reply, with the report
    await meter.settle(Outcome.COMPLETED, report)
    return meter


@pytest.mark.parametrize("report", list(LIES.values()), ids=list(LIES))
async def test_a_stream_whose_final_report_lies_is_charged_as_one_that_reported_none(
    standalone_client: Any, capsys: pytest.CaptureFixture[str], report: Usage
) -> None:
    meter = await settled_reply(standalone_client, report)
    # What arrived, and the input as the gateway bounded it: never the lie, never past the hold.
    assert (meter.charged_input, meter.charged_output) == (INPUT, 20)
    assert used(meter) == 20
    (line,) = rejections(capsys.readouterr().out)
    assert line["Upstream"] == "liar" and line["UpstreamUsageRejected"] == 1
    bad = implausible(report, input_bound=INPUT, output_bound=MOST_OUTPUT)
    assert bad is not None
    assert (line["field"], line["raw_value"]) == (bad.field, str(bad.value))


async def test_a_negative_final_report_does_not_let_the_rest_of_the_read_go_out_uncounted(
    standalone_client: Any,
) -> None:
    """A final report that fits the hold lets the rest of its read out whatever the gateway
    counts; a negative one would fit any hold. It is no report: the count decides."""
    meter = await meter_for(standalone_client, reserve=30)
    meter.exhausted = True  # the budget refused to grow the hold: 30 is all there is
    meter.note_read(40, least=40, final=Usage(25, -1_000_000_000))
    assert not await meter.make_room(
        40, at_least=40
    )  # 40 is past the hold of 30: the stream is cut
    await meter.settle(Outcome.TRUNCATED)
    assert 30 <= meter.charged_output <= CAP  # what arrived, within the cap it was sent


async def test_one_lie_makes_every_report_of_the_request_unbelieved(
    standalone_client: Any,
) -> None:
    """Anthropic reports the input first (message_start) and the output at the end: once one
    count is a lie, the other is no more to be believed."""
    meter = await meter_for(standalone_client)
    assert meter.believe(Usage(HUGE, 1)) is None
    meter.note_read(10, least=10)
    assert await meter.make_room(10, at_least=10)
    meter.note_read(0, final=Usage(25, 10))
    await meter.settle(Outcome.COMPLETED, Usage(25, 10))
    assert (meter.charged_input, meter.charged_output) == (INPUT, 10)


@pytest.mark.parametrize(
    "report",
    [
        Usage(25, 20),
        Usage(MOST_INPUT, MOST_OUTPUT, reasoning_tokens=MOST_OUTPUT),
        Usage(25, 20, cached_input_tokens=10, cache_write_input_tokens=15),
        Usage(0, 20),
    ],
    ids=["plain", "at-the-bounds", "cache-reads-and-writes", "no-input"],
)
async def test_a_report_within_the_bounds_is_the_bill(
    standalone_client: Any, capsys: pytest.CaptureFixture[str], report: Usage
) -> None:
    meter = await settled_reply(standalone_client, report)
    assert (meter.charged_input, meter.charged_output) == (report.input_tokens,
                                                          report.output_tokens)  # fmt: skip
    assert rejections(capsys.readouterr().out) == []


async def test_a_provider_that_ignored_the_cap_may_report_what_arrived(
    standalone_client: Any,
) -> None:
    """More pieces than the cap prove the provider ignored it: then a report of up to a few
    times what arrived is believed (a tool call's framing is billed and never streamed, so the
    gateway's count of its text runs low), and one past that is not."""
    meter = await meter_for(standalone_client, reserve=300)
    meter.note_read(120, least=120)
    assert not await meter.make_room(120, at_least=120)  # cut at the request's cap
    meter.note_read(0, final=Usage(25, 260))
    await meter.settle(Outcome.TRUNCATED)
    assert meter.charged_output == 260
    liar = await meter_for(standalone_client, reserve=700)
    liar.note_read(120, least=120)
    assert not await liar.make_room(120, at_least=120)
    liar.note_read(0, final=Usage(25, 120 * REPORTED_OUTPUT_FACTOR + REPORTED_OUTPUT_ALLOWANCE + 1))
    await liar.settle(Outcome.TRUNCATED)
    assert liar.charged_output < 120 * REPORTED_OUTPUT_FACTOR


async def test_a_whole_reply_whose_report_lies_is_charged_its_cap(
    standalone_client: Any,
) -> None:
    """As a whole reply without a report is charged today (gateway/pipeline.py): the cap it
    was sent, which is its hold."""
    meter = await meter_for(standalone_client)
    usage = meter.believe(Usage(25, HUGE))
    assert usage is None
    meter.received_whole(CAP)  # no report: the cap it was sent
    await meter.settle(Outcome.COMPLETED, Usage(25, HUGE))
    assert (meter.charged_input, meter.charged_output) == (INPUT, CAP)
    assert used(meter) == CAP
