"""Stored Responses: what the gateway keeps of a ``/v1/responses`` reply served with ``store``
true, owned by the tenant (and the user) that made it.

A record is one string key (:meth:`Keyspace.stored_response`: in the tenant hierarchy's slot,
the tenant's id in its name) holding a versioned JSON object: ``v`` (:data:`VERSION`; a later
release adds fields and keeps these), ``id``, ``tenant``, ``user`` (the user level of the
caller, ``""`` for a key without one), ``key`` (the key id that made it), ``created_at``,
``response`` (the Response object as the client got it) and ``input`` (its input items, the
chain before it included: what a later ``previous_response_id`` sends again). Each step is one
command (SET with its TTL, GET, DEL), atomic on its own; nothing here touches a budget.

Bounded: a record is written with the TTL ``gateway.stored_response_ttl_seconds`` and only when
it takes at most ``gateway.stored_response_max_bytes`` (:meth:`StoredResponses.record` says
whether it fits before anything is sent: the reply then says ``store: false``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hardcap_core import json_codec
from hardcap_core.budgets import Scope
from hardcap_core.ledger.connection import guarded
from hardcap_core.ledger.keys import Keyspace

VERSION = 1  # the record format this release writes; it reads any with these fields


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a stored response belongs to: only the same tenant and user read it."""

    scope: Scope  # the caller's: its hierarchy's slot holds the record
    tenant: str
    user: str  # the caller's user level ("" for none): a user reads only their own
    key: str  # the key that made it (kept for the record; not part of the ownership)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A record as read back."""

    id: str
    response: dict[str, Any]
    input: list[dict[str, Any]]
    created_at: int


class StoredResponses:
    """The stored Responses in the cache: one per process, on the ledger's client."""

    def __init__(self, client: Any, keys: Keyspace, *, ttl_s: float, max_bytes: int) -> None:
        self.client = client
        self.keys = keys
        self.ttl_s = max(1, int(ttl_s))
        self.max_bytes = max_bytes

    def record(
        self, owner: Owner, response: Mapping[str, Any], items: Sequence[Mapping[str, Any]]
    ) -> bytes | None:
        """The record of ``response`` and its input ``items`` as written, or None when it is
        larger than ``max_bytes`` (then it is not stored)."""
        record = {
            "v": VERSION,
            "id": response["id"],
            "tenant": owner.tenant,
            "user": owner.user,
            "key": owner.key,
            "created_at": int(time.time()),
            "response": response,
            "input": list(items),
        }
        raw = json_codec.dumps(record)
        return raw if len(raw) <= self.max_bytes else None

    async def put(self, owner: Owner, response_id: str, record: bytes) -> None:
        """Keep ``record`` (made by :meth:`record`) for the TTL."""
        key = self.keys.stored_response(owner.scope, owner.tenant, response_id)
        await guarded(self.client.set(key, record, ex=self.ttl_s))

    async def get(self, owner: Owner, response_id: str) -> StoredResponse | None:
        """The record of ``response_id`` if ``owner`` made it (None otherwise: never another
        tenant's or another user's)."""
        raw = await guarded(self.client.get(self._key(owner, response_id)))
        if raw is None:
            return None
        record = json_codec.loads(raw)
        if not isinstance(record, dict) or not _owned(record, owner, response_id):
            return None
        return StoredResponse(
            response_id,
            dict(record["response"]),
            list(record.get("input") or []),
            int(record.get("created_at") or 0),
        )

    async def delete(self, owner: Owner, response_id: str) -> bool:
        """Forget ``response_id`` if ``owner`` made it; whether it did."""
        if await self.get(owner, response_id) is None:
            return False
        deleted = await guarded(self.client.delete(self._key(owner, response_id)))
        return bool(deleted)

    def _key(self, owner: Owner, response_id: str) -> str:
        return self.keys.stored_response(owner.scope, owner.tenant, response_id)


def _owned(record: Mapping[str, Any], owner: Owner, response_id: str) -> bool:
    """Whether ``record`` is ``owner``'s: the key name holds the tenant, and the record says
    so too; a user's record answers that user only, a key's record (no user) keys only."""
    return (
        record.get("id") == response_id
        and record.get("tenant") == owner.tenant
        and (record.get("user") or "") == owner.user
        and isinstance(record.get("response"), dict)
    )
