"""ElastiCache IAM auth against a real Valkey: the connection code authenticates as the IAM user
with the signed token, signs a new token when the cached one is too old, and reconnects a
connection before ElastiCache's 12-hour cut-off.

The server stands in for ElastiCache: an ACL user whose only password is the token the provider
will present (ElastiCache checks the signature instead; the client's side is the same AUTH).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import AuthenticationError

from hardcap_core.budgets import Dimension
from hardcap_core.ledger import Admitted, Ledger, iam_auth
from hardcap_core.ledger.connection import connect
from hardcap_core.ledger.iam_auth import AwsCredentials, IamCredentialProvider, auth_token
from hardcap_core.local.valkey import LocalCluster, LocalValkey
from tests.conftest import TENANT, scope

USER = "hardcap-gateway"
CACHE = "hardcap-1a2b3c4d"
ENV = {
    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    "AWS_SESSION_TOKEN": "IQoJb3JpZ2luX2VjEHYa+session/token==",
}
T0 = 1_796_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def expected_token(at: float) -> str:
    return auth_token(
        CACHE,
        USER,
        region="us-east-1",
        credentials=AwsCredentials(
            ENV["AWS_ACCESS_KEY_ID"], ENV["AWS_SECRET_ACCESS_KEY"], ENV["AWS_SESSION_TOKEN"]
        ),
        now=datetime.datetime.fromtimestamp(at, datetime.UTC).replace(tzinfo=None),
    )


@pytest.fixture(scope="module")
def server() -> Iterator[LocalValkey]:
    # A server of its own: the ACL users set here must not leak into the shared one.
    with LocalValkey() as s:
        yield s


@pytest.fixture
async def admin(server: LocalValkey) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(server.url)
    yield c
    await c.execute_command("ACL", "DELUSER", USER)
    await c.aclose()


async def set_password(admin: Any, token: str) -> None:
    """The IAM user accepts exactly this token (resetpass drops any earlier one)."""
    await admin.execute_command(
        "ACL", "SETUSER", USER, "on", "resetpass", f">{token}", "~*", "+@all"
    )


def provider(clock: Clock) -> IamCredentialProvider:
    return IamCredentialProvider(CACHE, USER, region="us-east-1", environ=ENV, clock=clock)


async def test_connects_as_the_iam_user_with_the_token(server: LocalValkey, admin: Any) -> None:
    clock = Clock()
    await set_password(admin, expected_token(T0))
    creds = provider(clock)
    client = await connect(server.url, credential_provider=creds)
    try:
        assert await client.execute_command("ACL", "WHOAMI") == b"hardcap-gateway"
        assert await client.set("k", "v")
        assert creds.signatures == 1
    finally:
        await client.aclose()


async def test_a_wrong_token_is_refused(server: LocalValkey, admin: Any) -> None:
    """Guards the test itself: the server does check what the client sends."""
    clock = Clock()
    await set_password(admin, expected_token(T0 + 1))  # signed a second later: another token
    client = await connect(server.url, credential_provider=provider(clock))
    try:
        with pytest.raises(AuthenticationError):
            await client.ping()
    finally:
        await client.aclose()


async def test_new_connections_reuse_the_token_then_re_sign(
    server: LocalValkey, admin: Any
) -> None:
    clock = Clock()
    creds = provider(clock)
    await set_password(admin, expected_token(T0))
    client = await connect(server.url, credential_provider=creds)
    try:
        # Many connections at once (the pool opens one per call in flight): one signature.
        await asyncio.gather(*(client.execute_command("ACL", "WHOAMI") for _ in range(8)))
        assert await admin.execute_command("CLIENT", "LIST", "USER", USER) != b""
        assert creds.signatures == 1

        # Past the reuse window the cached token is not presented again: the server now wants
        # the token signed at the new time, and only a re-signing provider can give it.
        clock.now += iam_auth.TOKEN_REUSE_S
        await set_password(admin, expected_token(clock.now))
        await admin.execute_command("CLIENT", "KILL", "USER", USER)
        assert await client.execute_command("ACL", "WHOAMI") == b"hardcap-gateway"
        assert creds.signatures == 2
    finally:
        await client.aclose()


async def test_an_old_connection_reconnects_with_a_fresh_token(
    server: LocalValkey, admin: Any
) -> None:
    """ElastiCache drops an IAM-authenticated connection after 12 hours; the client reconnects
    (authenticating again) first. Here the age limit is shortened to a fraction of a second."""
    clock = Clock()
    creds = provider(clock)
    await set_password(admin, expected_token(T0))
    aged = await connect(server.url, credential_provider=creds, max_connection_age_s=0.3)
    young = await connect(server.url, credential_provider=creds)  # the 11-hour default
    try:
        first_aged = await aged.client_id()
        first_young = await young.client_id()
        clock.now += iam_auth.TOKEN_REUSE_S
        await set_password(admin, expected_token(clock.now))  # the old token no longer works
        await asyncio.sleep(0.4)
        # The aged connection reconnected and authenticated with a token signed just now ...
        assert await aged.client_id() != first_aged
        assert await aged.execute_command("ACL", "WHOAMI") == b"hardcap-gateway"
        assert creds.signatures == 2
        # ... the young one kept its authenticated session (the server does not re-check).
        assert await young.client_id() == first_young
    finally:
        await aged.aclose()
        await young.aclose()


async def test_the_environment_turns_iam_auth_on(
    server: LocalValkey, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the template sets is what connect() reads: no argument, only the environment."""
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv(iam_auth.IAM_USER, USER)
    monkeypatch.setenv(iam_auth.IAM_CACHE_NAME, CACHE)
    monkeypatch.setenv(iam_auth.IAM_SERVERLESS, "true")
    # A token is signed for the second it is made in: the server is given the one the code
    # signs now, and connect() (which reads the environment itself) signs its own a moment
    # later; if a second boundary passed in between, they differ: sign and try again (a slow
    # machine crossed one; crossing three in a row would be a real failure).
    for attempt in range(3):
        creds = iam_auth.provider_from_env()
        assert creds is not None
        _, token = creds.get_credentials()
        await set_password(admin, token)
        client = await connect(server.url)
        try:
            who = await client.execute_command("ACL", "WHOAMI")  # the first call connects
        except AuthenticationError:
            if attempt == 2:
                raise
            continue
        finally:
            await client.aclose()
        assert who == b"hardcap-gateway"
        break
    monkeypatch.undo()
    plain = await connect(server.url)  # unset: no credentials, the default user
    try:
        assert await plain.execute_command("ACL", "WHOAMI") == b"default"
    finally:
        await plain.aclose()


async def test_cluster_nodes_authenticate_and_reconnect(valkey_cluster: LocalCluster) -> None:
    clock = Clock()
    creds = provider(clock)
    admins = [aioredis.Redis(port=n.port) for n in valkey_cluster.nodes]

    async def everywhere(token: str) -> None:
        for a in admins:  # ACLs are per node
            await set_password(a, token)

    await everywhere(expected_token(T0))
    client = await connect(
        valkey_cluster.url, cluster=True, credential_provider=creds, max_connection_age_s=0.3
    )
    try:
        assert isinstance(client, RedisCluster)
        keys = [f"k{i}" for i in range(30)]  # spread over the three nodes' slots
        for k in keys:
            await client.set(k, "v")
        owners = {client.get_node_from_key(k).port for k in keys}
        assert len(owners) == 3
        clock.now += iam_auth.TOKEN_REUSE_S
        await everywhere(expected_token(clock.now))
        await asyncio.sleep(0.4)
        for k in keys:
            assert await client.get(k) == b"v"
        assert creds.signatures == 2
    finally:
        await client.aclose()
        for a in admins:
            await a.execute_command("ACL", "DELUSER", USER)
            await a.aclose()


async def test_the_ledgers_script_calls_authenticate_and_reconnect_too(
    server: LocalValkey, admin: Any
) -> None:
    """The ledger's calls go over their own pipelined connection (ledger/pipe.py): it logs in
    as the IAM user with the token, and reconnects with a fresh one once it is old."""
    clock = Clock()
    creds = provider(clock)
    await set_password(admin, expected_token(T0))
    client = await connect(server.url, credential_provider=creds, max_connection_age_s=0.3)
    sc = scope((TENANT, Dimension.TOTAL_TOKENS, 10_000, "day"))
    try:
        ledger = Ledger(client)
        a = await ledger.admit(sc, input_tokens=1, output_estimate=1)
        assert isinstance(a, Admitted)
        listed = await admin.execute_command("CLIENT", "LIST", "USER", USER)
        assert b"cmd=evalsha" in listed  # the pipe, logged in as the IAM user
        clock.now += iam_auth.TOKEN_REUSE_S
        await set_password(admin, expected_token(clock.now))
        await asyncio.sleep(0.4)
        await ledger.settle(a.reservation, input_tokens=1, output_tokens=1)
        assert (await ledger.usage(sc)).rows[0].used == 2
        assert creds.signatures == 2
    finally:
        await client.aclose()
