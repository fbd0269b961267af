"""The ledger's script calls over the pipe (hardcap_core/ledger/pipe.py), on real Valkey servers.

What a user would notice: the calls in flight share one connection per node (ElastiCache
counts connections), and nothing about the budget changes at the edges the pipe hands back to
redis-py or handles itself: a connection the server dropped, an idle one it dropped silently,
a script it forgot, a slot that moved, an IAM token that changed, an error reply.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from hardcap_core.budgets import Dimension
from hardcap_core.errors import LedgerProtocolError
from hardcap_core.ledger import Admitted, Ledger
from hardcap_core.ledger import pipe as pipe_module
from hardcap_core.ledger.connection import connect, guarded
from hardcap_core.ledger.pipe import PipedScript, pack, tls_context
from hardcap_core.local.valkey import LocalCluster, LocalValkey
from tests.conftest import TENANT, flush, scope

SC = scope((TENANT, Dimension.TOTAL_TOKENS, 1_000_000, "day"))


@pytest.fixture
async def admin(valkey: LocalValkey) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(valkey.url)
    await c.flushall()
    yield c
    await c.aclose()


async def pair(ledger: Ledger, output: int = 10) -> None:
    """One request's admit and settle."""
    a = await ledger.admit(SC, input_tokens=5, output_estimate=output)
    assert isinstance(a, Admitted)
    await ledger.settle(a.reservation, input_tokens=5, output_tokens=output)


async def used(ledger: Ledger) -> int:
    return (await ledger.usage(SC)).rows[0].used


async def warm(client: Any) -> tuple[Ledger, Any, Any]:
    """A ledger on ``client`` after one request: its node, and the pipe that request opened."""
    ledger = Ledger(client)
    await pair(ledger)
    (node,) = client.pipes.nodes.values()
    return ledger, node, node.pipe


async def connections(admin: Any) -> int:
    """Client connections the server has open, the admin's own included."""
    listed = (await admin.execute_command("CLIENT", "LIST", "TYPE", "normal")).decode()
    return len(listed.strip().splitlines())


async def test_calls_in_flight_share_one_connection(valkey: LocalValkey, admin: Any) -> None:
    client = await connect(valkey.url)
    try:
        ledger = Ledger(client)
        await asyncio.gather(*(pair(ledger) for _ in range(64)))
        assert await used(ledger) == 64 * 15
        assert len(client.pipes.nodes) == 1
        assert await connections(admin) == 2  # the pipe and this admin: no pool of 64
    finally:
        await client.aclose()


async def test_a_connection_the_server_drops_is_replaced(valkey: LocalValkey, admin: Any) -> None:
    client = await connect(valkey.url)
    try:
        ledger, node, first = await warm(client)
        me = await admin.client_id()
        await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        await asyncio.sleep(0.05)  # the pipe hears the close
        assert first.closed and me == await admin.client_id()
        await asyncio.gather(*(pair(ledger) for _ in range(8)))
        assert await used(ledger) == 9 * 15
        assert node.pipe is not first and not node.pipe.closed
    finally:
        await client.aclose()


async def test_a_connection_dropped_while_idle_is_checked_before_a_call(
    valkey: LocalValkey, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache dropped it without a word (a frozen Lambda environment, an idle timeout): the
    PING before the first call after a while finds out, and the call goes on a new connection,
    not through redis-py's slower path."""
    client = await connect(valkey.url)
    try:
        ledger, node, first = await warm(client)
        first.transport.pause_reading()  # it will not hear the close: as if it never came
        await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        monkeypatch.setattr(pipe_module, "IDLE_CHECK_S", 0.0)
        await pair(ledger)
        assert node.pipe is not first
        assert await connections(admin) == 2  # the new pipe and the admin: not redis-py's pool
        assert await used(ledger) == 30
    finally:
        await client.aclose()


async def test_a_script_the_server_forgot_is_loaded_again(valkey: LocalValkey, admin: Any) -> None:
    """A fresh or restarted node knows no scripts: a burst of first calls loads them over the
    pipe, and opens no connection per call."""
    await admin.script_flush()
    client = await connect(valkey.url)
    try:
        ledger = Ledger(client)
        await asyncio.gather(*(pair(ledger) for _ in range(16)))
        await admin.script_flush()
        await pair(ledger)
        assert await used(ledger) == 17 * 15
        assert await connections(admin) == 2
    finally:
        await client.aclose()


async def test_an_error_reply_is_a_protocol_error(valkey: LocalValkey, admin: Any) -> None:
    client = await connect(valkey.url)
    try:
        bad = PipedScript(client.register_script("return redis.error_reply('ERR boom')"),
                          client.pipes)  # fmt: skip
        with pytest.raises(LedgerProtocolError, match="boom"):
            await guarded(bad(keys=["hc:{t}:x"], args=[]))
    finally:
        await client.aclose()


async def test_a_stale_slot_map_is_followed(valkey_cluster: LocalCluster) -> None:
    """The pipe sends a call to the node redis-py's slot map names; a node that answers MOVED
    (the slot migrated) hands the call back, and redis-py follows the redirect."""
    client = await connect(valkey_cluster.url, cluster=True)
    try:
        await flush(client)
        ledger = Ledger(client)
        await pair(ledger)
        manager = client.nodes_manager
        nodes = sorted(manager.nodes_cache.values(), key=lambda n: n.name)
        # The slot map goes stale: every slot owned, as far as the client knows, by the next
        # node along (as after a resharding it has not heard of yet).
        for slot, owners in manager.slots_cache.items():
            manager.slots_cache[slot] = [nodes[(nodes.index(owners[0]) + 1) % len(nodes)]]
        await pair(ledger)  # MOVED: handed back, redis-py follows it and mends its map
        await pair(ledger)
        assert await used(ledger) == 45
        assert len(client.pipes.nodes) == 2  # the owner's pipe, and the wrong node's
    finally:
        await client.aclose()


def test_tls_settings_follow_redis_py() -> None:
    """What redis-py does for ``rediss://`` (and ``?ssl_cert_reqs=none``): verify by default."""
    strict = tls_context({})
    assert strict.verify_mode is ssl.CERT_REQUIRED and strict.check_hostname
    lax = tls_context({"ssl_cert_reqs": "none"})
    assert lax.verify_mode is ssl.CERT_NONE and not lax.check_hostname


def test_commands_are_packed_as_resp_bulk_strings() -> None:
    assert pack(("EVALSHA", "ab", 1, "k", b"\x00v")) == (
        b"*5\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n1\r\n$1\r\nk\r\n$2\r\n\x00v\r\n"
    )


def test_the_pipe_carries_the_calls_under_uvloop(valkey: LocalValkey) -> None:
    """The gateway serves on uvloop (uvicorn's loop="uvloop"), whose transports are not
    asyncio's classes: the calls must still go over the pipe, not fall back to redis-py."""
    import redis
    import uvloop

    admin = redis.Redis.from_url(valkey.url)
    admin.flushall()

    async def run() -> int:
        client = await connect(valkey.url)
        try:
            ledger = Ledger(client)
            await asyncio.gather(*(pair(ledger) for _ in range(32)))
            listed = admin.execute_command("CLIENT", "LIST", "TYPE", "normal").decode()
            assert await used(ledger) == 32 * 15
            return len(listed.strip().splitlines())
        finally:
            await client.aclose()

    try:
        assert uvloop.run(run()) == 2  # the pipe and the admin: no redis-py connections
    finally:
        admin.close()
