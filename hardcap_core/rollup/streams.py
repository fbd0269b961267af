"""The cache side of a rollup: one hierarchy's usage stream, read through a consumer group.

A run holds the stream's lease (so runs of the same stream take turns), claims what a crashed
run left pending (``XAUTOCLAIM``), reads new entries (``XREADGROUP``), and after the durable
write acknowledges (``XACK``) and trims (``XTRIM MINID``) only entries already applied.
The stream's *generation* names one life of the stream: the cache lost the stream and its group
(a flush, a failover without the data) exactly when the generation key is gone too, and the
durable cursor is kept per generation, so ids of a new stream are never mistaken for applied.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from hardcap_core.budgets import Level
from hardcap_core.errors import LedgerProtocolError
from hardcap_core.ledger.connection import guarded
from hardcap_core.ledger.keys import Keyspace
from hardcap_core.ledger.scripts import Scripts

GROUP = "rollup"
Entry = tuple[str, dict[bytes, bytes]]


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream id as numbers, for ordering: ``"1700000000000-3"`` -> (1700000000000, 3)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def after(entry_id: str) -> str:
    """The smallest id greater than ``entry_id`` (for ``XTRIM MINID``: everything below goes)."""
    ms, seq = entry_key(entry_id)
    return f"{ms}-{seq + 1}"


class UsageStream:
    """One hierarchy's usage stream as one rollup run sees it."""

    def __init__(self, client: Any, scripts: Scripts, keys: Keyspace, root: Level) -> None:
        self.client = client
        self.scripts = scripts
        self.key = keys.usage_stream(root)
        self.lease_key = keys.rollup_lease(root)
        self.generation_key = keys.stream_generation(root)

    async def lease(self, owner: str, ttl_ms: int) -> bool:
        """Take the stream for ``ttl_ms`` unless another run holds it."""
        return bool(await guarded(self.client.set(self.lease_key, owner, nx=True, px=ttl_ms)))

    async def release(self, owner: str) -> None:
        await guarded(self.scripts.unlock(keys=[self.lease_key], args=[owner]))

    async def current_generation(self) -> str | None:
        """This stream's generation, or None if the cache has none (yet, or any more)."""
        current = await guarded(self.client.get(self.generation_key))
        return None if current is None else _text(current)

    async def generation(self) -> str:
        """This stream's generation, starting a new one (and the group, reading from the
        stream's start) when the cache has none."""
        current = await guarded(self.client.get(self.generation_key))
        if current is not None:
            return _text(current)
        fresh = uuid.uuid4().hex
        if await guarded(self.client.set(self.generation_key, fresh, nx=True)):
            try:
                await guarded(self.client.xgroup_create(self.key, GROUP, id="0", mkstream=True))
            except LedgerProtocolError as e:  # a group without a generation: kept, read again
                if "BUSYGROUP" not in str(e):
                    raise
            return fresh
        return _text(await guarded(self.client.get(self.generation_key)))

    async def claim(self, consumer: str, count: int) -> list[Entry]:
        """Every entry left pending by earlier runs (crashed, or cut off by their deadline),
        taken over by ``consumer``: the lease says no one else is working on them."""
        out: list[Entry] = []
        start = "0-0"
        while True:
            reply = await guarded(
                self.client.xautoclaim(self.key, GROUP, consumer, 0, start_id=start, count=count)
            )
            start, entries = _text(reply[0]), reply[1]
            out += [(_text(i), f) for i, f in entries if f is not None]
            if start == "0-0":
                return out

    async def read_new(self, consumer: str, count: int) -> list[Entry]:
        """Up to ``count`` entries never delivered to the group before."""
        reply = await guarded(self.client.xreadgroup(GROUP, consumer, {self.key: ">"}, count=count))
        entries: list[Any] = []
        if isinstance(reply, dict):  # RESP3
            for value in reply.values():
                entries += value[0] if value and isinstance(value[0], list) else value
        else:
            for _, batch in reply or []:
                entries += batch
        return [(_text(i), f) for i, f in entries if f is not None]

    async def entries_after(self, cursor: str | None, count: int | None = None) -> list[Entry]:
        """The first ``count`` (default: all) entries after ``cursor`` (None: from the start)."""
        low = "-" if cursor is None else f"({cursor}"
        entries = await guarded(self.client.xrange(self.key, min=low, max="+", count=count))
        return [(_text(i), f) for i, f in entries]

    async def ack(self, ids: Sequence[str]) -> None:
        if ids:
            await guarded(self.client.xack(self.key, GROUP, *ids))

    async def trim(self, cursor: str) -> None:
        """Drop every entry up to ``cursor`` (all applied to the durable ledger)."""
        await guarded(self.client.xtrim(self.key, minid=after(cursor), approximate=False))

    async def forget_consumers(self, keep: str, idle_ms: int) -> None:
        """Remove consumers (one is made per run) that hold nothing and were idle ``idle_ms``:
        longer than a lease, so no run still uses them (deleting a consumer deletes what it
        holds, and a run that just read might hold entries the listing did not show yet)."""
        try:
            consumers = await guarded(self.client.xinfo_consumers(self.key, GROUP))
        except LedgerProtocolError:  # no stream or no group: nothing to forget
            return
        for c in consumers:
            name = _text(c["name"])
            if name != keep and int(c["pending"]) == 0 and int(c["idle"]) > idle_ms:
                await guarded(self.client.xgroup_delconsumer(self.key, GROUP, name))


def _text(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
