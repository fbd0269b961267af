"""Threshold notifications, against a real Valkey (standalone and cluster) and moto's DynamoDB:
one event per threshold per budget per window, whatever races; a new window re-arms; each level
has its own thresholds; a send that failed, or a claim a dead run left, is sent by a later pass.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from hardcap_core.budgets import Level, LevelKind, Scope, Window
from hardcap_core.config import Config, parse_config
from hardcap_core.ledger import Admitted, Ledger, ReservationMeta
from hardcap_core.rollup.notify import STALE_S, Notice, Notifications, crossings, watched
from hardcap_core.rollup.run import run_rollup
from hardcap_core.rollup.table import UsageTable
from tests.functional.test_rollup import PRICES
from tests.stack import config_data

TENANT_TOKENS = 1_000  # alpha's day: thresholds 50, 80, 100 (the default)
KEY_TOKENS = 2_000  # alpha-k's day: notifies at 25 % only
USER_TOKENS = 800  # each user's day: at 10 % and 90 %
TENANT_USD = 0.002  # alpha's month: at 50 % only (a request here costs 100,000 nUSD)
BOB = "alpha~bob"


class Recorder:
    """A notifier that keeps what it is sent; ``fail`` first sends that are not delivered."""

    def __init__(self, fail: int = 0) -> None:
        self.sent: list[Notice] = []
        self.fail = fail

    async def send(self, notices: Sequence[Notice]) -> list[bool]:
        await asyncio.sleep(0)  # another run's check may go on meanwhile
        if self.fail:
            self.fail -= 1
            return [False] * len(notices)
        self.sent += notices
        return [True] * len(notices)


def make_config(redis_url: str, tenant_window: str = "day") -> Config:
    tokens = {"dimension": "total_tokens", "window": tenant_window}
    return parse_config(config_data("http://127.0.0.1:9", redis_url, **{
        "orgs.0.budgets": [{**tokens, "limit": TENANT_TOKENS, "notify_at": []}],
        "tenants.0.budgets": [
            {**tokens, "limit": TENANT_TOKENS},
            {"dimension": "cost_usd", "limit": TENANT_USD, "window": "month", "notify_at": [50]},
        ],
        "tenants.0.keys.0.budgets": [{**tokens, "limit": KEY_TOKENS, "notify_at": [25]}],
        "tenants.0.users": {"budgets": [{**tokens, "limit": USER_TOKENS, "notify_at": [90, 10]}]},
    }))  # fmt: skip


@pytest.fixture
def config(backend: tuple[str, bool]) -> Config:
    return make_config(backend[0])


def scope_of(config: Config, user: str = "") -> Scope:
    principal = config.principal_by_id("alpha-k")
    assert principal is not None and principal.users is not None
    if not user:
        return principal.scope
    return principal.users.scope(principal.scope, Level(LevelKind.USER, user))


async def settle_one(ledger: Ledger, scope: Scope, i: int, user: str = "", out: int = 45) -> None:
    """One request of 10 input and ``out`` output tokens, admitted and settled."""
    meta = ReservationMeta("small", "mock-small", "alpha-k", f"rq-{i}", provider="mock", user=user)
    admitted = await ledger.admit(scope, input_tokens=10, output_estimate=out, prices=PRICES,
                                  meta=meta)  # fmt: skip
    assert isinstance(admitted, Admitted), admitted
    await ledger.settle(admitted.reservation, input_tokens=10, output_tokens=out)


def thresholds(sent: Sequence[Notice]) -> list[tuple[str, str, int]]:
    return sorted((n.budget.level.tag, n.budget.dimension.value, n.threshold) for n in sent)


async def test_settles_crossing_at_once_and_racing_runs_send_each_threshold_once(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    ledger = Ledger(client)
    scope = scope_of(config)
    # 15 requests of 55 tokens, all at once: 825 of alpha's 1,000 (past 50 and 80 %).
    await asyncio.gather(*(settle_one(ledger, scope, i) for i in range(15)))
    recorders = [Recorder() for _ in range(4)]
    runs = [Notifications(r, f"run-{n}") for n, r in enumerate(recorders)]
    # Four rollups at once (one holds the stream; all check the thresholds), and four checks
    # of the same hierarchy on top.
    root = config.roots()[0]
    await asyncio.gather(
        *(run_rollup(config, client, usage_table, notifications=n) for n in runs),
        *(n.check(ledger, usage_table, config, root) for n in runs),
    )
    sent = [n for r in recorders for n in r.sent]
    assert thresholds(sent) == [
        ("k:alpha-k", "total_tokens", 25),  # 825 of 2,000
        ("t:alpha", "cost_usd", 50),  # 15 x (10 x 1,000 + 45 x 2,000) nUSD: 1.5 of 2 m$
        ("t:alpha", "total_tokens", 50),
        ("t:alpha", "total_tokens", 80),
    ]
    # Later passes find them again and send nothing; the table says each was sent.
    again = Recorder()
    await run_rollup(config, client, usage_table, notifications=Notifications(again, "later"))
    assert again.sent == []
    assert sorted(usage_table.notices(root.tag).values()) == ["sent"] * 4
    # The last requests take alpha to 100 %: that one threshold alone is sent.
    await asyncio.gather(*(settle_one(ledger, scope, 100 + i, out=25) for i in range(5)))
    await run_rollup(config, client, usage_table, notifications=Notifications(again, "later"))
    assert thresholds(again.sent) == [("t:alpha", "total_tokens", 100)]


async def test_the_event_detail_names_the_budget_and_its_window(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    ledger = Ledger(client)
    for i in range(10):
        await settle_one(ledger, scope_of(config), i)
    recorder = Recorder()
    await run_rollup(config, client, usage_table, notifications=Notifications(recorder, "one"))
    by_budget = {(n.budget.level.tag, n.budget.dimension.value, n.threshold): n.detail()
                 for n in recorder.sent}  # fmt: skip
    tokens = by_budget[("t:alpha", "total_tokens", 50)]
    day = time.strftime("%Y%m%d", time.gmtime())
    assert tokens["tenant"] == "alpha" and (tokens["level"], tokens["id"]) == ("tenant", "alpha")
    assert (tokens["window"], tokens["window_id"]) == ("d", day)
    assert tokens["window_start"] == time.strftime("%Y-%m-%dT00:00:00.000+00:00", time.gmtime())
    assert (tokens["used"], tokens["limit"], tokens["percent"]) == (550, TENANT_TOKENS, 55.0)
    assert tokens["event_id"] == f"o:acme#t:alpha:tot:d#{day}#50"
    usd = by_budget[("t:alpha", "cost_usd", 50)]  # in USD, not nano-USD
    assert (usd["used"], usd["limit"], usd["window"], usd["percent"]) == (0.001, 0.002, "m", 50.0)
    key = by_budget[("k:alpha-k", "total_tokens", 25)]
    assert (key["tenant"], key["level"], key["id"], key["percent"]) == (
        "alpha", "key", "alpha-k", 27.5
    )  # fmt: skip


async def test_each_level_notifies_at_its_own_thresholds(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    """The org notifies never ([]), the key at 25 %, the tenant at 50/80/100, each user at its
    template's 10 and 90 %: bob's 550 tokens reach 10 % of his 800, carol's 110 10 % of hers."""
    ledger = Ledger(client)
    for i in range(10):
        await settle_one(ledger, scope_of(config, BOB), i, BOB)
    for i in range(2):
        await settle_one(ledger, scope_of(config, "alpha~carol"), 50 + i, "alpha~carol")
    recorder = Recorder()
    await run_rollup(config, client, usage_table, notifications=Notifications(recorder, "one"))
    assert thresholds(recorder.sent) == [
        ("k:alpha-k", "total_tokens", 25),  # 660 of 2,000
        ("t:alpha", "cost_usd", 50),
        ("t:alpha", "total_tokens", 50),  # 660 of 1,000; the org's 66 % sends nothing
        ("u:alpha~bob", "total_tokens", 10),  # 550 of 800
        ("u:alpha~carol", "total_tokens", 10),  # 110 of 800
    ]
    bob = next(n for n in recorder.sent if n.budget.level.kind is LevelKind.USER
               and n.budget.level.id == BOB).detail()  # fmt: skip
    assert (bob["tenant"], bob["level"], bob["id"], bob["used"]) == ("alpha", "user", BOB, 550)
    # A user's 90 % comes from a later pass, which watches only the users it rolled up.
    for i in range(4):  # 200 more: 750 of 800
        await settle_one(ledger, scope_of(config, BOB), 200 + i, BOB, out=40)
    later = Recorder()
    await run_rollup(config, client, usage_table, first_pass=False,
                     notifications=Notifications(later, "two"))  # fmt: skip
    assert ("u:alpha~bob", "total_tokens", 90) in thresholds(later.sent)


async def test_a_new_window_rearms_every_threshold(
    backend: tuple[str, bool], client: Any, usage_table: UsageTable
) -> None:
    """A fixed 4 s window: 50 % in one window and in the next are two events, each naming its
    window; within one window, one."""
    config = make_config(backend[0], tenant_window="4s")
    ledger = Ledger(client)
    scope = scope_of(config)
    recorder = Recorder()
    notifications = Notifications(recorder, "timer")  # one runner, kept across passes
    windows = []
    window = Window.parse("4s")
    for round_ in range(2):
        now_ms = ledger.server_now_ms()
        await asyncio.sleep((4_000 - now_ms % 4_000) / 1000 + 0.05)  # the start of a window
        windows.append(window.bounds(ledger.server_now_ms()).id)
        for i in range(10):  # 550 tokens: 55 % of this window's 1,000
            await settle_one(ledger, scope, round_ * 100 + i)
        for _ in range(2):
            await run_rollup(config, client, usage_table, notifications=notifications)
    tenant_50 = [n for n in recorder.sent
                 if n.budget.level.tag == "t:alpha" and n.budget.window.spec == "f4"]  # fmt: skip
    assert [(n.threshold, n.window.id) for n in tenant_50] == [(50, w) for w in windows]
    assert windows[0] != windows[1]


async def test_a_failed_send_is_sent_by_the_next_pass_once(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    ledger = Ledger(client)
    for i in range(10):
        await settle_one(ledger, scope_of(config), i)
    recorder = Recorder(fail=1)
    notifications = Notifications(recorder, "one")
    await run_rollup(config, client, usage_table, notifications=notifications)
    assert recorder.sent == []  # not delivered: the claims were given back
    assert usage_table.notices(config.roots()[0].tag) == {}
    await run_rollup(config, client, usage_table, notifications=notifications)
    await run_rollup(config, client, usage_table, notifications=notifications)
    assert len(thresholds(recorder.sent)) == 3  # key 25, tenant tokens 50, tenant cost 50


async def test_a_claim_a_dead_run_left_is_taken_over_once_stale(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    ledger = Ledger(client)
    for i in range(10):
        await settle_one(ledger, scope_of(config), i)
    root = config.roots()[0]
    scope, tenants = watched(config, root)
    usage = await ledger.usage(scope)
    key_25 = next(n for n in crossings(usage, root, tenants) if n.threshold == 25)
    now_s = int(time.time())
    # A run claimed it and died before sending.
    assert usage_table.claim_notice(root.tag, key_25.sk, "dead", now_s, STALE_S, now_s + 86_400)
    fresh = Recorder()
    await run_rollup(config, client, usage_table, notifications=Notifications(fresh, "fresh"))
    assert ("k:alpha-k", "total_tokens", 25) not in thresholds(fresh.sent)  # not stale yet
    # Once it is older than STALE_S, the next pass takes it over and sends it.
    old = now_s - STALE_S - 1
    usage_table.client.update_item(
        TableName=usage_table.name,
        Key={"pk": {"S": f"notified#{root.tag}"}, "sk": {"S": key_25.sk}},
        UpdateExpression="SET claimed_at = :t", ExpressionAttributeValues={":t": {"N": str(old)}},
    )  # fmt: skip
    later = Recorder()
    await run_rollup(config, client, usage_table, notifications=Notifications(later, "later"))
    assert thresholds(later.sent) == [("k:alpha-k", "total_tokens", 25)]
    assert usage_table.notices(root.tag)[key_25.sk] == "sent"
    # The dead run's owner cannot mark it any more.
    assert not usage_table.notice_sent(root.tag, key_25.sk, "dead")
