"""The quote's decision (gateway/quote.py ``decide``) against the admit it reproduces: on real
Valkey (standalone and a 3-node cluster), random budgets, spend and holds in flight; the
quote, from the usage script's numbers, must answer what ``admit.lua`` then answers for the
same request (admit with the same output, busy, exceeded or never, naming the same budget).
The rate-limit branches, which the usage script does not read, are checked by hand."""

from __future__ import annotations

import random
import uuid
from dataclasses import replace

from hardcap_core.budgets import Dimension, Level, LevelKind, Prices, Scope
from hardcap_core.gateway.quote import Ask, Decision, RateNow, decide
from hardcap_core.ledger import Admitted, Ledger, Refused
from hardcap_core.ledger.replies import Refusal, UsageRow
from tests.conftest import scope

DIMS = (Dimension.TOTAL_TOKENS, Dimension.OUTPUT_TOKENS, Dimension.INPUT_TOKENS,
        Dimension.COST_USD)  # fmt: skip
PRICES = Prices(1_000, 3_000)  # nUSD per input / output token


async def hold(ledger: Ledger, sc: Scope, inp: int, out: int) -> object:
    return await ledger.admit(
        sc,
        input_tokens=inp,
        output_estimate=out,
        min_output=1,
        prices=PRICES,
    )


def admit_answer(result: object) -> Decision:
    """What the admit did, in the quote's terms."""
    if isinstance(result, Admitted):
        return Decision("admit", output_reserved=result.reservation.output_reserved)
    assert isinstance(result, Refused), result
    what = result.budget.field if result.budget else None
    if result.reason is Refusal.BUSY:
        return Decision("refuse", "busy", what, 1000)
    assert result.reason is Refusal.EXCEEDED
    return Decision("refuse", "never" if result.never_fits else "exceeded", what)


async def test_the_quote_decides_as_the_admit_does(ledger: Ledger) -> None:
    rng = random.Random(20261202)
    seen: set[str] = set()
    for trial in range(60):
        run = uuid.uuid4().hex[:8]
        key, tenant, org = (Level(LevelKind.KEY, f"k{run}"), Level(LevelKind.TENANT, f"t{run}"),
                            Level(LevelKind.ORG, f"o{run}"))  # fmt: skip
        rows = [(lvl, rng.choice(DIMS), rng.randint(50, 2_000), "day")
                for lvl in rng.sample([key, tenant, org], rng.randint(1, 3))]  # fmt: skip
        rows = [(lvl, d, lim * 4_000 if d is Dimension.COST_USD else lim, w)
                for lvl, d, lim, w in rows]  # fmt: skip
        sc = scope(*rows, levels=(key, tenant, org))
        for _ in range(rng.randint(0, 3)):  # spend: admitted and settled
            got = await hold(ledger, sc, rng.randint(1, 60), rng.randint(1, 200))
            if isinstance(got, Admitted):
                spent = rng.randint(0, got.reservation.output_reserved)
                r = got.reservation
                await ledger.settle(r, input_tokens=r.input_tokens, output_tokens=spent)
        for _ in range(rng.randint(0, 2)):  # holds in flight
            await hold(ledger, sc, rng.randint(1, 40), rng.randint(1, 300))
        estimate = rng.randint(1, 600)
        ask = Ask(
            input_tokens=rng.randint(1, 400),
            output_estimate=estimate,
            min_output=rng.choice([estimate, min(16, estimate)]),
            input_nusd=PRICES.input_nusd,
            output_nusd=PRICES.output_nusd,
            headroom=rng.choice([0, 32]),
            waits=False,
        )
        usage = await ledger.usage(sc)
        quoted = decide(ask, usage.rows, {lv.tag: n for lv, n in usage.live_by_level}, ())
        real = await ledger.admit(
            sc,
            input_tokens=ask.input_tokens,
            output_estimate=ask.output_estimate,
            min_output=ask.min_output,
            prices=PRICES,
            headroom=ask.headroom,
        )
        expected = admit_answer(real)
        got_ = (quoted.action, quoted.reason, quoted.output_reserved)
        assert got_ == (expected.action, expected.reason, expected.output_reserved), (trial, real)
        if quoted.reason in ("busy", "exceeded", "never"):
            assert quoted.what == expected.what, (trial, quoted, real)
        seen.add(quoted.reason or "admit")
    assert seen >= {"admit", "busy", "exceeded", "never"}  # every kind was exercised


def one_row(limit: int, used: int = 0, reserved: int = 0) -> list[UsageRow]:
    sc = scope((Level(LevelKind.TENANT, "acme"), Dimension.TOTAL_TOKENS, limit, "day"))
    return [UsageRow(sc.budgets[0], used, reserved, 5_000)]


ASK = Ask(input_tokens=10, output_estimate=100, min_output=16, input_nusd=0, output_nusd=0,
          headroom=0, waits=True)  # fmt: skip


def rate(rpm_left: int | None = None, tpm_room: int | None = None) -> RateNow:
    return RateNow("t:acme", None if rpm_left is None else 60, rpm_left, 2_000,
                   None if tpm_room is None else 1_000, tpm_room, 7_000)  # fmt: skip


def test_requests_per_minute_refuse_before_the_budgets() -> None:
    # admit.lua checks requests per minute first: even a request that never fits is 'rate'.
    got = decide(ASK, one_row(5), {}, [rate(rpm_left=0)])
    assert (got.action, got.reason, got.what, got.retry_after_ms) == (
        "refuse", "rate", "t:acme:rpm", 2_000)  # fmt: skip
    assert decide(ASK, one_row(1_000), {}, [rate(rpm_left=1)]).action == "admit"


def test_tokens_per_minute_refuse_after_the_budgets_and_cap_the_output() -> None:
    got = decide(ASK, one_row(1_000), {}, [rate(tpm_room=50)])
    assert (got.reason, got.what, got.retry_after_ms) == ("rate", "t:acme:tpm", 7_000)
    # Room for the input and the output: admitted; a busy budget is still busy first.
    assert decide(ASK, one_row(1_000), {}, [rate(tpm_room=500)]).output_reserved == 100
    assert decide(ASK, one_row(1_000, reserved=950), {}, [rate(tpm_room=50)]).action == "queue"


def test_holds_in_flight_queue_a_waiting_tenant_and_shrink_only_at_the_tail() -> None:
    assert decide(ASK, one_row(200, reserved=150), {}, ()) == Decision("queue", "busy",
                                                                        "t:acme:tot:d")  # fmt: skip
    # The tail: less than the estimate is left even with nothing in flight: shrunk to it.
    assert decide(ASK, one_row(60, used=10), {}, ()).output_reserved == 40
    # Headroom: each live hold keeps 32 tokens free for its extends.
    held = one_row(200, reserved=50)
    assert decide(ASK, held, {}, ()).action == "admit"
    # 200 - 50 held - 10 input leaves 140; two holds keep 64 free: 76 < 100, so it waits.
    assert decide(replace(ASK, headroom=32), held, {"t:acme": 2}, ()).action == "queue"
