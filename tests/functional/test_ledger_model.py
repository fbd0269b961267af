"""The real scripts against the reference model (tests/ledger_model.py), step by step.

Hypothesis drives admit / replay / extend / settle / expire / usage on one scope of four budgets
across three levels, with holds that are charged or returned when they expire, and requests
that could never fit. Each reply is compared with what the model says for the same operation at
the server time the reply carries, so reservations that expire on their own between steps are
handled exactly. After every step the server's raw keys (read without running a script, so
nothing is reclaimed by looking) must equal the model's state.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from hardcap_core.budgets import Dimension, Prices
from hardcap_core.errors import ReservationReused
from hardcap_core.ledger import (
    Admitted,
    Extended,
    ExtendRefused,
    Ledger,
    Refusal,
    Refused,
    Reservation,
    ReservationGone,
)
from hardcap_core.local.valkey import LocalValkey
from hardcap_core.rollup.records import parse_entry
from tests.conftest import KEY, ORG, TENANT, scope
from tests.ledger_model import LedgerModel, amount, per_output

TTL_S = 0.1
SLEEP_PAST_MS = 5
SCOPE = scope(
    (TENANT, Dimension.TOTAL_TOKENS, 1000, "month"),
    (KEY, Dimension.OUTPUT_TOKENS, 600, "month"),
    (ORG, Dimension.COST_USD, 2500, "month"),  # nano-USD, with the tiny prices below
    (KEY, Dimension.INPUT_TOKENS, 400, "month"),
)
# A zero output price makes the cost budget blind to output, like an input budget.
PRICES = st.sampled_from([Prices(1, 3), Prices(2, 1), Prices(0, 2), Prices(1, 0)])
REASONS = {Refusal.BUSY: "busy", Refusal.EXCEEDED: "exceeded"}
LEVELS = [level.tag for level in SCOPE.levels]


class LedgerMachine(RuleBasedStateMachine):
    url = ""  # set by the test from the session server

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.client: Any = aioredis.Redis.from_url(self.url)
        self.run(self.client.flushall())
        self.ledger = Ledger(self.client, reservation_ttl_s=TTL_S)
        self.model = LedgerModel(SCOPE.budgets, self.ledger.ttl_ms, LEVELS)
        self.rids: list[str] = []  # every id ever admitted, in order
        self.reservations: dict[str, Reservation] = {}

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.client.aclose())
        self.loop.close()

    def pick(self, which: int, live: bool, charged: bool = False) -> Reservation:
        """One id ever admitted, or (``live``) one the model still holds, or (``charged``) one
        whose hold expiry charged, if any."""
        held = [rid for rid in self.rids if rid in self.model.live]
        expired = [rid for rid in self.rids if rid in self.model.expired]
        rids = expired if charged and expired else held if live and held else self.rids
        return self.reservations[rids[which % len(rids)]]

    # -- rules --------------------------------------------------------------------------------

    @rule(
        input_tokens=st.integers(0, 100),
        estimate=st.integers(1, 250),
        min_output=st.integers(1, 80),
        prices=PRICES,
        charge=st.booleans(),
    )
    def admit(
        self, input_tokens: int, estimate: int, min_output: int, prices: Prices, charge: bool
    ) -> None:
        self._admit(uuid.uuid4().hex, input_tokens, estimate, min_output, prices, charge)

    @rule(input_tokens=st.integers(900, 1100), min_output=st.integers(1, 120), prices=PRICES)
    def admit_larger_than_a_budget(
        self, input_tokens: int, min_output: int, prices: Prices
    ) -> None:
        """Often too large for the whole total or input budget, empty or not."""
        self._admit(uuid.uuid4().hex, input_tokens, 120, min_output, prices, True)

    @precondition(lambda self: self.rids)
    @rule(
        which=st.integers(0, 50),
        input_tokens=st.integers(0, 100),
        estimate=st.integers(1, 250),
        prices=PRICES,
    )
    def replay(self, which: int, input_tokens: int, estimate: int, prices: Prices) -> None:
        """Admit an id seen before: live, settled or expired (charged or returned)."""
        self._admit(self.pick(which, False).id, input_tokens, estimate, estimate, prices, True)

    @precondition(lambda self: self.rids)
    @rule(
        which=st.integers(0, 50),
        live=st.booleans(),
        n=st.integers(0, 100),
        least=st.integers(0, 100),
    )
    def extend(self, which: int, live: bool, n: int, least: int) -> None:
        res = self.pick(which, live)
        held = self.model.live.get(res.id)
        got = self.run(self.ledger.extend(res, n, least=least))
        want = self.model.extend(got.server_time_ms, res.id, want=n, least=least)
        if isinstance(got, ReservationGone):
            assert want.kind == "gone", (got, want)
            return
        states = tuple(b.remaining for b in got.budgets)
        resets = tuple(b.reset_ms for b in got.budgets)
        assert (states, resets) == (want.remaining, want.reset_ms), (got, want)
        if isinstance(got, ExtendRefused):
            assert got.budget is not None
            assert (want.kind, want.field) == ("no", got.budget.field), (got, want)
            return
        assert isinstance(got, Extended)
        assert (want.kind, want.granted, want.output_reserved) == (
            "ok",
            got.granted,
            got.output_reserved,
        ), (got, want)
        if got.granted > 0:
            # Extend only checks (and only adds to) the budgets that output counts against;
            # an input budget pushed over by an earlier settle stays over.
            assert held is not None
            for b in got.budgets:
                if per_output(b.budget.dimension.short, held.prices) > 0:
                    assert b.remaining >= 0, got

    @precondition(lambda self: self.rids)
    @rule(
        which=st.integers(0, 50),
        live=st.booleans(),
        charged=st.booleans(),
        actual_in=st.integers(0, 150),
        actual_out=st.integers(0, 400),
    )
    def settle(
        self, which: int, live: bool, charged: bool, actual_in: int, actual_out: int
    ) -> None:
        res = self.pick(which, live, charged)
        got = self.run(self.ledger.settle(res, input_tokens=actual_in, output_tokens=actual_out))
        want = self.model.settle(
            got.server_time_ms,
            res.id,
            input_tokens=actual_in,
            output_tokens=actual_out,
            prices=res.prices,
        )
        assert got.duplicate == (want.kind == "dup"), (got, want)
        assert got.had_reservation == want.had_reservation, (got, want)
        assert got.expiry_charged == want.expiry_charged, (got, want)
        assert tuple(b.remaining for b in got.budgets) == want.remaining, (got, want)
        assert tuple(b.reset_ms for b in got.budgets) == want.reset_ms, (got, want)

    @rule(which=st.integers(0, 50))
    def expire(self, which: int) -> None:
        """Sleep just past one live reservation's expiry, so it and every earlier one expire.

        Nothing is reclaimed until a script looks, so the next settle may still find them.
        (No precondition: one that reads the clock makes Hypothesis's replays draw differently.)
        """
        pending = self._pending_expiries()
        if not pending:
            return
        target = pending[which % len(pending)]
        time.sleep(max(target - self.ledger.server_now_ms() + SLEEP_PAST_MS, 0) / 1000)

    @rule()
    def usage(self) -> None:
        got = self.run(self.ledger.usage(SCOPE))
        want = self.model.usage(got.server_time_ms)
        assert tuple(r.used for r in got.rows) == want.used, (got, want)
        assert tuple(r.reserved for r in got.rows) == want.reserved, (got, want)
        assert tuple(r.reset_ms for r in got.rows) == want.reset_ms, (got, want)
        assert tuple(n for _, n in got.live_by_level) == want.live_by_level, (got, want)
        assert got.live_reservations == want.live_by_level[LEVELS.index(TENANT.tag)]

    # -- the server's raw state ---------------------------------------------------------------

    @invariant()
    def server_state_is_the_model_state(self) -> None:
        self.run(self._compare_raw_state())

    async def _compare_raw_state(self) -> None:
        # Every budget is on the month window, so all used keys share one name but its id.
        keys = self.ledger.keys.ledger(SCOPE)
        k_reserved, k_res, k_exp, _, k_expired, k_expired_at, k_live = keys[:7]
        reserved = {k.decode(): int(v) for k, v in (await self.client.hgetall(k_reserved)).items()}
        assert _nonzero(reserved) == _nonzero(self.model.reserved)

        records = {k.decode(): json.loads(v) for k, v in (await self.client.hgetall(k_res)).items()}
        expiry = {
            k.decode(): int(s) for k, s in await self.client.zrange(k_exp, 0, -1, withscores=True)
        }
        assert set(records) == set(self.model.live) == set(expiry)
        for rid, h in self.model.live.items():
            rec = records[rid]
            assert (rec["i"], rec["o"], rec["pi"], rec["po"]) == (
                h.input_tokens,
                h.output_tokens,
                h.prices.input_nusd,
                h.prices.output_nusd,
            ), (rec, h)
            assert (tuple(rec["f"]), tuple(rec["d"])) == (h.fields, h.dims)
            assert (rec["x"], tuple(rec["lv"])) == (int(h.charge_on_expiry), h.levels), rec
            assert expiry[rid] == h.expiry_ms

        live = {k.decode(): int(v) for k, v in (await self.client.hgetall(k_live)).items()}
        assert live == self.model.live_count

        charges = {
            k.decode(): json.loads(v) for k, v in (await self.client.hgetall(k_expired)).items()
        }
        forget = {
            k.decode(): int(s)
            for k, s in await self.client.zrange(k_expired_at, 0, -1, withscores=True)
        }
        assert set(charges) == set(self.model.expired) == set(forget)
        for rid, c in self.model.expired.items():
            got = charges[rid]
            rows = tuple((f, d, key.rsplit(":", 1)[1]) for f, d, key in got["c"])
            assert rows == c.rows, (got, c)
            assert (got["i"], got["o"], got["pi"], got["po"], got["e"]) == (
                c.input_tokens,
                c.output_tokens,
                c.prices.input_nusd,
                c.prices.output_nusd,
                1,
            )
            for f, d, _ in rows:
                assert amount(d, got["i"], got["o"], c.prices) == c.charged(d), f
            assert forget[rid] == c.forget_ms

        used: dict[tuple[str, str], int] = {}
        base = self.ledger.keys.used(SCOPE, SCOPE.budgets[0].window.spec, "")
        async for key in self.client.scan_iter(match=f"{_glob(base)}*"):
            window_id = key.decode()[len(base) :]
            for f, v in (await self.client.hgetall(key)).items():
                used[(f.decode(), window_id)] = int(v)
        assert _nonzero(used) == _nonzero(self.model.used)

        # Nothing is charged without its usage record: the records add up to the counters.
        stream = await self.client.xrange(keys[7])
        records = [parse_entry(i, f) for i, f in stream]
        by_field = {b.field: 0 for b in SCOPE.budgets}
        for (f, _), v in used.items():
            by_field[f] = by_field.get(f, 0) + v
        tokens = sum(r.input_tokens + r.output_tokens for r in records)
        cost = sum(r.cost_nusd for r in records)
        assert tokens == by_field[SCOPE.budgets[0].field], (tokens, by_field)
        assert cost == by_field[SCOPE.budgets[2].field], (cost, by_field)

        marker = self.ledger.keys.settled(SCOPE, "")
        settled = {
            k.decode()[len(marker) :]
            async for k in self.client.scan_iter(match=f"{_glob(marker)}*")
        }
        assert settled == self.model.settled

    # -- helpers ------------------------------------------------------------------------------

    def _pending_expiries(self) -> list[int]:
        """Expiry times, server clock, of live reservations that have not expired yet."""
        now = self.ledger.server_now_ms()
        return sorted(h.expiry_ms for h in self.model.live.values() if h.expiry_ms > now)

    def _admit(
        self,
        rid: str,
        input_tokens: int,
        estimate: int,
        min_output: int,
        prices: Prices,
        charge: bool,
    ) -> None:
        least = min(min_output, estimate)
        try:
            got = self.run(
                self.ledger.admit(
                    SCOPE,
                    input_tokens=input_tokens,
                    output_estimate=estimate,
                    min_output=least,
                    prices=prices,
                    reservation_id=rid,
                    charge_on_expiry=charge,
                )
            )
        except ReservationReused:
            # Single-use ids: a settled or expiry-charged one is refused before anything else.
            assert rid in self.model.settled or rid in self.model.expired
            return
        assert isinstance(got, Admitted | Refused)
        want = self.model.admit(
            got.server_time_ms,
            rid,
            input_tokens=input_tokens,
            estimate=estimate,
            min_output=least,
            prices=prices,
            charge_on_expiry=charge,
        )
        states = tuple(b.remaining for b in got.budgets)
        resets = tuple(b.reset_ms for b in got.budgets)
        assert (states, resets) == (want.remaining, want.reset_ms), (got, want)
        if isinstance(got, Refused):
            assert got.budget is not None, got
            kind = "never" if got.never_fits else REASONS[got.reason]
            assert (kind, got.budget.field, got.retry_after_ms) == (
                want.kind,
                want.field,
                want.retry_after_ms,
            ), (got, want)
            return
        assert (want.kind, want.output_reserved) == ("ok", got.reservation.output_reserved)
        if rid not in self.reservations:
            self.rids.append(rid)
        self.reservations[rid] = got.reservation
        if not want.replay:
            # The invariant: an admission that reserved leaves every budget within its limit.
            assert all(s >= 0 for s in states), got


def _nonzero(d: dict[Any, int]) -> dict[Any, int]:
    return {k: v for k, v in d.items() if v != 0}


def _glob(text: str) -> str:
    """``text`` as a literal SCAN pattern (key names carry ``{`` ``}`` hash tags)."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


@pytest.mark.slow
def test_scripts_match_the_reference_model(valkey: LocalValkey) -> None:
    LedgerMachine.url = valkey.url
    run_state_machine_as_test(
        LedgerMachine,
        settings=settings(
            max_examples=50,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


async def test_extend_asking_for_more_than_it_wants(standalone_client: Any) -> None:
    """``least`` above ``tokens`` is taken as ``tokens``, not refused by a missing budget.

    Regression: extend.lua used to refuse with no budget to name and fail on ``spec.b[nil]``.
    """
    ledger = Ledger(standalone_client)
    a = await ledger.admit(SCOPE, input_tokens=0, output_estimate=10)
    assert isinstance(a, Admitted)
    e = await ledger.extend(a.reservation, 5, least=10)
    assert isinstance(e, Extended) and (e.granted, e.output_reserved) == (5, 15)
