"""Representative ledger calls, run against a recording client: the exact keys and argv each
script is sent (tests/unit/test_ledger_wire.py compares them with what the previous release
sent; ``python -m tests.unit.ledger_wire_cases`` prints them as JSON)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import deque
from collections.abc import Sequence
from typing import Any

from hardcap_core.budgets import Dimension, Level, LevelKind, Prices, RateLimit, Window
from hardcap_core.config.settings import BreakerSettings
from hardcap_core.ledger import Ledger
from hardcap_core.ledger.allowances import ALLOWANCE_SCRIPTS, SharedLimits, shared_budgets
from hardcap_core.ledger.breakers import Breakers
from hardcap_core.ledger.leases import LeaseOwner, Leases
from hardcap_core.ledger.replies import ReservationMeta, SettleNote
from hardcap_core.ledger.scripts import LEDGER_SCRIPTS, STANDALONE_SCRIPTS, source
from tests.conftest import KEY, ORG, TENANT, scope

NOW = 1_767_225_600_123  # 2026-01-01T00:00:00.123Z: the clock every case runs at
TOT, OUT, IN, USD = (
    Dimension.TOTAL_TOKENS,
    Dimension.OUTPUT_TOKENS,
    Dimension.INPUT_TOKENS,
    Dimension.COST_USD,
)
USER = Level(LevelKind.USER, "acme~ann")

DEFAULT_REPLIES: dict[str, list[Any]] = {
    "admit": ["ok", NOW, 300, 0],
    "extend": ["ok", NOW, 50, 350, 0],
    "settle": ["ok", NOW, 1, 0, 0],
    "usage": ["ok", NOW, 0, 0],
    "hydrate": ["ok", NOW, 1],
    "leave": ["ok", NOW, 1],
    "lease_open": ["ok", NOW, NOW + 60_000, 0],
    "lease_close": ["ok", NOW, NOW + 60_000, 1000, -1, 10, 0, 20, 0, 1, ""],
    "estimator_record": [120, 60],
    "estimator_vote": [120, 3],
    "unlock": [1],
    "breaker": [1, "closed", 0, 0, 0, 1],
    "config_version": [7],
    "allowance_grant": ["ok", NOW, 500, 0],
    "allowance_credit": ["ok", 500],
    "allowance_release": ["ok", 0],
}


class Recorder:
    """A script object that records (script, keys, argv) and answers from a queue."""

    def __init__(self, name: str, client: RecordingClient) -> None:
        self.name = name
        self.client = client

    async def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        self.client.calls.append([self.name, list(keys), list(args)])
        queued = self.client.replies.get(self.name)
        if queued:
            return list(queued.popleft())
        return list(DEFAULT_REPLIES[self.name])


class RecordingClient:
    """Just enough of a redis-py client for :class:`Ledger`: scripts that record."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []
        self.replies: dict[str, deque[list[Any]]] = {}
        names = LEDGER_SCRIPTS + STANDALONE_SCRIPTS + ALLOWANCE_SCRIPTS
        self._by_source = {source(n): n for n in names}

    def register_script(self, text: str) -> Recorder:
        return Recorder(self._by_source[text], self)

    def answer(self, name: str, *replies: list[Any]) -> None:
        self.replies.setdefault(name, deque()).extend(replies)


async def run_cases() -> dict[str, list[list[Any]]]:
    """Every case's calls, by case name."""
    out: dict[str, list[list[Any]]] = {}
    rates = (RateLimit(TENANT, requests_per_minute=60, tokens_per_minute=10_000),)
    plain = scope((TENANT, TOT, 100_000, "day"), (ORG, USD, 5_000_000_000, "month"), rates=rates)
    prices = Prices(input_nusd=150, output_nusd=600)
    meta = ReservationMeta(route="chat", model="gpt-x", key_id="k1", request_id="rq1",
                           provider="openai")  # fmt: skip

    async def case(name: str, client: RecordingClient, ledger: Ledger, body: Any) -> None:
        await body(ledger)
        out[name] = client.calls

    def fresh() -> tuple[RecordingClient, Ledger]:
        client = RecordingClient()
        return client, Ledger(client, call_timeout_s=2.0)

    async def plain_case(ledger: Ledger) -> None:
        a = await ledger.admit(plain, input_tokens=100, output_estimate=300, prices=prices,
                               reservation_id="r1", meta=meta)  # fmt: skip
        res = a.reservation  # type: ignore[union-attr]
        await ledger.extend(res, 50, least=10)
        await ledger.extend(res, 0)
        await ledger.settle(res, input_tokens=100, output_tokens=120)
        await ledger.usage(plain)
        await ledger.usage(plain, rates=True)

    c, lg = fresh()
    await case("plain", c, lg, plain_case)

    async def exact_case(ledger: Ledger) -> None:
        a = await ledger.admit(
            plain, input_tokens=7, output_estimate=900, min_output=64, prices=prices,
            reservation_id="r2", charge_on_expiry=True, config_version=12,
            record_refusal=False, headroom=32,
        )  # fmt: skip
        res = a.reservation  # type: ignore[union-attr]
        note = SettleNote(outcome="cut", estimate=True, reasoning_tokens=5,
                          cached_input_tokens=3, model="gpt-y", provider="azure")  # fmt: skip
        await ledger.settle(res, input_tokens=7, output_tokens=41, note=note, cost_nusd=12345)

    c, lg = fresh()
    await case("exact_count", c, lg, exact_case)

    async def queue_case(ledger: Ledger) -> None:
        await ledger.admit(plain, input_tokens=10, output_estimate=20, reservation_id="r3",
                           queue_ticket_ms=5000, queue_priority=2)  # fmt: skip
        await ledger.leave_queue(plain, "r3", meta=meta, outcome="client_gone")

    c, lg = fresh()
    c.answer("admit", ["queued", NOW, "t:acme:tot:d", 2, 0])
    await case("queue_ticket", c, lg, queue_case)

    user_scope = scope((USER, OUT, 5000, "1h"), (TENANT, TOT, 100_000, "day"),
                       levels=(KEY, USER, TENANT))  # fmt: skip

    async def user_case(ledger: Ledger) -> None:
        um = ReservationMeta(route="chat", user="acme~ann")
        a = await ledger.admit(user_scope, input_tokens=3, output_estimate=30,
                               reservation_id="r4", meta=um)  # fmt: skip
        await ledger.settle(a.reservation, input_tokens=3, output_tokens=9)  # type: ignore[union-attr]

    c, lg = fresh()
    await case("user_level", c, lg, user_case)

    async def lease_case(ledger: Ledger) -> None:
        leases = Leases(ledger)
        owner = LeaseOwner("acme", "acme~ann")
        await leases.open(plain, owner, ttl_s=60, tokens=1000, lease_id="L1")
        await leases.open(plain, LeaseOwner("acme"), ttl_s=30, tokens=100, usd_nusd=999,
                          parent="L1", lease_id="L2")  # fmt: skip
        lm = ReservationMeta(route="chat", lease="L1")
        a = await ledger.admit(plain, input_tokens=5, output_estimate=50,
                               reservation_id="r5", meta=lm)  # fmt: skip
        await ledger.settle(a.reservation, input_tokens=5, output_tokens=8)  # type: ignore[union-attr]
        await leases.read(plain, owner, "L1")
        await leases.close(plain, owner, "L1")

    c, lg = fresh()
    await case("lease", c, lg, lease_case)

    shared = SharedLimits(
        shared_budgets(
            "upstream", "openai", [(TOT, 1_000_000, Window("day"))], requests_per_minute=100
        )
        + shared_budgets("route", "chat", [(USD, 9_000_000_000, Window("month"))])
    )

    async def shared_case(ledger: Ledger) -> None:
        a = await ledger.admit(plain, input_tokens=10, output_estimate=40, reservation_id="r6",
                               shared=shared)  # fmt: skip
        res = a.reservation  # type: ignore[union-attr]
        await ledger.extend(res, 20)
        await ledger.settle(res, input_tokens=10, output_tokens=30)
        await ledger.release_allowances(plain, shared)

    c, lg = fresh()
    c.answer("admit", ["grant", NOW, 3, 50], ["ok", NOW, 40, 0])
    c.answer("extend", ["grant", NOW, 3, 20], ["ok", NOW, 20, 60, 0])
    c.answer("allowance_release", ["ok", 7, 0], ["ok", 0])
    await case("upstream_limit", c, lg, shared_case)

    async def windows_case(ledger: Ledger) -> None:
        await ledger.admit(plain, input_tokens=1, output_estimate=2, reservation_id="r7")

    c, lg = fresh()
    c.answer("admit", ["windows", NOW, "f3600", "m"], ["hydrate", NOW], ["ok", NOW, 2, 0])
    await case("more_windows_and_restore", c, lg, windows_case)

    async def standalone_case(ledger: Ledger) -> None:
        await ledger.record_output("chat", 120, keep=1000, quantile=0.95, recompute_every=16,
                                   tenant="acme")  # fmt: skip
        await ledger.record_output("chat", 80, keep=500, quantile=0.9, recompute_every=8)
        await ledger.vote_output("chat", "acme", 120)
        await ledger.publish_config_version(["t:acme", "o:bigco", "t:acme"], 7)
        breakers = Breakers(ledger.client, ledger.scripts, ledger.keys)
        s = BreakerSettings()
        before = await breakers.check("openai", s, "acme")
        await breakers.failed("openai", s, None)
        await breakers.released("openai", s, before, "acme")

    c, lg = fresh()
    await case("standalone", c, lg, standalone_case)
    return out


def captured() -> dict[str, list[list[Any]]]:
    """:func:`run_cases` with the clock stopped at :data:`NOW`."""
    import time
    from unittest import mock

    with mock.patch.object(time, "time", return_value=NOW / 1000):
        return asyncio.run(run_cases())


if __name__ == "__main__":
    json.dump(captured(), sys.stdout, indent=1)
