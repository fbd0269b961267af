"""The config table against moto's DynamoDB: every kind of item round-trips, a writer that read
an old version changes nothing (not even the audit), racing writers cannot both win, the audit
log reads newest first and never holds a key, and a load pages through every item."""

from __future__ import annotations

import copy
import dataclasses
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig
from moto import mock_aws

from hardcap_core.auth import hash_key, new_key
from hardcap_core.control.plan import diff
from hardcap_core.control.state import KeyRecord, LiveState, Override
from hardcap_core.control.store import MAX_CHANGES, Change, ConfigStore
from hardcap_core.errors import ConfigConflict, ConfigStoreUnavailable
from hardcap_core.local.aws import OneCallAtATime

T0 = datetime(2026, 3, 14, 12, 0, tzinfo=UTC).timestamp()
TABLE = "hardcap-config"


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def raw() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("dynamodb", region_name="us-east-1")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(raw: Any, clock: Clock) -> ConfigStore:
    s = ConfigStore(TABLE, OneCallAtATime(raw), clock=clock)
    s.create_table()
    return s


def tenant_doc(limit: int = 1000, org: str | None = "bigco") -> dict[str, Any]:
    doc: dict[str, Any] = {
        "budgets": [{"dimension": "total_tokens", "limit": limit, "window": "day"}]
    }
    if org:
        doc["org"] = org
    return doc


def key_record(key_id: str, tenant: str = "acme") -> tuple[str, KeyRecord]:
    plaintext, key_hash = new_key()
    record = KeyRecord(key_id, tenant, key_hash, {"queue_priority": 2}, T0, "local:ops")
    return plaintext, record


def override(oid: str = "ov-1", limit: int = 5000) -> Override:
    budget = {"dimension": "total_tokens", "limit": limit, "window": "day"}
    return Override(oid, "tenant", "acme", budget, T0 + 7 * 86400, T0, "local:ops", "launch week")


def every_item(raw: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    args: dict[str, Any] = {"TableName": TABLE}
    while True:
        page = raw.scan(**args)
        items += page["Items"]
        if "LastEvaluatedKey" not in page:
            return items
        args["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def test_an_unwritten_table_is_version_zero(store: ConfigStore) -> None:
    assert store.version() == 0
    assert store.load() == LiveState(0)
    assert not store.load().initialized
    assert store.audit() == []
    assert store.key_by_hash(new_key()[1]) is None


def test_every_kind_round_trips(store: ConfigStore, clock: Clock) -> None:
    _, key = key_record("acme-1")
    ov = override()
    org = {"budgets": [{"dimension": "cost_usd", "limit": 12.5, "window": "month"}]}
    v1 = store.write(
        [
            Change("org", "bigco", None, org, "org.create"),
            Change("tenant", "acme", None, tenant_doc(), "tenant.create"),
            Change("key", key.hash, None, key, "key.create"),
            Change("override", ov.id, None, ov, "budgets.set"),
        ],
        "local:ops",
        expect_version=0,
    )
    assert v1 == 1
    state = store.load()
    assert state.version == 1 == store.version()
    assert state.orgs == {"bigco": org}
    assert state.tenants == {"acme": tenant_doc()}
    assert state.keys == {key.hash: key}
    assert state.overrides == (ov,)
    assert store.key_by_hash(key.hash) == key

    # Updates and deletes of each kind, in one later write.
    clock.now += 60
    revoked = dataclasses.replace(key, revoked_at=clock.now)
    longer = dataclasses.replace(ov, expires_at=ov.expires_at + 86400)
    v2 = store.write(
        [
            Change("tenant", "acme", tenant_doc(), tenant_doc(2000), "tenant.update"),
            Change("key", key.hash, key, revoked, "key.revoke"),
            Change("override", ov.id, ov, longer, "budgets.set"),
            Change("org", "bigco", org, None, "org.delete"),
        ],
        "local:ops",
        expect_version=v1,
    )
    assert v2 == 2
    state = store.load()
    assert state.orgs == {}
    assert state.tenants == {"acme": tenant_doc(2000)}
    assert state.keys == {key.hash: revoked}
    assert not state.keys[key.hash].active(clock.now)
    assert state.overrides == (longer,)


def test_items_are_stored_as_the_contract_says(store: ConfigStore, raw: Any) -> None:
    """The admin service, the gateway and people reading the table rely on these shapes."""
    _, key = key_record("acme-1")
    ov = override()
    store.write([Change("tenant", "acme", None, {"id": "acme", **tenant_doc()}, "tenant.create"),
                  Change("key", key.hash, None, key, "key.create"),
                  Change("override", ov.id, None, ov, "budgets.set")],
                 "local:ops", 0)  # fmt: skip
    items = {(i["pk"]["S"], i["sk"]["S"]): i for i in every_item(raw)}
    meta = items["meta", "version"]
    assert meta["version"] == {"N": "1"}
    assert float(meta["updated_at"]["N"]) == T0
    tenant = items["tenant", "acme"]
    assert json.loads(tenant["doc"]["S"]) == tenant_doc()  # the id is the sort key only
    assert tenant["version"] == {"N": "1"}
    stored_key = items["key", key.hash]
    assert stored_key["tenant"] == {"S": "acme"}
    assert stored_key["key_id"] == {"S": "acme-1"}
    assert KeyRecord(**json.loads(stored_key["doc"]["S"])) == key
    assert items["override", ov.id]["expires_at"] == {"N": str(int(ov.expires_at))}
    audits = [i for (pk, _), i in items.items() if pk.startswith("audit#")]
    assert {a["pk"]["S"] for a in audits} == {"audit#202603"}
    assert all(a["sk"]["S"].startswith("2026-03-14T12:00:00.000Z#") for a in audits)


def test_a_stale_version_writes_nothing(store: ConfigStore, raw: Any) -> None:
    store.write([Change("tenant", "acme", None, tenant_doc(), "tenant.create")], "local:a", 0)
    before = every_item(raw)
    for stale in (0, 2, 7):  # behind, and ahead of, the table's version 1
        with pytest.raises(ConfigConflict):
            store.write(
                [
                    Change("tenant", "acme", tenant_doc(), tenant_doc(5), "tenant.update"),
                    Change("tenant", "beta", None, tenant_doc(), "tenant.create"),
                ],
                "local:b",
                expect_version=stale,
            )
    assert every_item(raw) == before  # the audit included: nothing of the refused writes
    assert store.load().tenants == {"acme": tenant_doc()}
    assert [e.who for e in store.audit()] == ["local:a"]


def test_racing_writers_one_wins(store: ConfigStore) -> None:
    """Writers that all read version 1 race to write version 2: exactly one does; the others
    get ConfigConflict and their changes appear nowhere, not in the audit either."""
    store.write([Change("tenant", "acme", None, tenant_doc(), "tenant.create")], "local:a", 0)
    n = 8
    barrier = threading.Barrier(n)
    results: dict[int, object] = {}

    def writer(i: int) -> None:
        version = store.version()
        barrier.wait()
        change = Change("tenant", "acme", tenant_doc(), tenant_doc(100 + i), "tenant.update")
        try:
            results[i] = store.write([change], f"local:w{i}", version)
        except ConfigConflict as e:
            results[i] = e

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in results.items() if r == 2]
    assert len(winners) == 1
    assert all(isinstance(r, ConfigConflict) for i, r in results.items() if i != winners[0])
    assert store.version() == 2
    assert store.load().tenants["acme"] == tenant_doc(100 + winners[0])
    latest = store.audit()
    assert [e.who for e in latest] == [f"local:w{winners[0]}", "local:a"]


def test_audit_is_newest_first_and_never_holds_a_key(store: ConfigStore, raw: Any,
                                                     clock: Clock) -> None:  # fmt: skip
    plaintext, key = key_record("acme-1")
    store.write([Change("tenant", "acme", None, tenant_doc(), "tenant.create"),
                 Change("key", key.hash, None, key, "key.create")], "local:alice", 0)  # fmt: skip
    clock.now += 1.5
    revoked = dataclasses.replace(key, revoked_at=clock.now)
    store.write([Change("key", key.hash, key, revoked, "key.revoke")], "arn:aws:iam::1:user/bob", 1)

    entries = store.audit()
    assert [(e.action, e.who, e.version) for e in entries] == [
        ("key.revoke", "arn:aws:iam::1:user/bob", 2),
        ("key.create", "local:alice", 1),  # later in its write than the tenant: first
        ("tenant.create", "local:alice", 1),
    ]
    revoke, create, tenant = entries
    assert revoke.at == T0 + 1.5 and create.at == T0
    assert revoke.kind == "key" and revoke.target == "acme-1"
    assert revoke.before["revoked_at"] is None and revoke.after["revoked_at"] == T0 + 1.5
    assert revoke.before["hash"] == key.hash
    assert create.before is None and create.after["tenant"] == "acme"
    assert tenant.target == "acme" and tenant.after == tenant_doc()
    assert plaintext not in json.dumps(every_item(raw))
    assert plaintext not in repr(entries)

    assert [e.action for e in store.audit(limit=2)] == ["key.revoke", "key.create"]
    assert [e.action for e in store.audit(since=T0 + 1)] == ["key.revoke"]


def test_audit_cut_keeps_the_order_of_one_write(store: ConfigStore) -> None:
    """A write's entries share one instant; a limit that cuts through them keeps the latest."""
    changes = [Change("org", f"o{i:02d}", None, {}, "org.create") for i in range(20)]
    store.write(changes, "local:ops", 0)
    assert [e.target for e in store.audit(limit=3)] == ["o19", "o18", "o17"]
    assert [e.target for e in store.audit()] == [f"o{i:02d}" for i in reversed(range(20))]


def test_a_plaintext_key_is_refused(store: ConfigStore, raw: Any) -> None:
    plaintext, key = key_record("acme-1")
    leaky = dataclasses.replace(key, doc={"note": f"the key is {plaintext}"})
    with pytest.raises(ValueError, match="plaintext key"):
        store.write([Change("key", key.hash, None, leaky, "key.create")], "local:ops", 0)
    doc = {**tenant_doc(), "routes": [plaintext]}
    with pytest.raises(ValueError, match="plaintext key"):
        store.write([Change("tenant", "acme", None, doc, "tenant.create")], "local:ops", 0)
    assert every_item(raw) == []
    long_id = "hc_" + "a" * 50  # an id that begins like a key but is longer than one: fine
    assert store.write([Change("org", long_id, None, {}, "org.create")], "local:ops", 0) == 1


def test_changes_that_cannot_be_stored_are_refused(store: ConfigStore, raw: Any) -> None:
    _, key = key_record("acme-1")
    wrong = [
        (Change("key", "sha256:" + "0" * 64, None, key, "key.create"), "under its hash"),
        (Change("key", key.hash, None, {"id": "acme-1"}, "key.create"), "holds a dict"),
        (Change("tenant", "acme", None, {"keys": []}, "tenant.create"), "key records"),
        (Change("override", "other", None, override(), "budgets.set"), "under the id"),
    ]
    for change, why in wrong:
        with pytest.raises(ValueError, match=why):
            store.write([change], "local:ops", 0)
    many = [Change("org", f"o{i}", None, {}, "org.create") for i in range(MAX_CHANGES + 1)]
    with pytest.raises(ValueError, match="at most 45"):
        store.write(many, "local:ops", 0)
    assert every_item(raw) == []
    assert store.write(many[:MAX_CHANGES], "local:ops", 0) == 1  # the most one write takes
    assert len(store.load().orgs) == MAX_CHANGES
    assert store.write([], "local:ops", 1) == 1  # nothing to write: nothing written
    assert store.version() == 1


class PagedQueries:
    """Queries answered at most ``limit`` items a page, counted."""

    def __init__(self, client: Any, limit: int) -> None:
        self._client = client
        self._limit = limit
        self.pages: dict[str, int] = {}

    def query(self, **kwargs: Any) -> Any:
        pk = kwargs["ExpressionAttributeValues"][":pk"]["S"]
        self.pages[pk] = self.pages.get(pk, 0) + 1
        return self._client.query(**{"Limit": self._limit, **kwargs})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_load_of_500_keys_pages_through_them_all(store: ConfigStore, raw: Any) -> None:
    records = [key_record(f"k-{i:03d}", tenant=f"t{i % 3}")[1] for i in range(500)]
    first = records[:MAX_CHANGES]
    version = store.write([Change("key", r.hash, None, r, "key.create") for r in first],
                          "local:ops", 0)  # fmt: skip
    # The rest put as items of the same shape: through moto, 11 more transactions would cost
    # half a minute (it copies the whole table before each, to roll back).
    for start in range(MAX_CHANGES, 500, 25):
        puts = [{"PutRequest": {"Item": {
            "pk": {"S": "key"}, "sk": {"S": r.hash}, "tenant": {"S": r.tenant},
            "key_id": {"S": r.id}, "version": {"N": "1"},
            "doc": {"S": json.dumps(dataclasses.asdict(r))},
        }}} for r in records[start : start + 25]]  # fmt: skip
        raw.batch_write_item(RequestItems={TABLE: puts})
    paged = PagedQueries(raw, limit=64)
    state = ConfigStore(TABLE, paged).load()
    assert state.version == version == 1
    assert state.keys == {r.hash: r for r in records}
    assert paged.pages["key"] == 8  # 500 items, 64 a page
    assert len(store.audit(limit=1000)) == MAX_CHANGES


class WritesDuringLoad:
    """Another writer changes the table while the first load is between its queries."""

    def __init__(self, client: Any, writer: ConfigStore) -> None:
        self._client = client
        self._writer = writer
        self.writes = 0

    def query(self, **kwargs: Any) -> Any:
        if kwargs["ExpressionAttributeValues"][":pk"]["S"] == "key" and self.writes == 0:
            self.writes += 1
            _, record = key_record("late")
            change = Change("key", record.hash, None, record, "key.create")
            self._writer.write([change], "local:late", self._writer.version())
        return self._client.query(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_load_never_mixes_two_versions(store: ConfigStore, raw: Any) -> None:
    store.write([Change("tenant", "acme", None, tenant_doc(), "tenant.create")], "local:ops", 0)
    client = WritesDuringLoad(raw, store)
    state = ConfigStore(TABLE, client).load()
    assert client.writes == 1
    assert state.version == 2
    assert [r.id for r in state.keys.values()] == ["late"]


def test_audit_reads_back_across_months(store: ConfigStore, clock: Clock) -> None:
    version = 0
    months = [datetime(2025, m, 28, tzinfo=UTC).timestamp() for m in (11, 12)]
    months += [datetime(2026, m, 2, tzinfo=UTC).timestamp() for m in (1, 3)]
    for i, at in enumerate(months):
        clock.now = at
        change = Change("org", f"o{i}", None, {}, "org.create")
        version = store.write([change], "local:ops", version)
    clock.now = datetime(2026, 4, 1, tzinfo=UTC).timestamp()  # an empty month: read through
    assert [e.target for e in store.audit()] == ["o3", "o2", "o1", "o0"]
    assert [e.target for e in store.audit(limit=3)] == ["o3", "o2", "o1"]
    assert [e.target for e in store.audit(since=months[1])] == ["o3", "o2", "o1"]
    assert [e.at for e in store.audit(since=months[1] + 1)] == [months[3], months[2]]


def test_dynamodb_errors_become_config_store_errors(raw: Any) -> None:
    missing = ConfigStore("no-such-table", raw)
    with pytest.raises(ConfigStoreUnavailable):
        missing.version()
    with pytest.raises(ConfigStoreUnavailable):
        missing.write([Change("org", "o", None, {}, "org.create")], "local:ops", 0)
    unreachable = boto3.client(
        "dynamodb", region_name="us-east-1", endpoint_url="http://127.0.0.1:9",
        config=BotoConfig(retries={"max_attempts": 1}, connect_timeout=1),
    )  # fmt: skip
    for call in (ConfigStore(TABLE, unreachable).load,
                 lambda: ConfigStore(TABLE, unreachable).write(
                     [Change("org", "o", None, {}, "org.create")], "local:ops", 0)):  # fmt: skip
        with pytest.raises(ConfigStoreUnavailable):
            call()


def test_from_env() -> None:
    assert ConfigStore.from_env({}) is None
    store = ConfigStore.from_env({"HARDCAP_CONFIG_TABLE": "cfg"})
    assert store is not None and store.name == "cfg"


def test_a_file_applied_through_the_table_plans_no_changes_after(store: ConfigStore) -> None:
    """GitOps end to end on the table: apply a file (split into writes the store takes), load
    it back, plan again: nothing; drop a key from the file: it is revoked, then nothing."""
    keys = [{"id": f"k{i:02d}", "hash": hash_key(f"hc_test_{i}")} for i in range(60)]
    data: dict[str, Any] = {
        "upstreams": [{"name": "openai", "base_url": "https://api.openai.com/v1"}],
        "routes": [{"name": "small", "upstream": "openai",
                    "price": {"input_per_million": 0.15, "output_per_million": 0.6}}],
        "orgs": [{"id": "bigco", "budgets": [{"dimension": "cost_usd", "limit": 0.25,
                                              "window": "month"}]}],
        "tenants": [{"id": "acme", **tenant_doc(), "keys": keys}],
    }  # fmt: skip

    def apply(file: dict[str, Any]) -> int:
        state = store.load()
        changes = diff(state, file, T0, who="local:ops")
        version = state.version
        for start in range(0, len(changes), MAX_CHANGES):
            version = store.write(changes[start : start + MAX_CHANGES], "local:ops", version)
        return len(changes)

    assert apply(data) == 62  # an org, a tenant, 60 keys: two writes
    assert store.version() == 2
    assert diff(store.load(), data, T0) == []
    assert store.load().orgs["bigco"]["budgets"][0]["limit"] == 0.25

    fewer = copy.deepcopy(data)
    fewer["tenants"][0]["keys"] = keys[1:]
    assert apply(fewer) == 1
    record = store.key_by_hash(keys[0]["hash"])
    assert record is not None and record.revoked_at == T0
    assert diff(store.load(), fewer, T0 + 60) == []
