"""The hot path's script calls over one pipelined RESP connection per node, parsed by hiredis.

redis-py spends about 250 µs of client CPU on each call here (`bench/results/redis-clients.json`:
pool checkout, retry wrapper, command packing, response callbacks, a connection per call in
flight) against about 60 µs for a bare asyncio protocol; a request makes three or four. On this
path a script call is a packed ``EVALSHA`` and a future that hiredis's parser resolves; the
calls in flight share the connection, their replies come back in order, and while calls are in
flight the ones made in one turn of the event loop go out in one write.

Everything else stays with redis-py, and so do the edges: the URL, credentials and TLS settings
are read off the redis-py client (the TLS context is built by redis-py's own code); a cluster's
slot map is redis-py's; a call that meets ``NOSCRIPT``, ``MOVED``, ``ASK`` or ``TRYAGAIN``, or a
connection that breaks before it is answered, is sent again through redis-py's script object,
which loads the script, follows the redirect or retries as it always has (every script is safe
to send twice: docs/design.md); a script the node does not know is loaded over the pipe first.
Other error replies become redis-py's exception classes, so :func:`.connection.guarded`
translates them as before.

A call not answered within the socket timeout fails alone, with redis-py's TimeoutError (its
tenant's fail mode decides); the calls behind it go on waiting for their own replies, and its
reply, when it comes, is dropped in its place in the order. The call may still have run: an
admit that ran after its "not after" time reserves nothing (ledger/client.py), one that ran in
time but answered late keeps its hold until the hold expires and is charged then, as any
unsettled hold is (docs/design.md, "Failure modes"). The connection is given up, failing every
call on it, only when the server is clearly hung (:data:`HUNG_AFTER`, :data:`MAX_LATE`). A
login the server refuses is one AuthenticationError, not handed back to redis-py (which would
log in again), and the node waits :data:`LOGIN_RETRY_S` before it tries again.
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
from redis.asyncio.connection import RedisSSLContext, SSLConnection
from redis.crc import key_slot
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Replies redis-py's script object handles: an unknown script, a slot that moved or is moving.
HANDED_BACK = ("NOSCRIPT", "MOVED", "ASK", "TRYAGAIN")
# A connection idle this long is checked with a PING before a call (as redis-py's
# health_check_interval does): a cache that dropped it meanwhile (a frozen Lambda environment,
# an idle timeout) costs one round trip, not a failed call.
IDLE_CHECK_S = 30.0
# A server clearly hung: not one byte from it for this many call timeouts while calls wait on
# the connection. A script answers in well under a millisecond, so one late call is a pause (a
# slow script, a fork, a lost packet resent) and fails alone; a whole second timeout of silence
# is a frozen process or a connection that died without a word (a failover, a NAT that forgot
# it), which only a new connection gets past.
HUNG_AFTER = 2.0
# Or this many calls past their deadline and still unanswered: a server that trickles replies
# this far behind is not serving this connection either. Each late call keeps its place in the
# reply order until its reply comes, so this also bounds what a connection holds for them.
MAX_LATE = 256
# After the server refused the login, calls to that node fail at once for this long instead of
# logging in again: a wrong password or token does not mend within a request, a burst would
# otherwise send a failed login per call (handed to redis-py, 16 admits made 64: its own login
# and retries), and the tenant's fail mode answers sooner without the round trip. One second
# still picks up mended credentials (a rotated secret, an IAM policy that propagated) quickly.
LOGIN_RETRY_S = 1.0


def pack(parts: Sequence[Any]) -> bytes:
    """One RESP command: an array of bulk strings (str, int and bytes parts)."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(out)


class Pipe(asyncio.Protocol):
    """One connection: commands written as they come, futures resolved in reply order. One
    timer per connection, not per call: every call has the same timeout and the replies come
    in order, so the calls past their deadline are always the oldest ones."""

    def __init__(self, timeout_s: float) -> None:
        self.reader = hiredis.Reader()
        self.timeout_s = timeout_s
        # Each call in flight in reply order, with the time by which its reply is due. The
        # first `late` of them are past it: their callers were told, their replies are dropped.
        self.waiting: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self.late = 0
        self.outbox: list[bytes] = []  # commands not written yet (see send)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.opened_at = time.monotonic()
        self.used_at = self.opened_at
        # Since when the server has been silent while owing replies (see HUNG_AFTER).
        self.heard_at = self.opened_at
        self._watch: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio's, so no isinstance check here.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.heard_at = time.monotonic()
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if not self.waiting:
                self.close(RedisConnectionError("the cache sent a reply nobody asked for"))
                return
            future, _ = self.waiting.popleft()
            if self.late:
                self.late -= 1
            if not future.done():  # a late call, or a caller cancelled meanwhile: dropped
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
        if idle:
            self.heard_at = now  # the server owed nothing until now
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
        """Fail each call past its deadline, alone; give the connection up once the server is
        clearly hung."""
        self._watch = None
        if self.closed or not self.waiting:
            return
        now, waiting = time.monotonic(), self.waiting
        while self.late < len(waiting) and waiting[self.late][1] <= now:
            future = waiting[self.late][0]
            self.late += 1
            if not future.done():
                late = RedisTimeoutError(f"the cache did not answer within {self.timeout_s:g} s")
                future.set_exception(late)
        hung_s = HUNG_AFTER * self.timeout_s
        if now - self.heard_at >= hung_s:
            self.close(RedisTimeoutError(f"the cache sent nothing for {hung_s:g} s: hung"))
        elif self.late > MAX_LATE:
            self.close(RedisTimeoutError(f"the cache left {self.late} calls unanswered: hung"))
        else:
            due = self.heard_at + hung_s
            if self.late < len(waiting):
                due = min(due, waiting[self.late][1])
            self._watch = asyncio.get_running_loop().call_later(due - now, self._check_late)

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
        self.late = 0
        if self.transport is not None:
            self.transport.abort()


class Node:
    """A cache node's address and how to log in; opens its :class:`Pipe` on first use, and
    again once it broke, or is older than ``max_age_s`` (IAM auth: ElastiCache drops such a
    connection after 12 hours). Credentials are asked of the client's credential provider at
    each opening, never kept here, so a new connection presents the provider's current token
    (an IAM token expires after 15 minutes)."""

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
        # The last refused login and when (see LOGIN_RETRY_S).
        self._refused: tuple[str, float] | None = None

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
            if self._refused is not None and now - self._refused[1] < LOGIN_RETRY_S:
                # The callers that queued behind a refused login learn it here, at no cost.
                raise AuthenticationError(
                    f"the cache at {self.where} refused the login {now - self._refused[1]:.2f}"
                    f" s ago, tried again after {LOGIN_RETRY_S:g} s: {self._refused[0]}"
                )
            if pipe is not None and not pipe.closed:
                if self.max_age_s is None or now - pipe.opened_at < self.max_age_s:
                    # Idle only: a PING tells whether the cache still holds it.
                    try:
                        await self._handshake_reply(pipe, pack(("PING",)))
                        return pipe
                    except (RedisConnectionError, RedisTimeoutError):
                        pass
                pipe.close(RedisConnectionError("connection to the cache replaced"))
            try:
                self.pipe = await self._connect()
            except AuthenticationError as e:
                self._refused = (str(e), time.monotonic())
                raise
            self._refused = None
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
            error = reply_error(reply)  # WRONGPASS, NOAUTH ...: redis-py's AuthenticationError
            if isinstance(error, AuthenticationError):
                raise AuthenticationError(
                    f"the cache at {self.where} refused the login: {reply}"
                ) from error
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
        self._cluster = isinstance(client, RedisCluster)
        self._only: Node | None = None  # a standalone client's node, once made

    def node_for(self, key: str) -> Node:
        if not self._cluster:  # one node, looked up once (an isinstance of redis-py's cluster
            # class runs typing's Protocol check: ~1 % of a request's CPU when done per call)
            if self._only is None:
                pool = self.client.connection_pool
                self._only = self._node(
                    pool.connection_kwargs, issubclass(pool.connection_class, SSLConnection)
                )
            return self._only
        found = self.client.nodes_manager.get_node_from_slot(key_slot(key.encode()))
        node = self.nodes.get((found.host, int(found.port)))
        if node is not None:
            return node
        kwargs = {**found.connection_kwargs, "host": found.host, "port": found.port}
        return self._node(kwargs, issubclass(found.connection_class, SSLConnection))

    def _node(self, kwargs: dict[str, Any], tls: bool) -> Node:
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
        self._only = None


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
        except (RedisTimeoutError, AuthenticationError):
            # Not handed back: redis-py would wait out a second timeout, or log in again with
            # the same credentials (AuthenticationError is a ConnectionError to redis-py).
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
    """The TLS context redis-py's SSLConnection would use for these connection arguments
    (``rediss://``, ``ssl=True``): built by redis-py's own RedisSSLContext, with SSLConnection's
    defaults (verify the certificate and the host name) for the arguments not given."""
    return RedisSSLContext(
        keyfile=kwargs.get("ssl_keyfile"),
        certfile=kwargs.get("ssl_certfile"),
        cert_reqs=kwargs.get("ssl_cert_reqs", "required"),
        include_verify_flags=kwargs.get("ssl_include_verify_flags"),
        exclude_verify_flags=kwargs.get("ssl_exclude_verify_flags"),
        ca_certs=kwargs.get("ssl_ca_certs"),
        ca_data=kwargs.get("ssl_ca_data"),
        ca_path=kwargs.get("ssl_ca_path"),
        check_hostname=kwargs.get("ssl_check_hostname", True),
        min_version=kwargs.get("ssl_min_version"),
        ciphers=kwargs.get("ssl_ciphers"),
        password=kwargs.get("ssl_password"),
    ).get()
