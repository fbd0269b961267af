"""Output the provider bills without streaming it, through the relay on a real ledger on a real
Valkey: a summarized thinking stream (Claude 4: the full thinking billed, a summary streamed),
and silent reasoning (OpenAI's o-series: reasoning billed, never streamed).

The meter is set up as admission leaves it (gateway/unseen.py): the thinking budget held on top
of the least output and counted as generated from the start; silent reasoning held at the cap
the provider was sent. However the stream ends without the provider's final report, it is
charged at least the hold (with the report, the report: ``test_provider_fixtures``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from hardcap_core.budgets import Dimension
from hardcap_core.events import Event, Output, OutputKind, Read
from hardcap_core.gateway.meter import Meter, MeterSettings
from hardcap_core.gateway.pace import Listened
from hardcap_core.gateway.relay import Relay
from hardcap_core.gateway.unseen import Unseen
from hardcap_core.ledger import FREE, Admitted
from hardcap_core.ledger.estimators import MaxTokensEstimator
from hardcap_core.outcome import Outcome
from hardcap_core.wire.openai_chat import OpenAIChat
from hardcap_core.wire.openai_request import parse_chat_request
from tests.conftest import TENANT, scope
from tests.functional.test_relay import (
    CountingLedger,
    FixedClock,
    Script,
    chunk,
    content,
    role,
)

BUDGET_TOKENS = 1024  # thinking.budget_tokens
LEAST = 16  # the route's min_output_reservation
HOLD = BUDGET_TOKENS + LEAST  # what admission reserves for it (a fixed estimate of 150 is less)
REQUEST = parse_chat_request(json.dumps({
    "model": "claude", "messages": [{"role": "user", "content": "hi"}], "stream": True,
    "stream_options": {"include_usage": True},
}).encode())  # fmt: skip


def summary(n: int) -> list[Read]:
    """``n`` reads of summarized thinking, a token each: the provider billed ~20 for each."""
    return [
        [Event(raw=chunk({"reasoning_content": f"t{i} "}),
               output=[Output(OutputKind.REASONING, f"t{i} ", 1)], tokens=1)]
        for i in range(n)
    ]  # fmt: skip


def signature() -> Read:
    """The thinking's signature: counted by its length, with no lower bound (anthropic_events)."""
    piece = Output(OutputKind.REASONING, "", 43, 0, None, 0)
    return [Event(raw=chunk({}), output=[piece], tokens=43)]


async def relay(
    client: Any, script: Script, unseen: Unseen, *, hold: int, budget: int = 100_000,
    asked: int | None = None,
) -> Relay:  # fmt: skip
    ledger = CountingLedger(client)
    s = scope((TENANT, Dimension.OUTPUT_TOKENS, budget, "day"), levels=(TENANT,))
    admitted = await ledger.admit(s, input_tokens=20, output_estimate=hold)
    assert isinstance(admitted, Admitted)
    meter = Meter(
        ledger, s, admitted.reservation, MeterSettings(), input_estimate=20,
        estimator=MaxTokensEstimator(), route="claude", prices=FREE, unseen=unseen,
        clock=FixedClock(),
    )  # fmt: skip
    if asked is not None:
        meter.asked_for(asked)
    encoder = OpenAIChat().encoder(REQUEST, model="claude", same_dialect=True)
    return Relay(Listened(script.stream(), meter.pace), meter, encoder)


async def run(r: Relay, leave_after: int | None = None) -> None:
    await r.open()
    chunks = r.chunks()
    sent = 0
    async for _ in chunks:
        sent += 1
        if sent == leave_after:
            await chunks.aclose()
            await r.end(Outcome.CLIENT_GONE)


async def ledger_row(r: Relay) -> Any:
    rows = {row.budget.dimension: row for row in (await r.meter.ledger.usage(r.meter.scope)).rows}
    row = rows[Dimension.OUTPUT_TOKENS]
    assert row.reserved == 0 and row.used == r.meter.charged_output
    return row


async def test_the_thinking_budget_counts_as_generated_from_the_start(
    standalone_client: Any,
) -> None:
    r = await relay(standalone_client, Script([]), Unseen(tokens=BUDGET_TOKENS), hold=HOLD)
    assert r.meter.generated() >= BUDGET_TOKENS
    assert r.meter.estimated_output() == BUDGET_TOKENS + 4  # and the guard: nothing read yet


@pytest.mark.parametrize(
    "ending", ["incomplete", "client_gone", "error"], ids=["incomplete", "gone", "error"]
)
async def test_a_summarized_stream_without_its_bill_is_charged_at_least_the_hold(
    standalone_client: Any, ending: str
) -> None:
    """It streamed 10 summary tokens, a signature and 5 words: the provider billed up to the
    1,024 tokens of thinking behind that summary. Charged what streamed (about 60), it was
    1,000 tokens under the bill."""
    reads = [[role()], *summary(10), signature(), *[[content(f"w{i} ")] for i in range(5)]]
    if ending == "error":
        reads.append([Event(raw={"error": {"message": "overloaded"}}, error="overloaded")])
    r = await relay(
        standalone_client, Script(reads), Unseen(tokens=BUDGET_TOKENS), hold=HOLD, asked=4000
    )
    await run(r, leave_after=14 if ending == "client_gone" else None)
    outcome = {"incomplete": Outcome.INCOMPLETE, "client_gone": Outcome.CLIENT_GONE,
               "error": Outcome.UPSTREAM_ERROR}[ending]  # fmt: skip
    assert r.outcome is outcome
    row = await ledger_row(r)
    assert row.used >= r.meter.reserved >= HOLD
    assert row.used >= BUDGET_TOKENS + 10 + 43 + (5 if ending != "client_gone" else 0)


async def test_a_summarized_stream_cut_by_the_budget_is_charged_past_what_streamed(
    standalone_client: Any,
) -> None:
    """An output budget of 1,300: the hold takes 1,040 of it, the stream extends into the rest
    and is cut when the thinking budget plus what streamed would pass what it holds."""
    reads = [[role()], *summary(10), signature(), *[[content(f"w{i} ")] for i in range(200)]]
    r = await relay(
        standalone_client, Script(reads), Unseen(tokens=BUDGET_TOKENS), hold=HOLD, budget=1300
    )
    await run(r)
    assert r.outcome is Outcome.TRUNCATED
    forwarded = r.meter.seen - 10 - 43
    assert 0 < forwarded < 1300 - BUDGET_TOKENS - 10 - 43
    row = await ledger_row(r)
    assert BUDGET_TOKENS + 10 + 43 + forwarded <= row.used <= 1300


async def test_silent_reasoning_without_its_bill_is_charged_what_it_was_asked_for(
    standalone_client: Any,
) -> None:
    """The provider was asked for no more than the 300-token hold: it may have reasoned all of
    it unseen. Ended without a finish after 20 visible tokens, it is charged the 300."""
    reads = [[role()], *[[content(f"w{i} ")] for i in range(20)]]
    r = await relay(standalone_client, Script(reads), Unseen(whole=True), hold=300, asked=300)
    assert r.meter.generated() < 300  # nothing added live: the provider cannot pass the hold
    await run(r)
    assert r.outcome is Outcome.INCOMPLETE
    assert (await ledger_row(r)).used == 300
