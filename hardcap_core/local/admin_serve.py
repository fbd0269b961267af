"""The admin API on a local ``hardcap serve``: ``--admin-token`` (or ``HARDCAP_ADMIN_TOKEN``)
mounts ``/admin/v1`` on the gateway, authenticated by that token.

The config table is ``HARDCAP_CONFIG_TABLE``; without one, a table is created in the embedded
DynamoDB ``hardcap serve`` started (and the variable set, so the gateway built next serves the
live config from it). Changes are published through the gateway's own ledger. Not shipped to
Lambda (the artifact leaves ``hardcap_core/local/`` out), and refused there anyway
(:func:`hardcap_core.control.admin_api.mount_admin`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from hardcap_core import env
from hardcap_core.errors import ConfigError

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from hardcap_core.control.admin import Admin
    from hardcap_core.ledger import Ledger

LOCAL_CONFIG_TABLE = "hardcap-config"
T = TypeVar("T")


def local_config_table(embedded: bool) -> str:
    """The config table's name: ``HARDCAP_CONFIG_TABLE``, or one made now in the embedded
    DynamoDB (``embedded``: ``hardcap serve`` started it; its endpoint is in the environment)."""
    name = os.environ.get(env.CONFIG_TABLE)
    if name:
        return name
    if not embedded:
        raise ConfigError(
            f"the admin API needs a config table: set {env.CONFIG_TABLE} (and the DynamoDB "
            "endpoint or AWS credentials), or let `hardcap serve` start its embedded DynamoDB"
        )
    from hardcap_core.control.store import ConfigStore
    from hardcap_core.local.aws import dynamodb_client

    ConfigStore(LOCAL_CONFIG_TABLE, dynamodb_client()).create_table()
    os.environ[env.CONFIG_TABLE] = LOCAL_CONFIG_TABLE
    return LOCAL_CONFIG_TABLE


def local_admin(config_path: str, table: str, app: Starlette) -> Admin:
    """The admin service of a local gateway ``app``: its config file, ``table``, the usage
    table the environment names, and the gateway's ledger to publish changes through."""
    from hardcap_core.config.loader import read_data
    from hardcap_core.control.admin import Admin
    from hardcap_core.control.publish import LedgerPublisher
    from hardcap_core.control.store import ConfigStore
    from hardcap_core.local.aws import dynamodb_client
    from hardcap_core.rollup.table import UsageTable

    runtime: Any = app.state.runtime

    async def ledger() -> Ledger:
        gateway = await runtime.gateway()
        built: Ledger = gateway.ledger
        return built

    usage_name = os.environ.get(env.USAGE_TABLE)
    usage = UsageTable(dynamodb_client(), usage_name) if usage_name else None
    store = ConfigStore(table, dynamodb_client())
    return Admin(store, read_data(config_path), LedgerPublisher(ledger), usage)


def serve_admin(app: Starlette, config_path: str, table: str, token: str) -> bool:
    """Mount the admin API on ``app``; whether it was (never on Lambda)."""
    from hardcap_core.control.admin_api import mount_admin

    return mount_admin(app, local_admin(config_path, table, app), token)


def admin_caller(
    redis_url: str, store: Any, file_data: Mapping[str, Any]
) -> Callable[[Callable[[Admin], Awaitable[T]]], T]:
    """Run admin verbs from synchronous code (tests, benchmarks) as the admin API would: each
    call on a fresh event loop, with its own cache client to publish through, closed after."""
    from hardcap_core.control.admin import Admin
    from hardcap_core.control.publish import LedgerPublisher
    from hardcap_core.ledger import Ledger
    from hardcap_core.ledger.connection import connect

    def call(verb: Callable[[Admin], Awaitable[T]]) -> T:
        async def run() -> T:
            client = await connect(redis_url)
            try:
                ledger = Ledger(client)

                async def built() -> Ledger:
                    return ledger

                return await verb(Admin(store, file_data, LedgerPublisher(built)))
            finally:
                await client.aclose()

        return asyncio.run(run())

    return call
