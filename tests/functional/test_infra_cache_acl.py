"""The cache user the functions connect as cannot empty the cache or list its keys: a FLUSHALL
would hand every tenant back the usage not yet rolled up (docs/design.md, "Losing the cache").

The template's access string is checked for what it denies and for naming none of ElastiCache's
restricted commands (which it would refuse), and the same rules (plus CONFIG and DEBUG, which
ElastiCache withholds from every user) are tried on a real Valkey, standalone and cluster: the
forbidden commands answer NOPERM, and the ledger's scripts, the restore and the rollup's stream
commands all still run as that user.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import redis
import yaml
from moto import mock_aws
from redis.exceptions import NoPermissionError, ResponseError

from hardcap_core import env
from hardcap_core.config import Config, parse_config
from hardcap_core.ledger.connection import connect
from hardcap_core.local.valkey import GATEWAY_ACL, GATEWAY_USER, LocalCluster, LocalValkey
from hardcap_core.rollup.restore import durable_ledger
from hardcap_core.rollup.run import run_rollup
from hardcap_core.rollup.table import UsageTable, create_table
from tests.conftest import flush
from tests.functional.test_infra_template import load_template
from tests.functional.test_rollup import spend, totals
from tests.stack import config_data

# ElastiCache's restricted commands ("Restricted commands", ClientConfig.RestrictedCommands):
# unavailable to every user, and an access string naming one is refused.
RESTRICTED = {"bgrewriteaof", "bgsave", "config", "debug", "migrate", "replicaof", "save",
              "slaveof", "shutdown", "sync"}  # fmt: skip
# DEBUG last: a Valkey refuses it to every user unless enable-debug-command is set (as
# ElastiCache does), before the ACL is consulted; ACL DRYRUN shows the ACL denies it too.
FORBIDDEN = (("FLUSHALL",), ("FLUSHDB",), ("KEYS", "*"), ("CONFIG", "GET", "maxmemory"))
DEBUG = ("DEBUG", "SLEEP", "0")


def access_string() -> list[str]:
    user = load_template()["Resources"]["CacheUser"]["Properties"]
    rules: list[str] = user["AccessString"].split()
    return rules


def test_the_template_user_may_not_empty_the_cache_or_list_its_keys() -> None:
    rules = access_string()
    assert rules[:3] == ["on", "~*", "+@all"]
    assert {"-flushall", "-flushdb", "-keys"} <= set(rules[3:])
    assert not {r.lstrip("+-").split("|")[0] for r in rules} & RESTRICTED
    # Local runs give the gateway the same user, with ElastiCache's own withholding spelled out.
    assert list(GATEWAY_ACL) == [*rules, "-config", "-debug"]


@pytest.fixture
def server(backend: tuple[str, bool], request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("valkey_cluster" if backend[1] else "valkey")


def nodes(server: LocalValkey | LocalCluster) -> list[LocalValkey]:
    return server.nodes if isinstance(server, LocalCluster) else [server]


def test_the_gateways_user_gets_noperm_for_what_empties_or_lists_the_cache(
    server: LocalValkey | LocalCluster,
) -> None:
    for node in nodes(server):
        with redis.Redis.from_url(node.gateway_url) as as_gateway:
            assert as_gateway.execute_command("ACL", "WHOAMI") == GATEWAY_USER.encode()
            as_gateway.ping()
            for command in FORBIDDEN:
                with pytest.raises(NoPermissionError):
                    as_gateway.execute_command(*command)
            with pytest.raises(ResponseError):
                as_gateway.execute_command(*DEBUG)
        with redis.Redis.from_url(node.url) as admin:  # the default user still can
            assert admin.execute_command("CONFIG", "GET", "maxmemory")
            for command in (*FORBIDDEN, DEBUG):
                verdict = admin.execute_command("ACL", "DRYRUN", GATEWAY_USER, *command)
                assert b"no permissions" in verdict, command


@pytest.fixture
def table() -> Iterator[UsageTable]:
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        create_table(client, "usage")
        yield UsageTable(client, "usage")


async def test_scripts_restore_and_rollup_run_as_the_gateways_user(
    server: LocalValkey | LocalCluster,
    backend: tuple[str, bool],
    client: Any,
    table: UsageTable,
) -> None:
    """EVALSHA (admit, settle, usage, hydrate, unlock), the lease, and every stream command
    the rollup sends: XLEN, XGROUP CREATE / DESTROY, XAUTOCLAIM, XREADGROUP, XRANGE, XACK,
    XTRIM, XINFO CONSUMERS."""
    config: Config = parse_config(config_data("http://127.0.0.1:9", server.gateway_url))
    as_gateway = await connect(server.gateway_url, cluster=backend[1])
    try:
        ledger = durable_ledger(as_gateway, config, table)
        done = await spend(ledger, config, "alpha-k", 3)
        assert (await run_rollup(config, as_gateway, table)).applied == 3
        await flush(client)  # the operator, as the default user
        again = await spend(durable_ledger(as_gateway, config, table), config, "alpha-k", 2)
        assert (await run_rollup(config, as_gateway, table)).applied == 2
        assert totals(table, "alpha")["requests"] == 5
        assert totals(table, "alpha")["output_tokens"] == sum(o for _, o in done + again)
    finally:
        await as_gateway.aclose()


def test_serve_connects_its_embedded_valkey_as_the_gateways_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hardcap_core.local.cli import embedded_valkey_if_needed

    # Set, then removed: monkeypatch puts back whatever was there, also after the function
    # under test sets the variable itself.
    monkeypatch.setenv(env.REDIS_URL, "redis://unset")
    monkeypatch.delenv(env.REDIS_URL)
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config_data("http://127.0.0.1:9", None)))
    server = embedded_valkey_if_needed(str(path))
    assert server is not None
    try:
        url = os.environ[env.REDIS_URL]
        assert url == server.gateway_url
        with redis.Redis.from_url(url) as as_gateway, pytest.raises(NoPermissionError):
            as_gateway.flushall()
    finally:
        server.stop()
