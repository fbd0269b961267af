"""The ledger's script calls over the pipe (hardcap_core/ledger/pipe.py), on real Valkey servers.

What a user would notice: the calls in flight share one connection per node (ElastiCache
counts connections), and nothing about the budget changes at the edges the pipe hands back to
redis-py or handles itself: a connection the server dropped, an idle one it dropped silently,
a script it forgot, a slot that moved, an IAM token that changed, an error reply. A late call
fails alone, a hung server fails them all, a refused login is one error from one login, and
the TLS settings are redis-py's (tried through a TLS front: the embedded valkey-server is
built without TLS).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import os
import signal
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from redis.asyncio.connection import SSLConnection
from redis.exceptions import AuthenticationError
from redis.exceptions import TimeoutError as RedisTimeoutError

from hardcap_core.budgets import Dimension
from hardcap_core.errors import LedgerProtocolError, LedgerUnavailable
from hardcap_core.ledger import Admitted, Ledger, Unguarded, iam_auth
from hardcap_core.ledger import pipe as pipe_module
from hardcap_core.ledger.connection import SOCKET_TIMEOUT_S, connect, guarded
from hardcap_core.ledger.iam_auth import IamCredentialProvider
from hardcap_core.ledger.pipe import Node, PipedScript, pack, tls_context
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


# ---------------------------------------------------------------- late calls, a hung server

LATE_S = 1.0  # a pipe's call timeout in the tests below that need a margin on a busy machine
HUNG_S = 0.3  # ... and in those that wait for a server that never answers


def node_at(port: int, timeout_s: float) -> Node:
    """A node's pipe with a short call timeout (connect() gives the ledger 2 s)."""
    return Node({"host": "127.0.0.1", "port": port}, tls=False, timeout_s=timeout_s,
                max_age_s=None)  # fmt: skip


@pytest.fixture
async def own() -> AsyncIterator[tuple[LocalValkey, Any]]:
    """A private server (to freeze, or whose users and stats are the test's own) and an admin
    client of it."""
    with LocalValkey() as server:
        admin = aioredis.Redis(port=server.port, socket_timeout=10)
        try:
            yield server, admin
        finally:
            assert server.proc is not None
            os.kill(server.proc.pid, signal.SIGCONT)  # a frozen server cannot take its SIGTERM
            await admin.aclose()


async def test_a_late_call_times_out_alone_and_its_reply_is_dropped(
    valkey: LocalValkey, admin: Any
) -> None:
    """The call behind a late one waits for, and gets, its own reply; the late reply, when it
    comes, goes to nobody. (BLPOP holds the connection's replies until the test pushes: a call
    exactly as slow as the test wants, where a busy script's length is the machine's.)"""
    node = node_at(valkey.port, LATE_S)
    try:
        late = asyncio.create_task(node.call(pack(("BLPOP", "hc:{t}:late", 0))))
        await asyncio.sleep(LATE_S / 2)
        behind = asyncio.create_task(node.call(pack(("ECHO", "behind"))))
        with pytest.raises(RedisTimeoutError, match="did not answer"):
            await late
        pipe = node.pipe
        assert pipe is not None and not pipe.closed and not behind.done() and pipe.late == 1
        await admin.rpush("hc:{t}:late", "the late reply")
        assert await behind == b"behind"
        assert await node.call(pack(("ECHO", "next"))) == b"next"
        assert node.pipe is pipe and (pipe.late, len(pipe.waiting)) == (0, 0)
    finally:
        node.close()


async def test_a_late_admit_leaves_the_admits_behind_it_alone(own: tuple[LocalValkey, Any]) -> None:
    """The issue's case: the server freezes; the admit sent first is late and goes ahead
    unguarded (fail open), the one sent after it is admitted once the server resumes (it was
    failed too, and ran unguarded, before). The late admit ran after its "not after" time, so
    it holds nothing."""
    server, _ = own
    assert server.proc is not None
    client = await connect(server.url)
    try:
        ledger = Ledger(client)
        await pair(ledger)
        os.kill(server.proc.pid, signal.SIGSTOP)
        first = asyncio.create_task(
            ledger.admit(SC, input_tokens=5, output_estimate=10, fail_open=True)
        )
        await asyncio.sleep(SOCKET_TIMEOUT_S / 2)
        second = asyncio.create_task(
            ledger.admit(SC, input_tokens=5, output_estimate=10, fail_open=True)
        )
        assert isinstance(await first, Unguarded)
        os.kill(server.proc.pid, signal.SIGCONT)
        admitted = await second
        assert isinstance(admitted, Admitted), admitted
        await ledger.settle(admitted.reservation, input_tokens=5, output_tokens=10)
        usage = await ledger.usage(SC)
        assert (usage.rows[0].used, usage.rows[0].reserved, usage.live_reservations) == (30, 0, 0)
    finally:
        await client.aclose()


async def test_a_hung_server_closes_the_connection_and_fails_every_call() -> None:
    """Accepts connections and never answers: the first call fails alone at its deadline; once
    the server has been silent for HUNG_AFTER timeouts the connection closes and the calls on
    it fail then, before their own deadlines."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)  # the kernel completes the handshake; nobody ever reads
        node = node_at(hole.getsockname()[1], HUNG_S)
        try:
            with pytest.raises(RedisTimeoutError, match="did not answer"):
                await node.call(pack(("PING",)))
            pipe = node.pipe
            assert pipe is not None and not pipe.closed  # one late call: not yet hung
            await asyncio.sleep(HUNG_S / 2)
            started = time.monotonic()
            calls = [node.call(pack(("PING",))) for _ in range(3)]
            failed = await asyncio.gather(*calls, return_exceptions=True)
            assert time.monotonic() - started < HUNG_S
            for error in failed:
                assert isinstance(error, RedisTimeoutError) and "sent nothing" in str(error)
            assert pipe.closed and not pipe.waiting
        finally:
            node.close()


async def test_a_connection_keeps_a_bounded_number_of_late_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that falls ever further behind (here: silent, but not yet for long) is given
    up once more than MAX_LATE calls wait past their deadlines."""
    monkeypatch.setattr(pipe_module, "MAX_LATE", 2)
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        node = node_at(hole.getsockname()[1], HUNG_S)
        try:
            late = [asyncio.create_task(node.call(pack(("PING",)))) for _ in range(3)]
            await asyncio.sleep(HUNG_S / 2)
            behind = asyncio.create_task(node.call(pack(("PING",))))
            for error in await asyncio.gather(*late, return_exceptions=True):
                assert isinstance(error, RedisTimeoutError) and "did not answer" in str(error)
            with pytest.raises(RedisTimeoutError, match="left 3 calls unanswered"):
                await behind
            assert node.pipe is not None and node.pipe.closed and not node.pipe.waiting
        finally:
            node.close()


# ---------------------------------------------------------------- a refused login

USER = "hardcap-gateway"


async def failed_logins(admin: Any) -> int:
    return int((await admin.info("stats"))["acl_access_denied_auth"])


async def test_a_refused_login_is_one_error_and_one_login(
    own: tuple[LocalValkey, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong password: a burst of calls gets one clear error each, from one login, none of
    them handed to redis-py (which logs in and retries on its own); calls in the next
    LOGIN_RETRY_S fail without a login; after it, the mended password is used."""
    monkeypatch.setattr(pipe_module, "LOGIN_RETRY_S", 0.5)
    server, admin = own
    await admin.execute_command("ACL", "SETUSER", USER, "on", ">right", "~*", "+@all")
    client = await connect(f"redis://{USER}:wrong@127.0.0.1:{server.port}")
    try:
        ledger = Ledger(client)
        burst = [ledger.admit(SC, input_tokens=5, output_estimate=10) for _ in range(16)]
        for error in await asyncio.gather(*burst, return_exceptions=True):
            assert isinstance(error, LedgerUnavailable), error
            assert isinstance(error.__cause__, AuthenticationError)
            assert "refused the login" in str(error)
        assert await failed_logins(admin) == 1
        await admin.execute_command("ACL", "SETUSER", USER, "resetpass", ">wrong")
        with pytest.raises(LedgerUnavailable, match="refused the login"):
            await ledger.admit(SC, input_tokens=5, output_estimate=10)
        assert await failed_logins(admin) == 1
        await asyncio.sleep(0.5)
        await pair(ledger)
        assert await failed_logins(admin) == 1
        assert await connections(admin) == 2  # the pipe and the admin: none of redis-py's
    finally:
        await client.aclose()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_an_iam_login_is_tried_again_with_the_providers_new_token(
    own: tuple[LocalValkey, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipe keeps no token: after a refusal it asks the credential provider again, which
    signs a new token once the one it reuses is old enough."""
    monkeypatch.setattr(pipe_module, "LOGIN_RETRY_S", 0.2)
    server, admin = own
    env = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret"}

    def provider(clock: Clock) -> IamCredentialProvider:
        return IamCredentialProvider("hc-cache", USER, region="us-east-1", environ=env,
                                     clock=clock)  # fmt: skip

    clock = Clock(1_796_000_000.0)
    creds = provider(clock)
    next_token = provider(Clock(clock.now + iam_auth.TOKEN_REUSE_S)).token()
    await admin.execute_command("ACL", "SETUSER", USER, "on", f">{next_token}", "~*", "+@all")
    client = await connect(server.url, credential_provider=creds)
    try:
        ledger = Ledger(client)
        with pytest.raises(LedgerUnavailable, match="refused the login"):
            await ledger.admit(SC, input_tokens=5, output_estimate=10)
        assert (creds.signatures, await failed_logins(admin)) == (1, 1)
        clock.now += iam_auth.TOKEN_REUSE_S
        await asyncio.sleep(0.2)
        await pair(ledger)
        assert (creds.signatures, await failed_logins(admin)) == (2, 1)
        listed = await admin.execute_command("CLIENT", "LIST", "USER", USER)
        assert b"cmd=evalsha" in listed
    finally:
        await client.aclose()


# ---------------------------------------------------------------- TLS

# What the TLS front serves: TLS 1.2 at most, and one cipher suite.
SERVED_CIPHER = "ECDHE-ECDSA-AES256-GCM-SHA384"


@dataclass(frozen=True)
class Certs:
    folder: str
    ca: str
    cert: str
    key: str


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A throwaway CA, and a certificate for 127.0.0.1 it signed."""
    folder = tmp_path_factory.mktemp("tls")
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def cert(subject: str, public: Any, issuer: str, ca: bool) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer))
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )

    ca = cert("hardcap test CA", ca_key.public_key(), "hardcap test CA", True)
    leaf = cert("127.0.0.1", key.public_key(), "hardcap test CA", False)
    leaf = leaf.add_extension(
        x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
    ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
    pem = serialization.Encoding.PEM
    paths = Certs(str(folder), *(str(folder / n) for n in ("ca.pem", "cert.pem", "key.pem")))
    Path(paths.ca).write_bytes(ca.sign(ca_key, hashes.SHA256()).public_bytes(pem))
    Path(paths.cert).write_bytes(leaf.sign(ca_key, hashes.SHA256()).public_bytes(pem))
    Path(paths.key).write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    # A reset from either side (the pipe closes with one) ends the copy like an end of file.
    with contextlib.suppress(ConnectionError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    sink.close()


class TlsFront:
    """TLS in front of a plain server, as ElastiCache's in-transit encryption looks to a
    client; it notes each handshake it completed (version, cipher)."""

    def __init__(self, port: int, certs: Certs) -> None:
        self.port = port
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(certs.cert, certs.key)
        self.context.maximum_version = ssl.TLSVersion.TLSv1_2
        self.context.set_ciphers(SERVED_CIPHER)
        self.handshakes: list[tuple[str | None, str]] = []
        self.served: set[asyncio.Task[Any]] = set()

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[int]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)
        try:
            yield server.sockets[0].getsockname()[1]
        finally:
            server.close()
            await server.wait_closed()
            if self.served:
                await asyncio.wait(self.served, timeout=5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.served.add(task)
        tls = writer.get_extra_info("ssl_object")
        self.handshakes.append((tls.version(), tls.cipher()[0]))
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.port)
        await asyncio.gather(pump(reader, upstream_writer), pump(upstream_reader, writer))


@pytest.mark.parametrize(
    ("settings", "served"),
    [
        ({"ssl_ca_certs": "{ca}"}, True),
        ({"ssl_ca_certs": "{ca}", "ssl_ciphers": SERVED_CIPHER}, True),
        ({"ssl_ca_certs": "{ca}", "ssl_ciphers": "ECDHE-ECDSA-AES128-GCM-SHA256"}, False),
        ({"ssl_ca_certs": "{ca}", "ssl_min_version": str(int(ssl.TLSVersion.TLSv1_3))}, False),
        ({}, False),  # the certificate is checked against the system's CAs only
        ({"ssl_cert_reqs": "none"}, True),
    ],
    ids=["ca", "cipher", "other-cipher", "min-tls1.3", "no-ca", "unverified"],
)
async def test_a_tls_connection_takes_redis_pys_settings(
    valkey: LocalValkey, admin: Any, certs: Certs, settings: dict[str, str], served: bool
) -> None:
    """``rediss://`` with TLS settings in the URL, as a deployment gives them: the ledger's
    calls go over the pipe's own TLS connection when the settings allow the server's TLS, and
    nowhere when they do not (neither the pipe nor redis-py completes a handshake)."""
    front = TlsFront(valkey.port, certs)
    async with front.serving() as port:
        query = "&".join(f"{k}={v.format(ca=certs.ca)}" for k, v in settings.items())
        client = await connect(f"rediss://127.0.0.1:{port}/?{query}")
        try:
            ledger = Ledger(client)
            if served:
                await pair(ledger)
                assert await used(ledger) == 15
                assert front.handshakes == [("TLSv1.2", SERVED_CIPHER)]  # the pipe's, alone
            else:
                with pytest.raises(LedgerUnavailable):
                    await ledger.admit(SC, input_tokens=5, output_estimate=10)
                assert front.handshakes == []
        finally:
            await client.aclose()


def test_the_tls_context_is_the_one_redis_py_builds(certs: Certs) -> None:
    """Built by redis-py's own code from the same arguments: nothing of it copied here."""

    def facts(c: ssl.SSLContext) -> tuple[Any, ...]:
        ciphers = sorted(x["name"] for x in c.get_ciphers())
        return (c.verify_mode, c.check_hostname, c.minimum_version, c.verify_flags, c.options,
                ciphers, len(c.get_ca_certs()))  # fmt: skip

    tls13, strict = ssl.TLSVersion.TLSv1_3, ssl.VerifyFlags.VERIFY_X509_STRICT
    cases: list[dict[str, Any]] = [
        {},
        {"ssl_cert_reqs": "none"},
        {"ssl_ca_certs": certs.ca, "ssl_min_version": tls13, "ssl_ciphers": SERVED_CIPHER},
        {
            "ssl_ca_data": Path(certs.ca).read_text(),
            "ssl_check_hostname": False,
            "ssl_cert_reqs": "optional",
            "ssl_include_verify_flags": [strict],
        },
        {"ssl_certfile": certs.cert, "ssl_keyfile": certs.key, "ssl_ca_path": certs.folder},
    ]
    for kwargs in cases:
        ours = tls_context(kwargs)
        assert facts(ours) == facts(SSLConnection(**kwargs).ssl_context.get()), kwargs
    assert tls_context({}).verify_mode is ssl.CERT_REQUIRED and tls_context({}).check_hostname
    chosen = tls_context({"ssl_min_version": tls13, "ssl_ciphers": SERVED_CIPHER})
    assert chosen.minimum_version is tls13
    assert SERVED_CIPHER in {c["name"] for c in chosen.get_ciphers()}
    assert "ECDHE-ECDSA-AES128-GCM-SHA256" not in {c["name"] for c in chosen.get_ciphers()}
