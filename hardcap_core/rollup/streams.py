"""The cache side of a rollup: one hierarchy's usage stream, read through a consumer group.

A run holds the stream's lease (so runs of the same stream take turns), claims what a crashed
run left pending (``XAUTOCLAIM``), reads new entries (``XREADGROUP``), and after the durable
write acknowledges (``XACK``) and trims (``XTRIM MINID``) only entries already applied.
The stream's *generation* names one life of the stream: the cache lost the stream and its group
(a flush, a failover without the data) exactly when the generation key is gone too, and the
durable cursor is kept per generation, so ids of a new stream are never mistaken for applied.
The consumer group is per generation too (``rollup:<generation>``): a run that began before the
cache lost the stream finds no group of its generation in the new stream (:class:`StreamLost`)
and so never reads, claims or acknowledges a later generation's entries.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from typing import Any

from hardcap_core.budgets import Level
from hardcap_core.errors import LedgerProtocolError
from hardcap_core.ledger.connection import guarded
from hardcap_core.ledger.contract import UnlockArgs, encode
from hardcap_core.ledger.keys import Keyspace
from hardcap_core.ledger.scripts import Scripts

GROUP = "rollup"  # the one group of streams written before groups were per generation
# Whoever holds a stream's lease (a rollup pass, or a restore charging kept settles) holds it at
# most this long; it releases it as soon as it is done. Longer than a rollup invocation.
LEASE_MS = 60_000
Entry = tuple[str, dict[bytes, bytes]]


class StreamLost(Exception):
    """The cache no longer holds the generation of the stream a run was reading: it lost the
    stream (a flush, a failover without the data) while the run worked. The run stops; the
    next one reads the new generation."""


def group_of(generation: str) -> str:
    """The consumer group that reads ``generation`` of a stream."""
    return f"{GROUP}:{generation}"


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
        self.gen = ""  # the generation this run reads, and its group: set by :meth:`generation`
        self.group = GROUP

    async def length(self) -> int:
        """Entries in the stream (0 when there is none): 0 means nothing to roll up."""
        return int(await guarded(self.client.xlen(self.key)))

    async def lease(self, owner: str, ttl_ms: int) -> bool:
        """Take the stream for ``ttl_ms`` unless another run holds it."""
        return bool(await guarded(self.client.set(self.lease_key, owner, nx=True, px=ttl_ms)))

    async def release(self, owner: str) -> None:
        keys, args = encode(UnlockArgs(lock=self.lease_key, owner=owner))
        await guarded(self.scripts.unlock(keys=keys, args=args))

    async def holder(self) -> str | None:
        """Who holds the lease now (None: no one)."""
        owner = await guarded(self.client.get(self.lease_key))
        return None if owner is None else _text(owner)

    async def current_generation(self) -> str | None:
        """This stream's generation, or None if the cache has none (yet, or any more)."""
        current = await guarded(self.client.get(self.generation_key))
        return None if current is None else _text(current)

    async def generation(self) -> str:
        """This stream's generation, starting a new one (and its group, reading from the
        stream's start) when the cache has none; the stream is read through its group from now."""
        current = await self.current_generation()
        if current is None:
            fresh = uuid.uuid4().hex
            if await guarded(self.client.set(self.generation_key, fresh, nx=True)):
                await self._create_group(fresh)
                current = fresh
            elif (current := await self.current_generation()) is None:  # lost again meanwhile
                raise StreamLost(f"{self.key}: the cache lost the stream's generation")
        self.gen, self.group = current, group_of(current)
        return current

    async def _create_group(self, generation: str) -> None:
        """The group of ``generation``, reading from the stream's start (entries at or before
        the durable cursor are acknowledged there without being counted). A stream of an older
        version read through the one ``rollup`` group: that group goes, and with it what it
        had delivered (the new group delivers it again)."""
        try:
            await guarded(
                self.client.xgroup_create(self.key, group_of(generation), id="0", mkstream=True)
            )
        except LedgerProtocolError as e:
            if "BUSYGROUP" not in str(e):
                raise
        with contextlib.suppress(LedgerProtocolError):  # the stream went meanwhile
            await guarded(self.client.xgroup_destroy(self.key, GROUP))

    async def _reopened(self, error: LedgerProtocolError) -> None:
        """After a NOGROUP reply: the stream still has its generation but no group of it (a
        stream of an older version, or one whose group was deleted): make the group. Raises
        :class:`StreamLost` if the generation is gone, ``error`` for anything else."""
        if "NOGROUP" not in str(error):
            raise error
        await self.still_current()
        await self._create_group(self.gen)

    async def still_current(self) -> None:
        """Raises :class:`StreamLost` unless the cache still holds this run's generation."""
        if not self.gen or await self.current_generation() != self.gen:
            raise StreamLost(f"{self.key}: the cache lost generation {self.gen or '?'}")

    async def claim(self, consumer: str, count: int) -> list[Entry]:
        """Every entry left pending by earlier runs (crashed, or cut off by their deadline),
        taken over by ``consumer``: the lease says no one else is working on them."""
        out: list[Entry] = []
        start = "0-0"
        while True:
            call = self.client.xautoclaim
            args = (self.key, self.group, consumer, 0)
            try:
                reply = await guarded(call(*args, start_id=start, count=count))
            except LedgerProtocolError as e:
                await self._reopened(e)
                reply = await guarded(call(*args, start_id=start, count=count))
            start, entries = _text(reply[0]), reply[1]
            out += [(_text(i), f) for i, f in entries if f is not None]
            if start == "0-0":
                return out

    async def read_new(self, consumer: str, count: int) -> list[Entry]:
        """Up to ``count`` entries never delivered to the group before."""
        call = self.client.xreadgroup
        args = (self.group, consumer, {self.key: ">"})
        try:
            reply = await guarded(call(*args, count=count))
        except LedgerProtocolError as e:
            await self._reopened(e)
            reply = await guarded(call(*args, count=count))
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
            await guarded(self.client.xack(self.key, self.group, *ids))

    async def trim(self, cursor: str) -> None:
        """Drop every entry up to ``cursor`` (all applied to the durable ledger), unless the
        cache lost this generation meanwhile: ``cursor`` says nothing about a later one's."""
        await self.still_current()
        await guarded(self.client.xtrim(self.key, minid=after(cursor), approximate=False))

    async def forget_consumers(self, keep: str, idle_ms: int) -> None:
        """Remove consumers (one is made per run) that hold nothing and were idle ``idle_ms``:
        longer than a lease, so no run still uses them (deleting a consumer deletes what it
        holds, and a run that just read might hold entries the listing did not show yet)."""
        try:
            consumers = await guarded(self.client.xinfo_consumers(self.key, self.group))
        except LedgerProtocolError:  # no stream or no group: nothing to forget
            return
        for c in consumers:
            name = _text(c["name"])
            if name != keep and int(c["pending"]) == 0 and int(c["idle"]) > idle_ms:
                await guarded(self.client.xgroup_delconsumer(self.key, self.group, name))


def _text(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
