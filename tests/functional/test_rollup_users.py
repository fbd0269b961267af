"""The user level downstream of the usage record, against a real Valkey (standalone and cluster)
and moto's DynamoDB: the record names the user only when there is one (format 3; format 2
otherwise, byte for byte what the release before wrote), the durable ledger keeps a user column,
a user's budget comes back after the cache is lost, and a kept settle still charges its user.

What the previous release does with a format-3 record is tested here too, with its own parser
(``git show`` of the last commit that changed ``hardcap_core/rollup/records.py`` before users):
it raises ValueError, which ``rollup/run.py`` does not catch, so its pass ends there — nothing of
that batch applied or acknowledged, every hierarchy after it in the config left for the next
run, the invocation failed — until a rollup that reads format 3 is deployed, which then applies
every record (nothing is lost: the entries stay pending in the stream). Hence the rollup must be
deployed with or before the gateway that writes users (the SAM stack updates both at once), and
a tenant's ``users:`` turned on only after.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from hardcap_core.budgets import Dimension, Level, LevelKind, Scope
from hardcap_core.config import Config, parse_config
from hardcap_core.ledger import Admitted, Ledger, Refused, ReservationMeta, SettleNote
from hardcap_core.rollup import run as run_module
from hardcap_core.rollup.durable import DurableSettles, replay_pending
from hardcap_core.rollup.records import parse_entry
from hardcap_core.rollup.restore import durable_ledger
from hardcap_core.rollup.run import run_rollup
from hardcap_core.rollup.table import UsageTable
from tests.conftest import flush
from tests.functional.test_rollup import PRICES
from tests.stack import config_data

# The last commit that changed the record parser before format 3: the previous release's.
PREVIOUS_RELEASE = "1c41cd5007fd66b01a5d3d03670cc828a622ee0b"
REPO = Path(__file__).resolve().parents[2]
USER_TOKENS = 5_000  # a day, per user of alpha
USER_USD = 0.5  # a month, per user of alpha: a window no configured budget has


@pytest.fixture
def config(backend: tuple[str, bool]) -> Config:
    users = {
        "budgets": [
            {"dimension": "total_tokens", "limit": USER_TOKENS, "window": "day"},
            {"dimension": "cost_usd", "limit": USER_USD, "window": "month"},
        ]
    }
    return parse_config(config_data("http://127.0.0.1:9", backend[0], **{"tenants.0.users": users}))


def user_scope(config: Config, key: str, user: str) -> Scope:
    """``key``'s scope with the user level ``user`` (``tenant~name``) joined, as admit sees it."""
    principal = config.principal_by_id(key)
    assert principal is not None and principal.users is not None
    return principal.users.scope(principal.scope, Level(LevelKind.USER, user))


async def spend(
    ledger: Ledger, config: Config, key: str, user: str, n: int, *, out: int = 20
) -> int:
    """``n`` requests of ``user`` (none: "") admitted and settled; the tokens they used."""
    principal = config.principal_by_id(key)
    assert principal is not None
    scope = user_scope(config, key, user) if user else principal.scope
    tokens = 0
    for i in range(n):
        meta = ReservationMeta("small", "mock-small", key, f"rq-{i}", provider="mock", user=user)
        admitted = await ledger.admit(scope, input_tokens=10, output_estimate=out + 5,
                                      prices=PRICES, meta=meta)  # fmt: skip
        assert isinstance(admitted, Admitted)
        await ledger.settle(admitted.reservation, input_tokens=10, output_tokens=out + i)
        tokens += 10 + out + i
    return tokens


async def raw_records(client: Any, ledger: Ledger, config: Config) -> list[str]:
    root = config.tenant_scope("alpha").root
    return [f[b"r"].decode() for _, f in await client.xrange(ledger.keys.usage_stream(root))]


def used(usage: Any, level: Level, dimension: Dimension) -> int:
    return int(
        next(
            r.used for r in usage.rows if (r.budget.level, r.budget.dimension) == (level, dimension)
        )
    )


def previous_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``hardcap_core/rollup/records.py`` as the previous release shipped it, as a module."""
    source = subprocess.run(
        ["git", "show", f"{PREVIOUS_RELEASE}:hardcap_core/rollup/records.py"],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    path = tmp_path / "previous_records.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("previous_records", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "previous_records", module)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


async def test_a_record_names_the_user_only_when_the_request_has_one(
    client: Any, config: Config
) -> None:
    ledger = Ledger(client)
    await spend(ledger, config, "alpha-k", "alpha~bob", 1)
    await spend(ledger, config, "alpha-k", "", 1)
    huge = await ledger.admit(user_scope(config, "alpha-k", "alpha~bob"), input_tokens=1,
                              output_estimate=USER_TOKENS * 2,
                              meta=ReservationMeta("small", user="alpha~bob"))  # fmt: skip
    assert isinstance(huge, Refused) and huge.level == Level(LevelKind.USER, "alpha~bob")
    with_user, without, refusal = await raw_records(client, ledger, config)
    # Format 3: format 2 with the user as an 11th string; format 2 exactly as before.
    assert with_user.startswith("3,") and json.loads(with_user.split(",", 9)[9])[10] == "alpha~bob"
    assert without.startswith("2,") and len(json.loads(without.split(",", 9)[9])) == 10
    assert refusal.startswith("3,") and refusal.endswith(',"never","alpha~bob"]')
    parsed = [parse_entry("1-0", {"r": r}) for r in (with_user, without, refusal)]
    assert [r.user for r in parsed] == ["alpha~bob", "", "alpha~bob"]
    assert [r.tenant for r in parsed] == ["alpha"] * 3


async def test_the_previous_release_stops_on_format_3_and_loses_nothing(
    client: Any,
    config: Config,
    usage_table: UsageTable,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger = Ledger(client)
    plain = await spend(ledger, config, "alpha-k", "", 2)
    bob = await spend(ledger, config, "alpha-k", "alpha~bob", 3)
    other = await spend(ledger, config, "open-k", "", 1)  # another hierarchy, after acme's
    old = previous_parser(tmp_path, monkeypatch)
    without, with_user = (await raw_records(client, ledger, config))[1:3]
    # Format 2 reads in the previous release field for field as in this one.
    now = dataclasses.asdict(parse_entry("1-0", {"r": without}))
    assert now.pop("user") == "" and now.pop("lease") == ""  # fields the old release lacks
    assert dataclasses.asdict(old.parse_entry("1-0", {"r": without})) == now
    with pytest.raises(ValueError, match="has format '3'"):
        old.parse_entry("1-0", {"r": with_user})
    # The previous release's rollup: run.py lets the ValueError end the pass (the invocation
    # fails); nothing of the batch is written, and no later hierarchy is rolled up either.
    with monkeypatch.context() as m:
        m.setattr(run_module, "parse_entry", old.parse_entry)
        with pytest.raises(ValueError, match="has format '3'"):
            await run_rollup(config, client, usage_table)
    assert usage_table.usage(None, 0, 2**42) == []
    # This release's rollup then applies every record: nothing was lost meanwhile.
    report = await run_rollup(config, client, usage_table)
    assert report.applied == 6 and report.stalled == []
    rows = usage_table.usage(None, 0, 2**42)
    by_user = {(r.tenant, r.user): r.input_tokens + r.output_tokens for r in rows}
    assert by_user == {("alpha", ""): plain, ("alpha", "alpha~bob"): bob, ("open", ""): other}


async def test_usage_items_gain_the_user_and_items_without_one_keep_their_shape(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    ledger = Ledger(client)
    await spend(ledger, config, "alpha-k", "alpha~bob", 2)
    await spend(ledger, config, "alpha-k", "", 1)
    await run_rollup(config, client, usage_table)
    items = usage_table.client.scan(TableName=usage_table.name)["Items"]
    days = [i for i in items if i["pk"]["S"] == "usage#alpha" and i["sk"]["S"].startswith("d#")]
    by_parts = {len(i["sk"]["S"].split("#")): i for i in days}
    assert sorted(by_parts) == [6, 7]  # g, bucket, key, route, model, provider (, user)
    assert by_parts[7]["sk"]["S"].endswith("#mock#alpha~bob")
    assert by_parts[7]["user"]["S"] == "alpha~bob"
    assert "user" not in by_parts[6]  # as the release before wrote it, and still read
    rows = {r.user: r for r in usage_table.usage(["alpha"], 0, 2**42)}
    assert sorted(rows) == ["", "alpha~bob"]
    assert (rows["alpha~bob"].requests, rows[""].requests) == (2, 1)


async def test_a_users_budget_comes_back_after_the_cache_is_flushed(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    ledger = durable_ledger(client, config, usage_table)
    bob = await spend(ledger, config, "alpha-k", "alpha~bob", 4, out=1_000)
    await spend(ledger, config, "alpha-k", "alpha~carol", 1)
    await run_rollup(config, client, usage_table)
    await flush(client)  # the operator's FLUSHALL: every counter gone, users were never configured
    fresh = durable_ledger(client, config, usage_table)
    scope = user_scope(config, "alpha-k", "alpha~bob")
    level = Level(LevelKind.USER, "alpha~bob")
    usage = await fresh.usage(scope)
    assert used(usage, level, Dimension.TOTAL_TOKENS) == bob
    assert used(usage, level, Dimension.COST_USD) == PRICES.cost(40, bob - 40)
    # So bob's budget still holds (what is left of 5,000 tokens, not 5,000) ...
    left = USER_TOKENS - bob
    refused = await fresh.admit(scope, input_tokens=10, output_estimate=left, prices=PRICES)
    assert isinstance(refused, Refused) and refused.level == level
    fits = await fresh.admit(scope, input_tokens=10, output_estimate=left - 10, prices=PRICES)
    assert isinstance(fits, Admitted)
    # ... and carol's is hers alone.
    carol = await fresh.usage(user_scope(config, "alpha-k", "alpha~carol"))
    assert used(carol, Level(LevelKind.USER, "alpha~carol"), Dimension.TOTAL_TOKENS) == 30


async def test_a_user_only_in_the_stream_is_restored_from_its_records(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    """The counters alone are lost (the stream survived): a user the durable ledger has never
    seen is found in the records after the cursor, with both of its windows."""
    ledger = durable_ledger(client, config, usage_table)
    rolled = await spend(ledger, config, "alpha-k", "alpha~bob", 2)
    await run_rollup(config, client, usage_table)
    later = await spend(ledger, config, "alpha-k", "alpha~bob", 1)
    dave = await spend(ledger, config, "alpha-k", "alpha~dave", 2)  # never rolled up
    scope = user_scope(config, "alpha-k", "alpha~dave")
    now_ms = ledger.server_now_ms()
    for window in scope.windows():
        bounds = window.bounds(now_ms)
        await client.delete(ledger.keys.used(scope, bounds.spec, bounds.id))
    await client.delete(ledger.keys.ledger(scope)[8])  # the restored marker
    fresh = durable_ledger(client, config, usage_table)
    usage = await fresh.usage(scope)
    dave_level = Level(LevelKind.USER, "alpha~dave")
    assert used(usage, dave_level, Dimension.TOTAL_TOKENS) == dave
    assert used(usage, dave_level, Dimension.COST_USD) == PRICES.cost(20, dave - 20)
    assert used(usage, Level(LevelKind.TENANT, "alpha"), Dimension.TOTAL_TOKENS) == (
        rolled + later + dave
    )
    bob = await fresh.usage(user_scope(config, "alpha-k", "alpha~bob"))
    assert used(bob, Level(LevelKind.USER, "alpha~bob"), Dimension.TOTAL_TOKENS) == rolled + later


async def test_a_kept_settle_charges_its_user_when_replayed(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    ledger = Ledger(client)
    scope = user_scope(config, "alpha-k", "alpha~bob")
    meta = ReservationMeta("small", "mock-small", "alpha-k", "rq-1", user="alpha~bob")
    admitted = await ledger.admit(scope, input_tokens=10, output_estimate=100, prices=PRICES,
                                  meta=meta)  # fmt: skip
    assert isinstance(admitted, Admitted)
    # The cache did not take the settle: it is kept in DynamoDB.
    assert await DurableSettles(usage_table).keep(admitted.reservation, 10, 70, SettleNote())
    root = scope.root
    ((_, payload),) = usage_table.pending(root.tag)
    # The user beside the meta, not in it: the previous release builds its ReservationMeta
    # from "meta" and would fail on a field it does not know.
    assert payload["user"] == "alpha~bob" and "user" not in payload["meta"]
    assert await replay_pending(ledger, usage_table, config, root) == 1
    usage = await ledger.usage(scope)
    assert used(usage, Level(LevelKind.USER, "alpha~bob"), Dimension.TOTAL_TOKENS) == 80
    settle = (await raw_records(client, ledger, config))[-1]
    assert parse_entry("1-0", {"r": settle}).user == "alpha~bob"
