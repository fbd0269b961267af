"""The admin API as an operator uses it, mounted on a gateway app as ``hardcap serve
--admin-token`` mounts it: the config table in moto's DynamoDB, changes published through the
gateway's ledger on a real Valkey, and the config every gateway would load checked after each
change (the file joined with the table's state, through ``parse_config``)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import boto3
import httpx
import pytest
import redis.asyncio as aioredis
from moto import mock_aws

from hardcap_core.auth import hash_key
from hardcap_core.budgets import Dimension, LevelKind
from hardcap_core.config import Config, parse_config
from hardcap_core.control.admin import Admin
from hardcap_core.control.admin_api import mount_admin
from hardcap_core.control.publish import LedgerPublisher
from hardcap_core.control.state import join
from hardcap_core.control.store import Change, ConfigStore
from hardcap_core.errors import LedgerUnavailable
from hardcap_core.gateway.app import create_app
from hardcap_core.ledger import Admitted, Ledger, ReservationMeta
from hardcap_core.local.valkey import LocalValkey
from hardcap_core.rollup.run import run_rollup
from hardcap_core.rollup.table import UsageTable, create_table
from tests.stack import KEYS, config_data

T0 = datetime(2026, 3, 14, 12, 0, tzinfo=UTC).timestamp()
TOKEN = "admin-token-0123456789abcdef"
AUTH = {"authorization": f"Bearer {TOKEN}", "x-hardcap-operator": "alice"}


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class RecordingPublisher:
    """Publishes through the ledger like the real one, and remembers what it published."""

    def __init__(self, inner: LedgerPublisher) -> None:
        self.inner = inner
        self.calls: list[tuple[list[str], int]] = []

    async def publish(self, roots: Sequence[str], version: int) -> None:
        self.calls.append((list(roots), version))
        await self.inner.publish(roots, version)


@dataclass
class Env:
    http: httpx.AsyncClient
    admin: Admin
    store: ConfigStore
    usage: UsageTable
    clock: Clock
    cache: aioredis.Redis
    file_data: dict[str, Any]
    published: RecordingPublisher

    def config(self) -> Config:
        """The config every gateway instance would serve now."""
        state = self.store.load()
        return parse_config(join(self.file_data, state, self.clock()).data, environ={})

    async def cache_version(self, root: str) -> int:
        value = await self.cache.get(f"hc:{{{root}}}:cfgv")
        return int(value or 0)


@pytest.fixture
def dynamodb() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        create_table(client, "usage")
        yield client


@pytest.fixture
async def env(
    dynamodb: Any, valkey: LocalValkey, standalone_client: aioredis.Redis
) -> AsyncIterator[Env]:
    clock = Clock()
    file_data = config_data("http://127.0.0.1:9", valkey.url)
    store = ConfigStore("config", dynamodb, clock=clock)
    store.create_table()
    usage = UsageTable(dynamodb, "usage")
    app = create_app(parse_config(file_data), ledger_client=standalone_client)

    async def ledger() -> Ledger:
        gateway = await app.state.runtime.gateway()
        built: Ledger = gateway.ledger
        return built

    published = RecordingPublisher(LedgerPublisher(ledger))
    admin = Admin(store, file_data, published, usage, clock)
    assert mount_admin(app, admin, TOKEN)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin.test") as http:
        yield Env(http, admin, store, usage, clock, standalone_client, file_data, published)


async def call(
    env: Env, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None,
    expect: int = 200, **params: Any,
) -> dict[str, Any]:  # fmt: skip
    reply = await env.http.request(
        method, f"/admin/v1{path}", json=body, params=params or None,
        headers=AUTH if headers is None else headers,
    )  # fmt: skip
    assert reply.status_code == expect, reply.text
    data: dict[str, Any] = reply.json()
    return data


GAMMA = {
    "id": "gamma",
    "org": "acme",
    "routes": ["small"],
    "budgets": [{"dimension": "total_tokens", "limit": 50_000, "window": "day"}],
}


class Kept(logging.Handler):
    """Every log record, formatted with its extra fields, from every logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.getMessage()} {record.__dict__}")


@pytest.fixture
def logs() -> Iterator[Kept]:
    """Debug logs of everything (botocore's requests too) and the gateway's own logger."""
    kept = Kept()
    loggers = [logging.getLogger(), logging.getLogger("hardcap")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(kept)
        lg.setLevel(logging.DEBUG)
    yield kept
    for lg, level in zip(loggers, levels, strict=True):
        lg.removeHandler(kept)
        lg.setLevel(level)


async def test_create_tenant_and_key_then_list(
    env: Env, capsys: pytest.CaptureFixture[str], logs: Kept
) -> None:
    created = await call(env, "POST", "/tenants", GAMMA, expect=201)
    assert created["tenant"]["id"] == "gamma"
    # The first change imported the file's orgs and tenants: none of them was dropped.
    config = env.config()
    assert set(config.tenant_scopes) == {"alpha", "beta", "open", "gamma"}
    assert config.principal_by_id("alpha-k") is not None

    key = await call(env, "POST", "/keys", {"tenant": "gamma", "id": "gamma-ci"}, expect=201)
    plaintext = key["key"]
    assert plaintext.startswith("hc_") and key["id"] == "gamma-ci" and key["status"] == "active"
    principal = env.config().keys.lookup(plaintext)
    assert principal is not None and principal.tenant_id == "gamma"
    assert principal.allowed_routes == frozenset({"small"})

    listed = await call(env, "GET", "/keys", tenant="gamma")
    assert [(k["id"], k["status"], k["last_used_at"]) for k in listed["keys"]] == [
        ("gamma-ci", "active", None)
    ]
    audit = await call(env, "GET", "/audit")
    shown = await call(env, "GET", "/tenants/gamma")
    # The plaintext is in the create reply only: not in lists, the audit, the table or logs.
    table = env.store.client.scan(TableName="config")
    for text in (json.dumps(listed), json.dumps(audit), json.dumps(shown), json.dumps(table)):
        assert plaintext not in text
    out = capsys.readouterr()
    assert plaintext not in out.out + out.err
    # The logs saw the table writes (botocore logs their bodies at debug), never the key.
    assert any(hash_key(plaintext) in line for line in logs.lines)
    assert not [line for line in logs.lines if plaintext in line]
    # Gamma is under org acme: gateways serving acme's hierarchy learn of the new version.
    assert await env.cache_version("o:acme") == key["version"]


async def test_rotate_keeps_the_old_key_for_the_overlap(env: Env) -> None:
    await call(env, "POST", "/tenants", GAMMA, expect=201)
    old = await call(env, "POST", "/keys", {"tenant": "gamma", "id": "gamma-app"}, expect=201)
    rotated = await call(env, "POST", "/keys/gamma-app/rotate", {"overlap": "2h"}, expect=201)
    assert rotated["key"] != old["key"] and rotated["id"].startswith("gamma-app-")
    assert rotated["replaces"]["expires_at"] == T0 + 7200
    config = env.config()
    assert config.keys.lookup(old["key"]) is not None  # both work during the overlap
    assert config.keys.lookup(rotated["key"]) is not None
    statuses = {k["id"]: k["status"] for k in (await call(env, "GET", "/keys"))["keys"]}
    assert statuses["gamma-app"] == "expiring" and statuses[rotated["id"]] == "active"

    env.clock.now = T0 + 7201
    config = env.config()
    assert config.keys.lookup(old["key"]) is None  # ended by itself, no write needed
    assert config.keys.lookup(rotated["key"]) is not None
    listed = {k["id"]: k for k in (await call(env, "GET", "/keys"))["keys"]}
    assert listed["gamma-app"]["status"] == "expired"
    assert listed["gamma-app"]["expires_at"] == T0 + 7200


async def test_revoke(env: Env) -> None:
    await call(env, "POST", "/tenants", GAMMA, expect=201)
    key = await call(env, "POST", "/keys", {"tenant": "gamma", "id": "gamma-leaked"}, expect=201)
    env.clock.now = T0 + 60
    revoked = await call(env, "POST", "/keys/gamma-leaked/revoke")
    assert revoked["key"]["revoked_at"] == T0 + 60 and revoked["key"]["status"] == "revoked"
    assert env.config().keys.lookup(key["key"]) is None
    again = await call(env, "POST", "/keys/gamma-leaked/revoke", expect=409)
    assert again["error"]["param"] == "id"
    # Its id stays taken: usage and the audit are by key id.
    taken = await call(env, "POST", "/keys", {"tenant": "gamma", "id": "gamma-leaked"}, expect=409)
    assert "never reused" in taken["error"]["message"]
    assert await env.cache_version("o:acme") == revoked["version"]


def own_limit(config: Config, tenant: str, dimension: Dimension) -> int:
    scope = config.tenant_scope(tenant)
    (budget,) = [b for b in scope.budgets
                 if b.level.kind is LevelKind.TENANT and b.dimension is dimension]  # fmt: skip
    return budget.limit


async def test_budgets_permanent_and_temporary(env: Env) -> None:
    day = {"level": "tenant", "id": "alpha", "dimension": "total_tokens", "window": "day"}
    await call(env, "PUT", "/budgets", {**day, "limit": 500_000})
    assert own_limit(env.config(), "alpha", Dimension.TOTAL_TOKENS) == 500_000

    raised = await call(env, "PUT", "/budgets",
                        {**day, "limit": 2_000_000, "for": "1h", "reason": "launch"})  # fmt: skip
    override = raised["override"]
    assert override["expires_at"] == T0 + 3600 and override["created_by"] == "local:alice"
    assert own_limit(env.config(), "alpha", Dimension.TOTAL_TOKENS) == 2_000_000
    shown = await call(env, "GET", "/tenants/alpha")
    assert shown["tenant"]["budgets"] == [{**{k: day[k] for k in ("dimension", "window")},
                                          "limit": 500_000}]  # fmt: skip
    assert shown["effective_budgets"][-1]["limit"] == 2_000_000
    assert [o["id"] for o in shown["overrides"]] == [override["id"]]

    env.clock.now = T0 + 3601  # it reverts by itself: no write, no one to remember it
    assert own_limit(env.config(), "alpha", Dimension.TOTAL_TOKENS) == 500_000
    shown = await call(env, "GET", "/tenants/alpha")
    assert shown["overrides"] == [] and shown["effective_budgets"][-1]["limit"] == 500_000
    assert (await call(env, "GET", "/overrides"))["overrides"] == []
    assert len((await call(env, "GET", "/overrides", all="1"))["overrides"]) == 1


async def test_temporary_budget_cancelled(env: Env) -> None:
    day = {"level": "tenant", "id": "alpha", "dimension": "total_tokens", "window": "day"}
    until = datetime.fromtimestamp(T0 + 86400, UTC).isoformat()
    raised = await call(env, "PUT", "/budgets", {**day, "limit": 3_000_000, "until": until})
    assert own_limit(env.config(), "alpha", Dimension.TOTAL_TOKENS) == 3_000_000
    await call(env, "DELETE", f"/overrides/{raised['override']['id']}")
    assert own_limit(env.config(), "alpha", Dimension.TOTAL_TOKENS) == 1_000_000  # the file's


async def test_users_template_and_rate_limits(env: Env) -> None:
    body = {"level": "users", "id": "alpha", "dimension": "cost_usd", "window": "day",
            "limit": 0.5}  # fmt: skip
    set_ = await call(env, "PUT", "/budgets", body)
    assert set_["rules"]["budgets"] == [{"dimension": "cost_usd", "limit": 0.5, "window": "day"}]
    rates = await call(env, "PUT", "/rate-limits",
                       {"level": "tenant", "id": "beta", "requests_per_minute": 60})  # fmt: skip
    assert rates["rules"]["rate_limits"] == {"requests_per_minute": 60}
    state = env.store.load()
    assert state.tenants["alpha"]["users"]["budgets"][0]["limit"] == 0.5
    (rate,) = env.config().tenant_scope("beta").rate_limits
    assert rate.requests_per_minute == 60
    unset = {"level": "tenant", "id": "beta", "requests_per_minute": None}
    removed = await call(env, "PUT", "/rate-limits", unset)
    assert "rate_limits" not in removed["rules"]
    assert env.config().tenant_scope("beta").rate_limits == ()


BAD_CHANGES = [
    pytest.param("PUT", "/budgets", {"level": "tenant", "id": "alpha", "dimension": "tokens",
                                     "window": "day", "limit": 5}, "dimension", id="dimension"),
    pytest.param("PUT", "/budgets", {"level": "tenant", "id": "alpha", "dimension": "cost_usd",
                                     "window": "day", "limit": -1}, "limit", id="negative-limit"),
    pytest.param("PUT", "/budgets", {"level": "tenant", "id": "nobody", "dimension": "cost_usd",
                                     "window": "day", "limit": 5}, "id", id="unknown-tenant"),
    pytest.param("PUT", "/budgets", {"level": "tenant", "id": "alpha", "dimension": "cost_usd",
                                     "window": "fortnight", "limit": 5}, "window", id="window"),
    pytest.param("PATCH", "/tenants/alpha", {"routes": ["small", "gpt-nope"]},
                 "tenants[alpha].routes[1]", id="unknown-route"),
    pytest.param("POST", "/tenants", {"id": "delta", "org": "nobody"}, "tenants[delta].org",
                 id="unknown-org"),
    pytest.param("POST", "/keys", {"tenant": "alpha", "queue_priority": 12},
                 "queue_priority", id="key-priority"),
]  # fmt: skip


@pytest.mark.parametrize("initialized", [False, True], ids=["first-change", "later"])
@pytest.mark.parametrize(("method", "path", "body", "param"), BAD_CHANGES)
async def test_a_bad_change_is_a_400_naming_the_field_and_writes_nothing(
    env: Env, method: str, path: str, body: dict[str, Any], param: str, initialized: bool
) -> None:
    if initialized:
        await call(env, "POST", "/orgs", {"id": "globex"}, expect=201)
    version, audit = env.store.version(), env.store.audit()
    published = list(env.published.calls)
    error = (await call(env, method, path, body, expect=400))["error"]
    assert param in (error["param"] or ""), error
    assert error["type"] == "invalid_request_error"
    assert env.store.version() == version == (2 if initialized else 0)
    assert env.store.audit() == audit
    assert env.published.calls == published


async def test_every_change_is_audited_with_the_caller(env: Env) -> None:
    await call(env, "POST", "/tenants", GAMMA, expect=201)
    bob = {**AUTH, "x-hardcap-operator": "bob"}
    await call(env, "POST", "/tenants/gamma/disable", headers=bob)
    assert env.config().principal_by_id("alpha-k") is not None
    entries = (await call(env, "GET", "/audit"))["entries"]
    newest = entries[0]
    assert (newest["who"], newest["action"], newest["target"]) == (
        "local:bob", "tenant.disable", "gamma"
    )  # fmt: skip
    assert newest["before"].get("disabled") is None and newest["after"]["disabled"] is True
    created = next(e for e in entries if e["action"] == "tenant.create")
    assert created["who"] == "local:alice" and created["before"] is None
    imported = [e for e in entries if e["action"] == "config.import"]
    assert {e["target"] for e in imported} >= {"acme", "alpha", "beta", "open", "alpha-k"}
    assert all(e["who"] == "local:alice" for e in imported)
    # Versions only grow, newest first.
    assert [e["version"] for e in entries] == sorted((e["version"] for e in entries), reverse=True)
    await call(env, "POST", "/tenants/gamma/enable", headers=bob)
    assert "disabled" not in env.store.load().tenants["gamma"]


async def test_the_audit_takes_its_query_parameters_or_names_the_bad_one(env: Env) -> None:
    await call(env, "POST", "/tenants", GAMMA, expect=201)
    entries = (await call(env, "GET", "/audit"))["entries"]
    assert len(entries) >= 2
    newest = (await call(env, "GET", "/audit", limit="1"))["entries"]
    assert newest == entries[:1]
    since = (await call(env, "GET", "/audit", since=str(entries[0]["at"])))["entries"]
    assert since and all(e["at"] >= entries[0]["at"] for e in since)
    for params, name in (({"limit": "ten"}, "limit"), ({"since": "yesterday"}, "since")):
        error = (await call(env, "GET", "/audit", expect=400, **params))["error"]
        assert error["param"] == name, error


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-credentials"),
        pytest.param({"authorization": "Bearer wrong-token-0123456789"}, id="wrong-token"),
        pytest.param({"authorization": f"Bearer {KEYS['alpha']}"}, id="tenant-key"),
        pytest.param({"authorization": f"Bearer {hash_key(TOKEN)}"}, id="token-hash"),
        pytest.param({"authorization": f"Basic {TOKEN}"}, id="other-scheme"),
    ],
)
async def test_local_api_refuses_without_the_admin_token(env: Env, headers: dict[str, str]) -> None:
    for method, path, body in (("GET", "/tenants", None), ("POST", "/tenants", GAMMA),
                               ("PUT", "/budgets", {"level": "tenant"})):  # fmt: skip
        error = (await call(env, method, path, body, headers=headers, expect=401))["error"]
        assert error["type"] == "authentication_error"
    assert env.store.version() == 0
    # The tenant key still works where it belongs.
    models = await env.http.get("/v1/models", headers={"authorization": f"Bearer {KEYS['alpha']}"})
    assert models.status_code == 200


async def test_no_admin_routes_on_lambda(
    env: Env, standalone_client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "hardcap-gateway")
    app = create_app(parse_config(env.file_data), ledger_client=standalone_client)
    assert not mount_admin(app, env.admin, TOKEN)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert (await c.get("/admin/v1/tenants", headers=AUTH)).status_code == 404


async def test_a_change_that_raced_another_is_rebuilt_on_it(env: Env) -> None:
    """Another writer goes first between this change's read and its write: the change is
    rebuilt on what the table then holds, and both are there."""
    await call(env, "POST", "/orgs", {"id": "globex"}, expect=201)
    store = env.store
    write = store.write
    raced: list[int] = []

    def racing_write(changes: Sequence[Change], who: str, expect_version: int) -> int:
        if not raced:
            doc = {"budgets": [{"dimension": "total_tokens", "limit": 7, "window": "day"}]}
            raced.append(write([Change("org", "initech", None, doc, "org.create")], "other",
                               expect_version))  # fmt: skip
        return write(changes, who, expect_version)

    store.write = racing_write  # type: ignore[method-assign]
    reply = await call(env, "POST", "/tenants", {**GAMMA, "org": "globex"}, expect=201)
    assert reply["version"] == raced[0] + 1
    state = store.load()
    assert "initech" in state.orgs and state.tenants["gamma"]["org"] == "globex"


async def test_a_failed_publish_does_not_fail_the_change(env: Env) -> None:
    class Down:
        async def publish(self, roots: Sequence[str], version: int) -> None:
            raise LedgerUnavailable("cache down")

    env.admin.publisher = Down()
    reply = await call(env, "POST", "/tenants", GAMMA, expect=201)
    assert env.store.version() == reply["version"]


async def test_keys_list_shows_last_use_from_the_rollup(env: Env) -> None:
    await call(env, "POST", "/tenants", GAMMA, expect=201)
    key = await call(env, "POST", "/keys", {"tenant": "gamma", "id": "gamma-ci"}, expect=201)
    config = env.config()
    principal = config.keys.lookup(key["key"])
    assert principal is not None
    ledger = Ledger(env.cache)
    for i in range(3):  # three records of one key: one last-used write in the pass
        meta = ReservationMeta("small", "mock-small", "gamma-ci", f"rq-{i}", provider="mock")
        admitted = await ledger.admit(principal.scope, input_tokens=5, output_estimate=5,
                                      meta=meta)  # fmt: skip
        assert isinstance(admitted, Admitted)
        await ledger.settle(admitted.reservation, input_tokens=5, output_tokens=5)
    writes: list[tuple[str, str, int]] = []
    touch = env.usage.touch_last_used

    def counted(tenant: str, key_id: str, at_ms: int) -> None:
        writes.append((tenant, key_id, at_ms))
        touch(tenant, key_id, at_ms)

    env.usage.touch_last_used = counted  # type: ignore[method-assign]
    report = await run_rollup(config, env.cache, env.usage)
    assert report.applied == 3
    assert [(t, k) for t, k, _ in writes] == [("gamma", "gamma-ci")]
    (listed,) = (await call(env, "GET", "/keys", tenant="gamma"))["keys"]
    assert listed["last_used_at"] == writes[0][2] / 1000
    # An older use never moves it back.
    env.usage.touch_last_used("gamma", "gamma-ci", writes[0][2] - 60_000)
    (listed,) = (await call(env, "GET", "/keys", tenant="gamma"))["keys"]
    assert listed["last_used_at"] == writes[0][2] / 1000


async def test_usage_is_what_hardcap_usage_shows(env: Env) -> None:
    reply = await call(env, "GET", "/usage", since="1h")
    assert reply["rows"] == [] and reply["end_ms"] - reply["start_ms"] == 3_600_000
    error = (await call(env, "GET", "/usage", since="yesterday", expect=400))["error"]
    assert error["param"] == "since"


async def test_config_plan_apply_export(env: Env) -> None:
    """The file's orgs and tenants as the GitOps source: plan shows, apply makes it so, plan
    again shows nothing, and export is a file that plans to nothing."""
    import yaml

    created = await call(env, "POST", "/keys", {"tenant": "beta", "id": "beta-adhoc"}, expect=201)
    wanted = {
        "orgs": env.file_data["orgs"],
        "tenants": [*env.file_data["tenants"], {k: v for k, v in GAMMA.items()}],
    }
    planned = await call(env, "POST", "/config/plan", wanted)
    assert "+ tenant gamma" in planned["text"]
    assert "- key beta-adhoc (revoke)" in planned["text"]  # a key not in the file is revoked
    version = env.store.version()
    assert planned["version"] == version  # a plan writes nothing
    applied = await call(env, "POST", "/config/apply", wanted)
    assert applied["version"] > version and applied["text"] == planned["text"]
    assert env.config().keys.lookup(created["key"]) is None
    again = await call(env, "POST", "/config/plan", wanted)
    assert again["changes"] == [] and again["text"] == "No changes."
    exported = yaml.safe_load((await call(env, "GET", "/config/export"))["yaml"])
    assert (await call(env, "POST", "/config/plan", exported))["changes"] == []
    error = (await call(env, "POST", "/config/plan", {**wanted, "routes": []}, expect=400))["error"]
    assert error["param"] == "routes"  # routes stay in the deployed file
