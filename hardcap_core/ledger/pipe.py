"""The hot path's script calls over one pipelined RESP connection per node, parsed by hiredis.

redis-py spends about 250 µs of client CPU on each call here (`bench/results/redis-clients.json`:
pool checkout, retry wrapper, command packing, response callbacks, a connection per call in
flight) against about 60 µs for a bare asyncio protocol; a request makes three or four. On this
path a script call is a packed ``EVALSHA`` and a future that hiredis's parser resolves; the
calls in flight share the connection, their replies come back in order, and while calls are in
flight the ones made in one turn of the event loop go out in one write.

Everything else stays with redis-py, and so do the edges: the URL, credentials and TLS settings
are read off the redis-py client; a cluster's slot map is redis-py's; a call that meets
``NOSCRIPT``, ``MOVED``, ``ASK`` or ``TRYAGAIN``, or a connection that breaks before it is
answered, is sent again through redis-py's script object, which loads the script, follows the
redirect or retries as it always has (every script is safe to send twice: docs/design.md); a
script the node does not know is loaded over the pipe first. Other
error replies become redis-py's exception classes, so :func:`.connection.guarded` translates
them as before. A call not answered within the socket timeout fails with redis-py's
TimeoutError and closes the connection (the server is hung: its fail mode decides quickly).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Sequence
from typing import Any, cast

import hiredis
from redis._parsers.base import BaseParser
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import SSLConnection
from redis.crc import key_slot
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Replies redis-py's script object handles: an unknown script, a slot that moved or is moving.
HANDED_BACK = ("NOSCRIPT", "MOVED", "ASK", "TRYAGAIN")
# A connection idle this long is checked with a PING before a call (as redis-py's
# health_check_interval does): a cache that dropped it meanwhile (a frozen Lambda environment,
# an idle timeout) costs one round trip, not a failed call.
IDLE_CHECK_S = 30.0


def pack(parts: Sequence[Any]) -> bytes:
    """One RESP command: an array of bulk strings (str, int and bytes parts)."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(out)


class Pipe(asyncio.Protocol):
    """One connection: commands written as they come, futures resolved in reply order. A call
    not answered within ``timeout_s`` closes it (one timer per connection, not per call: the
    replies come in order, so only the oldest call in flight can be the first late one)."""

    def __init__(self, timeout_s: float) -> None:
        self.reader = hiredis.Reader()
        self.timeout_s = timeout_s
        # Each call in flight, with the time by which its reply is due.
        self.waiting: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self.outbox: list[bytes] = []  # commands not written yet (see send)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.opened_at = time.monotonic()
        self.used_at = self.opened_at
        self._watch: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio's, so no isinstance check here.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if not self.waiting:
                self.close(RedisConnectionError("the cache sent a reply nobody asked for"))
                return
            future, _ = self.waiting.popleft()
            if not future.done():  # a caller that was cancelled meanwhile: dropped
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(RedisConnectionError(f"connection to the cache lost: {exc or 'closed'}"))

    def send(self, command: bytes) -> asyncio.Future[Any]:
        """Send ``command``: at once on an idle connection; while calls are in flight, the
        commands sent in one turn of the event loop go out together in one write. A socket
        write that wakes the server costs about 90 µs of CPU here, more than the call's own
        work, so a busy process shares them; but deferring a write costs a turn of the loop
        (an extra poll), which a lone call does not pay."""
        if self.closed or self.transport is None:
            raise RedisConnectionError("connection to the cache closed")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        idle = not self.waiting
        now = self.used_at = time.monotonic()
        self.waiting.append((future, now + self.timeout_s))
        if self._watch is None:
            self._watch = loop.call_later(self.timeout_s, self._check_late)
        if idle and not self.outbox:
            self.transport.write(command)
            return future
        if not self.outbox:
            loop.call_soon(self._flush)
        self.outbox.append(command)
        return future

    def _check_late(self) -> None:
        self._watch = None
        if self.closed or not self.waiting:
            return
        late = self.waiting[0][1] - time.monotonic()
        if late <= 0:
            self.close(RedisTimeoutError(f"the cache did not answer within {self.timeout_s:g} s"))
        else:
            self._watch = asyncio.get_running_loop().call_later(late, self._check_late)

    def _flush(self) -> None:
        if self.closed or self.transport is None or not self.outbox:
            return
        data = self.outbox[0] if len(self.outbox) == 1 else b"".join(self.outbox)
        self.outbox.clear()
        self.transport.write(data)

    def close(self, error: Exception) -> None:
        """Fail every call in flight with ``error`` and drop the connection."""
        if self.closed:
            return
        self.closed = True
        if self._watch is not None:
            self._watch.cancel()
        while self.waiting:
            future, _ = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)
        if self.transport is not None:
            self.transport.abort()


class Node:
    """A cache node's address and how to log in; opens its :class:`Pipe` on first use, and
    again once it broke, or is older than ``max_age_s`` (IAM auth: ElastiCache drops such a
    connection after 12 hours, and a new one presents a fresh token)."""

    def __init__(
        self, kwargs: dict[str, Any], *, tls: bool, timeout_s: float, max_age_s: float | None
    ) -> None:
        self.host = kwargs.get("host", "localhost")
        self.port = int(kwargs.get("port", 6379))
        self.where = f"{self.host}:{self.port}"
        self.kwargs = kwargs
        self.ssl = tls_context(kwargs) if tls else None
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s
        self.pipe: Pipe | None = None
        self._opening: asyncio.Lock | None = None

    async def call(self, command: bytes) -> Any:
        """Send ``command`` and wait for its reply (an error reply is returned, not raised)."""
        pipe = self.pipe
        now = time.monotonic()
        if pipe is None or pipe.closed or self._stale(pipe, now):
            pipe = await self._open()
        return await pipe.send(command)

    def _stale(self, pipe: Pipe, now: float) -> bool:
        aged = self.max_age_s is not None and now - pipe.opened_at >= self.max_age_s
        return aged or (not pipe.waiting and now - pipe.used_at >= IDLE_CHECK_S)

    async def _open(self) -> Pipe:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:  # a burst on a cold process opens one connection
            pipe, now = self.pipe, time.monotonic()
            if pipe is not None and not pipe.closed and not self._stale(pipe, now):
                return pipe
            if pipe is not None and not pipe.closed:
                if self.max_age_s is None or now - pipe.opened_at < self.max_age_s:
                    # Idle only: a PING tells whether the cache still holds it.
                    try:
                        await self._handshake_reply(pipe, pack(("PING",)))
                        return pipe
                    except (RedisConnectionError, RedisTimeoutError):
                        pass
                pipe.close(RedisConnectionError("connection to the cache replaced"))
            self.pipe = await self._connect()
            return self.pipe

    async def _connect(self) -> Pipe:
        loop = asyncio.get_running_loop()
        try:
            _, pipe = await asyncio.wait_for(
                loop.create_connection(
                    lambda: Pipe(self.timeout_s), self.host, self.port, ssl=self.ssl
                ),
                self.kwargs.get("socket_connect_timeout") or self.timeout_s,
            )
        except TimeoutError as e:  # not handed back: a second wait would double it
            raise RedisTimeoutError(f"no connection to the cache at {self.where} in time") from e
        except OSError as e:
            raise RedisConnectionError(f"cannot connect to the cache at {self.where}: {e}") from e
        try:
            for command in await self._login():
                await self._handshake_reply(pipe, command)
        except BaseException:
            pipe.close(RedisConnectionError("login to the cache failed"))
            raise
        return pipe

    async def _login(self) -> list[bytes]:
        """AUTH (a credential provider's user and token, or the URL's) and SELECT, as needed."""
        provider = self.kwargs.get("credential_provider")
        if provider is not None:
            credentials = tuple(await provider.get_credentials_async())
        else:
            user, password = self.kwargs.get("username"), self.kwargs.get("password")
            credentials = tuple(c for c in (user, password) if c) if password else ()
        commands = [pack(("AUTH", *credentials))] if credentials else []
        db = int(self.kwargs.get("db") or 0)
        if db:
            commands.append(pack(("SELECT", db)))
        return commands

    async def _handshake_reply(self, pipe: Pipe, command: bytes) -> Any:
        reply = await pipe.send(command)
        if isinstance(reply, hiredis.ReplyError):
            error = reply_error(reply)
            if isinstance(error, ResponseError) and str(reply).startswith(("WRONGPASS", "NOAUTH")):
                raise AuthenticationError(str(reply)) from error
            raise error
        return reply

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.close(RedisConnectionError("the client was closed"))
            self.pipe = None


class Pipes:
    """The nodes of one redis-py client (standalone: one; cluster: each primary a call's slot
    maps to, by redis-py's slot map), with the client's own connection settings."""

    def __init__(self, client: Any, *, timeout_s: float, max_age_s: float | None) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s
        self.nodes: dict[tuple[str, int], Node] = {}

    def node_for(self, key: str) -> Node:
        if isinstance(self.client, RedisCluster):
            found = self.client.nodes_manager.get_node_from_slot(key_slot(key.encode()))
            kwargs = {**found.connection_kwargs, "host": found.host, "port": found.port}
            tls = issubclass(found.connection_class, SSLConnection)
        else:
            pool = self.client.connection_pool
            kwargs, tls = pool.connection_kwargs, issubclass(pool.connection_class, SSLConnection)
        where = (kwargs.get("host", "localhost"), int(kwargs.get("port", 6379)))
        node = self.nodes.get(where)
        if node is None:
            timeout_s = kwargs.get("socket_timeout") or self.timeout_s
            node = self.nodes[where] = Node(
                kwargs, tls=tls, timeout_s=timeout_s, max_age_s=self.max_age_s
            )
        return node

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()
        self.nodes.clear()


class PipedScript:
    """A registered script (:class:`.scripts.Script`) called over the node's pipe; redis-py's
    script object (``slow``) takes the calls this path hands back."""

    def __init__(self, slow: Any, pipes: Pipes) -> None:
        self.slow = slow
        self.pipes = pipes

    @property
    def sha(self) -> str:
        sha: str = self.slow.sha  # redis-py's: it updates it when it loads the script again
        return sha

    async def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        # A script's keys share one hash slot; one without keys may run on any node.
        node = self.pipes.node_for(keys[0] if keys else "")
        command = pack(("EVALSHA", self.slow.sha, len(keys), *keys, *args))
        try:
            reply = await node.call(command)
            if isinstance(reply, hiredis.ReplyError) and str(reply).startswith("NOSCRIPT"):
                # A fresh node (a restart, a failover, a new process's first calls): load it
                # here, or a cold burst would open a redis-py connection per call.
                await node.call(pack(("SCRIPT", "LOAD", self.slow.script)))
                reply = await node.call(command)
        except RedisTimeoutError:
            raise
        except RedisConnectionError:
            # Broken before it was answered (it may have run: every script is safe twice).
            return await self.slow(keys=keys, args=args)
        if isinstance(reply, hiredis.ReplyError):
            if str(reply).startswith(HANDED_BACK):
                return await self.slow(keys=keys, args=args)
            raise reply_error(reply)
        return reply


def reply_error(reply: hiredis.ReplyError) -> Exception:
    """redis-py's exception for an error reply (its classes: OOM, READONLY, BUSY ...)."""
    error: Exception = BaseParser.parse_error(str(reply))  # type: ignore[no-untyped-call]
    return error


def tls_context(kwargs: dict[str, Any]) -> ssl.SSLContext:
    """The TLS settings redis-py would use for these connection arguments (``rediss://``)."""
    reqs = kwargs.get("ssl_cert_reqs", "required")
    modes = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
    mode: ssl.VerifyMode = modes[reqs] if isinstance(reqs, str) else reqs
    context = ssl.create_default_context(
        cafile=kwargs.get("ssl_ca_certs"),
        capath=kwargs.get("ssl_ca_path"),
        cadata=kwargs.get("ssl_ca_data"),
    )
    context.check_hostname = bool(kwargs.get("ssl_check_hostname", True)) and mode != ssl.CERT_NONE
    context.verify_mode = mode
    if kwargs.get("ssl_certfile"):
        context.load_cert_chain(
            kwargs["ssl_certfile"], kwargs.get("ssl_keyfile"), kwargs.get("ssl_password")
        )
    return context
