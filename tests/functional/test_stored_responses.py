"""The stored Responses' records on a real Valkey, standalone and a 3-node cluster: written in
the tenant hierarchy's slot with their TTL, read and deleted by their tenant and user only, refused
past the size bound, and a later release's record (more fields) read by this one."""

from __future__ import annotations

from typing import Any

from hardcap_core import json_codec
from hardcap_core.budgets import Level, LevelKind, Scope
from hardcap_core.ledger.keys import Keyspace
from hardcap_core.ledger.stored_responses import VERSION, Owner, StoredResponses

ALPHA = Scope((Level(LevelKind.KEY, "a-k"), Level(LevelKind.TENANT, "alpha")), (), ())
BETA = Scope((Level(LevelKind.KEY, "b-k"), Level(LevelKind.TENANT, "beta")), (), ())
RESPONSE = {"id": "resp_1", "object": "response", "output": [{"type": "message"}]}
ITEMS = [{"id": "msg_1", "type": "message", "role": "user", "content": "hi"}]


def store(client: Any, max_bytes: int = 10_000) -> StoredResponses:
    return StoredResponses(client, Keyspace(), ttl_s=60, max_bytes=max_bytes)


async def test_a_record_is_read_by_its_tenant_and_user_only(client: Any) -> None:
    kept = store(client)
    owner = Owner(ALPHA, "alpha", "", "a-k")
    record = kept.record(owner, RESPONSE, ITEMS)
    assert record is not None and json_codec.loads(record)["v"] == VERSION
    await kept.put(owner, "resp_1", record)
    found = await kept.get(Owner(ALPHA, "alpha", "", "another-key"), "resp_1")  # any key of it
    assert found is not None and (found.response, found.input) == (RESPONSE, ITEMS)
    for stranger in (Owner(BETA, "beta", "", "b-k"), Owner(ALPHA, "alpha", "alpha~ada", "a-k")):
        assert await kept.get(stranger, "resp_1") is None
        assert await kept.delete(stranger, "resp_1") is False
    key = Keyspace().stored_response(ALPHA, "alpha", "resp_1")
    assert key.startswith("hc:{t:alpha}:") and 0 < await client.ttl(key) <= 60
    assert await kept.delete(owner, "resp_1") is True
    assert await kept.get(owner, "resp_1") is None


async def test_a_users_record_is_not_a_keys(client: Any) -> None:
    kept = store(client)
    ada = Owner(ALPHA, "alpha", "alpha~ada", "a-k")
    record = kept.record(ada, RESPONSE, ITEMS)
    assert record is not None
    await kept.put(ada, "resp_1", record)
    assert await kept.get(ada, "resp_1") is not None
    assert await kept.get(Owner(ALPHA, "alpha", "", "a-k"), "resp_1") is None


async def test_past_the_size_bound_there_is_no_record_to_write(client: Any) -> None:
    kept = store(client, max_bytes=400)
    owner = Owner(ALPHA, "alpha", "", "a-k")
    assert kept.record(owner, RESPONSE, ITEMS * 10) is None
    assert kept.record(owner, RESPONSE, ITEMS) is not None


async def test_a_later_releases_record_is_read(client: Any) -> None:
    """Records are versioned and grow by new fields only: a later one still reads."""
    kept = store(client)
    owner = Owner(ALPHA, "alpha", "", "a-k")
    later = {"v": VERSION + 1, "id": "resp_1", "tenant": "alpha", "user": "", "key": "a-k",
             "created_at": 1, "response": RESPONSE, "input": ITEMS, "new_field": [1]}  # fmt: skip
    await client.set(Keyspace().stored_response(ALPHA, "alpha", "resp_1"), json_codec.dumps(later))
    found = await kept.get(owner, "resp_1")
    assert found is not None and found.input == ITEMS and found.created_at == 1
