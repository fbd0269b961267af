"""The real scripts against the leases' reference model (tests/lease_model.py), step by step.

Hypothesis drives open (on the scope or under a live lease, up to the depth bound) / admit
under a lease / extend / settle / close on one scope of three budgets. After every step the
server's raw keys (the reserved hash and the lease records, read without running a script) must
equal the model's, and the bounds hold: used + reserved <= limit on every budget, and a lease's
spent + held <= its envelope.
"""

from __future__ import annotations

import asyncio
import json
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
from hardcap_core.errors import InvalidRequest
from hardcap_core.ledger import Admitted, Extended, Ledger, Refused, Reservation, ReservationMeta
from hardcap_core.ledger.leases import LeaseOpened, LeaseOwner, Leases
from hardcap_core.local.valkey import LocalValkey
from tests.conftest import KEY, ORG, TENANT, scope
from tests.lease_model import LeaseModel

SCOPE = scope(
    (TENANT, Dimension.TOTAL_TOKENS, 3000, "month"),
    (KEY, Dimension.OUTPUT_TOKENS, 2000, "month"),
    (ORG, Dimension.COST_USD, 20_000, "month"),
)
PRICES = Prices(1, 3)
MAX_DEPTH = 3
OWNER = LeaseOwner("acme")


class LeaseMachine(RuleBasedStateMachine):
    url = ""  # set by the test from the session server

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.client: Any = aioredis.Redis.from_url(self.url)
        self.run(self.client.flushall())
        self.ledger = Ledger(self.client, reservation_ttl_s=600)
        self.leases = Leases(self.ledger, max_depth=MAX_DEPTH)
        self.model = LeaseModel(SCOPE.budgets)
        self.held: dict[str, Reservation] = {}
        self.plan = self.ledger.plans.of(SCOPE)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.client.aclose())
        self.loop.close()

    def lease(self, which: int) -> str:
        ids = list(self.model.leases)  # in order of opening: ids are random
        return ids[which % len(ids)]

    # -- rules --------------------------------------------------------------------------------

    @rule(tokens=st.integers(50, 1500))
    def open(self, tokens: int) -> None:
        self._open(tokens, None)

    @precondition(lambda self: self.model.leases)
    @rule(tokens=st.integers(20, 600), which=st.integers(0, 20))
    def open_under(self, tokens: int, which: int) -> None:
        self._open(tokens, self.lease(which))

    @precondition(lambda self: self.model.leases)
    @rule(
        which=st.integers(0, 20),
        input_tokens=st.integers(0, 60),
        estimate=st.integers(1, 200),
        least=st.integers(1, 200),
    )
    def admit(self, which: int, input_tokens: int, estimate: int, least: int) -> None:
        lid = self.lease(which)
        res = self.run(
            self.ledger.admit(
                SCOPE, input_tokens=input_tokens, output_estimate=estimate,
                min_output=min(least, estimate), prices=PRICES,
                meta=ReservationMeta(lease=lid),
            )
        )  # fmt: skip
        if isinstance(res, Admitted):
            r = res.reservation
            assert min(least, estimate) <= r.output_reserved <= estimate
            self.model.admit(r.id, lid, input_tokens, r.output_reserved, PRICES)
            self.held[r.id] = r
        else:
            assert isinstance(res, Refused), res
            lease = self.model.leases[lid]
            room = lease.tokens - lease.spent - lease.held - input_tokens
            # Refused by the lease only when it has no room for the least output.
            assert not res.lease or room < min(least, estimate), (res, room)

    @precondition(lambda self: self.held)
    @rule(which=st.integers(0, 50), n=st.integers(1, 150))
    def extend(self, which: int, n: int) -> None:
        rid = list(self.held)[which % len(self.held)]
        res = self.run(self.ledger.extend(self.held[rid], n))
        if isinstance(res, Extended):
            self.model.extend(rid, res.granted)

    @precondition(lambda self: self.held)
    @rule(which=st.integers(0, 50), share=st.floats(0, 1))
    def settle(self, which: int, share: float) -> None:
        rid = list(self.held)[which % len(self.held)]
        r = self.held.pop(rid)
        out = int(self.model.requests[rid].output_tokens * share)
        self.run(self.ledger.settle(r, input_tokens=r.input_tokens, output_tokens=out))
        self.model.settle(rid, r.input_tokens, out)

    @precondition(lambda self: self.model.leases)
    @rule(which=st.integers(0, 20))
    def close(self, which: int) -> None:
        lid = self.lease(which)
        last = self.run(self.leases.close(SCOPE, OWNER, lid))
        assert last.spent_tokens == self.model.leases[lid].spent
        self.model.close(lid)

    # -- the comparison -----------------------------------------------------------------------

    @invariant()
    def server_state_is_the_model_state(self) -> None:
        self.run(self._compare())

    async def _compare(self) -> None:
        k_reserved, k_res = self.plan.ledger_keys[0], self.plan.ledger_keys[1]
        raw = await self.client.hgetall(k_reserved)
        reserved = {k.decode(): int(v) for k, v in raw.items() if int(v)}
        assert reserved == {f: v for f, v in self.model.reserved.items() if v}
        records = {
            k.decode()[2:]: json.loads(v)
            for k, v in (await self.client.hgetall(k_res)).items()
            if k.startswith(b"L:")
        }
        assert set(records) == set(self.model.leases)
        for lid, rec in records.items():
            m = self.model.leases[lid]
            assert (rec["ut"], rec["rt"], rec["dp"]) == (m.spent, m.held, m.depth)
            assert {f: v for f, v in rec["h"].items() if v} == {
                f: v for f, v in m.hold.items() if v
            }
            assert m.spent + m.held <= m.tokens  # the envelope bounds its spend
        for row in (await self.ledger.usage(SCOPE)).rows:
            assert row.used == self.model.used[row.budget.field]
            assert row.used + row.reserved <= row.budget.limit

    def _open(self, tokens: int, parent: str | None) -> None:
        fits = self.model.fits_open(tokens, parent)
        too_deep = parent is not None and self.model.leases[parent].depth >= MAX_DEPTH
        try:
            res = self.run(self.leases.open(SCOPE, OWNER, ttl_s=600, tokens=tokens, parent=parent))
        except InvalidRequest:
            assert too_deep
            return
        assert not too_deep
        assert isinstance(res, LeaseOpened) == fits, res
        if isinstance(res, LeaseOpened):
            self.model.open(res.id, tokens, parent)


@pytest.mark.slow
def test_lease_scripts_match_the_reference_model(valkey: LocalValkey) -> None:
    LeaseMachine.url = valkey.url
    run_state_machine_as_test(
        LeaseMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
