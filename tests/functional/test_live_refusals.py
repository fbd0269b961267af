"""A change that lifts a refusal reaches every instance within 5 s, not at the next poll.

A disabled tenant's request, or one for a route its tenant may not use, is refused before any
admit, so it never hears from the cache that its copy of the config is stale. Before refusing,
it reads its hierarchy's published version (rate-limited per hierarchy: control/live.py) and is
decided again by the new config. Two gateway instances, each with its own live config over one
config table (moto) and one Valkey (standalone, then a cluster), their table poll pushed out of
reach: an admin disables then enables a tenant, empties then restores a tenant's allowlist of
routes, and each instance follows both ways.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import httpx
import pytest
from moto import mock_aws

from hardcap_core.config import parse_config
from hardcap_core.control.admin import Admin
from hardcap_core.control.live import RECHECK_S, LiveConfig
from hardcap_core.control.publish import LedgerPublisher
from hardcap_core.control.store import ConfigStore
from hardcap_core.gateway.app import create_app
from hardcap_core.ledger import Ledger
from hardcap_core.ledger.connection import connect
from hardcap_core.local.mock_upstream import MockSettings
from tests.stack import KEYS, Mock, config_data

WHO = "local:test"
GOAL_S = 5.0  # the promise for any live change, on every instance
NEVER_S = 3600.0  # the instances' table poll: out of this test's reach


@dataclass
class Instance:
    http: httpx.AsyncClient
    live: LiveConfig
    reads: list[str]  # the hierarchies whose published version this instance read


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0.0, seed=7))
    yield m
    m.stop()


@pytest.fixture
async def stack(
    backend: tuple[str, bool], mock: Mock, client: Any
) -> AsyncIterator[tuple[Admin, list[Instance]]]:
    url, cluster = backend
    file_data = config_data(mock.url, url, **{"gateway.redis_cluster": cluster})
    with mock_aws():
        store = ConfigStore("config", boto3.client("dynamodb", region_name="us-east-1"))
        store.create_table()
        ledger = Ledger(client)

        async def built() -> Ledger:
            return ledger

        admin = Admin(store, file_data, LedgerPublisher(built))
        instances = []
        runtimes: list[Any] = []
        for n in range(2):
            live = LiveConfig(file_data, "test", store, poll_s=NEVER_S)
            live.load()
            own = await connect(url, cluster=cluster)  # each its own, closed with its runtime
            app = create_app(parse_config(file_data), ledger_client=own, live=live)
            gateway = await app.state.runtime.gateway()
            reads: list[str] = []
            live.watch(counted(gateway.ledger.published_config_version, reads))
            http = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url=f"http://gw{n}.test"
            )
            instances.append(Instance(http, live, reads))
            runtimes.append(app.state.runtime)
        try:
            yield admin, instances
        finally:
            for i in instances:
                await i.http.aclose()
            for runtime in runtimes:
                await runtime.aclose()


def counted(
    read: Callable[[str], Awaitable[int]], reads: list[str]
) -> Callable[[str], Awaitable[int]]:
    async def reading(root: str) -> int:
        reads.append(root)
        return await read(root)

    return reading


async def chat(instance: Instance, tenant: str, model: str = "small") -> int:
    reply = await instance.http.post(
        "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"authorization": f"Bearer {KEYS[tenant]}"},
    )
    return reply.status_code


async def until(instance: Instance, tenant: str, status: int, model: str = "small") -> float:
    """Seconds until ``instance`` answers ``tenant``'s request with ``status``, sent back to
    back as a retrying client would; fails past :data:`GOAL_S`."""
    started = time.monotonic()
    while (got := await chat(instance, tenant, model)) != status:
        assert time.monotonic() - started < GOAL_S, f"still {got}, not {status}, after 5 s"
    return time.monotonic() - started


async def test_a_reenabled_tenant_is_served_again_on_every_instance(
    stack: tuple[Admin, list[Instance]],
) -> None:
    admin, instances = stack
    for i in instances:
        assert await chat(i, "open") == 200
    assert all(not i.reads for i in instances)  # an admitted request reads no version

    await admin.disable_tenant(WHO, "open")
    for i in instances:
        await until(i, "open", 403)  # its next admit found the copy stale
    await admin.enable_tenant(WHO, "open")
    for i in instances:
        await until(i, "open", 200)  # its refusal found the copy stale
    assert {root for i in instances for root in i.reads} == {"t:open"}


async def test_a_restored_route_is_served_again_on_every_instance(
    stack: tuple[Admin, list[Instance]],
) -> None:
    admin, instances = stack
    for i in instances:
        assert await chat(i, "beta", "small") == 200
    await admin.update_tenant(WHO, "beta", {"routes": []})
    for i in instances:
        await until(i, "beta", 403, "small")
    await admin.update_tenant(WHO, "beta", {"routes": ["small"]})
    for i in instances:
        await until(i, "beta", 200, "small")
    assert {root for i in instances for root in i.reads} == {"o:acme"}


async def test_refusals_read_the_published_version_at_most_once_a_second(
    stack: tuple[Admin, list[Instance]],
) -> None:
    admin, instances = stack
    one = instances[0]
    await admin.disable_tenant(WHO, "open")
    await until(one, "open", 403)
    one.reads.clear()
    started = time.monotonic()
    for _ in range(50):
        assert await chat(one, "open") == 403
    elapsed = time.monotonic() - started
    assert len(one.reads) <= elapsed / RECHECK_S + 1  # 50 refusals, not 50 reads


async def count(instance: Instance, tenant: str) -> int:
    reply = await instance.http.post(
        "/v1/messages/count_tokens",
        json={"model": "small", "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": KEYS[tenant], "anthropic-version": "2023-06-01"},
    )
    return reply.status_code


async def test_a_restored_route_counts_tokens_again_on_every_instance(
    stack: tuple[Admin, list[Instance]],
) -> None:
    """count_tokens is held to the tenant's routes like a message, and makes no admit."""
    admin, instances = stack
    for i in instances:
        assert await count(i, "beta") == 200
    await admin.update_tenant(WHO, "beta", {"routes": []})
    for i in instances:
        await until(i, "beta", 403, "small")  # chat's admit finds the copy stale
        assert await count(i, "beta") == 403
    await admin.update_tenant(WHO, "beta", {"routes": ["small"]})
    started = time.monotonic()
    for i in instances:
        while (got := await count(i, "beta")) != 200:
            assert time.monotonic() - started < GOAL_S, f"still {got} after 5 s"
