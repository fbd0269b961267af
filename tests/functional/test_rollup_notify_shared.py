"""Threshold notifications of budgets that span tenants (an upstream's, a route's), against a real
Valkey (standalone and cluster) and moto's DynamoDB: the use is summed over the hierarchies, each
of which holds its own part in its own slot; one event per threshold per window, whatever races;
a new window re-arms; ``notify_at: []`` and rate limits never notify."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from hardcap_core.budgets import Window
from hardcap_core.config import Config, parse_config
from hardcap_core.ledger import Admitted, Ledger, ReservationMeta
from hardcap_core.rollup.notify import Notice, Notifications
from hardcap_core.rollup.run import run_rollup
from hardcap_core.rollup.table import UsageTable
from tests.functional.test_rollup import PRICES
from tests.stack import config_data

UPSTREAM_TOKENS = 1_000  # the upstream `mock`'s tokens per window, over every tenant
ROUTE_USD = 0.002  # the route `small`'s dollars per month (a request here costs 100,000 nUSD)
ROOTS = ("o:acme", "t:open")  # alpha's hierarchy (under its org) and open's: two slots


class Recorder:
    """A notifier that keeps what it is sent."""

    def __init__(self) -> None:
        self.sent: list[Notice] = []

    async def send(self, notices: Sequence[Notice]) -> list[bool]:
        await asyncio.sleep(0)  # another run's check may go on meanwhile
        self.sent += notices
        return [True] * len(notices)


def make_config(
    redis_url: str, window: str = "day", notify_at: Sequence[int] = (80,), *,
    route: bool = False, rpm: int = 100,
) -> Config:  # fmt: skip
    """Tenants alpha (org acme) and open share the upstream's budget (at ``notify_at``) and
    its ``rpm`` requests a minute; with ``route``, route `small` has a budget of its own."""
    upstream = {"dimension": "total_tokens", "limit": UPSTREAM_TOKENS, "window": window,
                "notify_at": list(notify_at)}  # fmt: skip
    usd = {"dimension": "cost_usd", "limit": ROUTE_USD, "window": "month", "notify_at": [50]}
    return parse_config(config_data("http://127.0.0.1:9", redis_url, **{
        "upstreams.0.budgets": [upstream],
        "upstreams.0.rate_limits": {"requests_per_minute": rpm},
        "routes.0.budgets": [usd] if route else [],
    }))  # fmt: skip


@pytest.fixture
def config(backend: tuple[str, bool]) -> Config:
    return make_config(backend[0])


async def spend(ledger: Ledger, config: Config, key_id: str, n: int, out: int = 45) -> None:
    """``n`` requests of 10 input and ``out`` output tokens on route `small`, by ``key_id``."""
    principal = config.principal_by_id(key_id)
    assert principal is not None
    route = config.routes["small"]
    for i in range(n):
        meta = ReservationMeta("small", "mock-small", key_id, f"rq-{key_id}-{i}-{time.time()}",
                               provider="mock")  # fmt: skip
        admitted = await ledger.admit(principal.scope, input_tokens=10, output_estimate=out,
                                      prices=PRICES, meta=meta, shared=route.shared)  # fmt: skip
        assert isinstance(admitted, Admitted), admitted
        await ledger.settle(admitted.reservation, input_tokens=10, output_tokens=out)


def sent(recorder: Recorder) -> list[tuple[str, str, int, int | float]]:
    out = []
    for n in recorder.sent:
        d = n.detail()
        out.append((d["level"], d["id"], d["threshold"], d["used"]))
    return sorted(out)


async def test_two_hierarchies_cross_the_upstream_threshold_together_once(
    backend: tuple[str, bool], client: Any, config: Config, usage_table: UsageTable
) -> None:
    """alpha's 440 tokens (44 %) alone reach nothing; open's 385 (38.5 %) take the sum to 82.5 %
    of the upstream's 1,000: one event at 80 % with the summed figure, sent by the pass that
    rolled up only open's records (alpha's part is as the first pass read it)."""
    ledger = Ledger(client)
    if backend[1]:  # the two hierarchies live on two nodes of the cluster
        nodes = {client.get_node_from_key(f"hc:{{{r}}}:usage").name for r in ROOTS}
        assert len(nodes) == 2
    await spend(ledger, config, "alpha-k", 8)  # 8 x 55 tokens
    recorder = Recorder()
    notifications = Notifications(recorder, "timer")  # one runner, kept across passes
    await run_rollup(config, client, usage_table, notifications=notifications)
    assert recorder.sent == []  # 44 % of the upstream
    await spend(ledger, config, "open-k", 7)
    await run_rollup(config, client, usage_table, first_pass=False, notifications=notifications)
    assert sent(recorder) == [("upstream", "mock", 80, 825)]
    detail = recorder.sent[0].detail()
    day = time.strftime("%Y%m%d", time.gmtime())
    assert detail["event_id"] == f"upstream:mock#up:mock:tot:d#{day}#80"
    assert (detail["tenant"], detail["dimension"], detail["window"], detail["window_id"]) == (
        None, "total_tokens", "d", day
    )  # fmt: skip
    assert (detail["limit"], detail["percent"]) == (UPSTREAM_TOKENS, 82.5)
    assert usage_table.notices("upstream:mock") == {f"up:mock:tot:d#{day}#80": "sent"}
    # Four runs racing, each reading every hierarchy afresh, and later passes: nothing more.
    others = [Recorder() for _ in range(4)]
    await asyncio.gather(
        *(run_rollup(config, client, usage_table, notifications=Notifications(r, f"run-{i}"))
          for i, r in enumerate(others))
    )  # fmt: skip
    await run_rollup(config, client, usage_table, notifications=notifications)
    assert [n for r in others for n in r.sent] == [] and len(recorder.sent) == 1


async def test_a_route_budget_notifies_under_its_own_name_in_dollars(
    backend: tuple[str, bool], client: Any, usage_table: UsageTable
) -> None:
    """Route `small`'s $0.002 a month at 50 %: 6 + 4 requests of $0.0001 from two
    hierarchies, $0.001 (the upstream's 550 tokens are 55 %, under its 80 %); four runs racing
    send it once, under ``notified#route:small``."""
    config = make_config(backend[0], route=True)
    ledger = Ledger(client)
    await spend(ledger, config, "alpha-k", 6)
    await spend(ledger, config, "open-k", 4)
    recorders = [Recorder() for _ in range(4)]
    await asyncio.gather(
        *(run_rollup(config, client, usage_table, notifications=Notifications(r, f"run-{i}"))
          for i, r in enumerate(recorders))
    )  # fmt: skip
    everything = Recorder()
    everything.sent = [n for r in recorders for n in r.sent]
    assert sent(everything) == [("route", "small", 50, 0.001)]
    detail = everything.sent[0].detail()
    assert (detail["dimension"], detail["limit"], detail["window"]) == ("cost_usd", ROUTE_USD, "m")
    month = time.strftime("%Y%m", time.gmtime())
    assert usage_table.notices("route:small") == {f"rt:small:usd:m#{month}#50": "sent"}


async def test_a_new_window_rearms_the_upstream_thresholds(
    backend: tuple[str, bool], client: Any, usage_table: UsageTable
) -> None:
    """A fixed 4 s window: both hierarchies take the upstream past 80 % in one window and again
    in the next: two events, each naming its window; within one window, one."""
    config = make_config(backend[0], window="4s")
    ledger = Ledger(client)
    recorder = Recorder()
    notifications = Notifications(recorder, "timer")
    window = Window.parse("4s")
    windows = []
    for _ in range(2):
        now_ms = ledger.server_now_ms()
        await asyncio.sleep((4_000 - now_ms % 4_000) / 1000 + 0.05)  # the start of a window
        windows.append(window.bounds(ledger.server_now_ms()).id)
        await spend(ledger, config, "alpha-k", 8)
        await spend(ledger, config, "open-k", 7)
        for _ in range(2):
            await run_rollup(config, client, usage_table, notifications=notifications)
    upstream = [n for n in recorder.sent if n.detail()["level"] == "upstream"]
    assert [(n.threshold, n.window.id, n.used) for n in upstream] == [(80, w, 825) for w in windows]
    assert windows[0] != windows[1]


async def test_no_thresholds_and_rate_limits_send_nothing(
    backend: tuple[str, bool], client: Any, usage_table: UsageTable
) -> None:
    """``notify_at: []``: the upstream's budget spent to 99 % and its 9 requests a minute
    all used: no event (the default thresholds would have sent 50 and 80 %)."""
    config = make_config(backend[0], notify_at=[], rpm=9)
    ledger = Ledger(client)
    await spend(ledger, config, "alpha-k", 5, out=100)
    await spend(ledger, config, "open-k", 4, out=100)  # 990 tokens, 9 requests
    recorder = Recorder()
    await run_rollup(config, client, usage_table, notifications=Notifications(recorder, "one"))
    assert recorder.sent == []
    assert usage_table.notices("upstream:mock") == {}
