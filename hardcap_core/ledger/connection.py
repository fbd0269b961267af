"""The budget server's client, standalone or cluster, with sane limits, and the one boundary
where redis-py's errors become Hardcap's (:func:`guarded`).

Built once per process (per Lambda execution environment) and shared by every request.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.credentials import CredentialProvider
from redis.exceptions import (
    ClusterDownError,
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from hardcap_core.errors import LedgerProtocolError, LedgerUnavailable
from hardcap_core.ledger.iam_auth import CONNECTION_MAX_AGE_S, provider_from_env, reauthenticating
from hardcap_core.ledger.pipe import Pipes

T = TypeVar("T")
# What a server that is down, restarting, failing over or too slow looks like to redis-py.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, RedisClusterException, OSError)
# Errors a server answers when it cannot serve now, not because the call is wrong: out of memory
# (a write refused under maxmemory with noeviction), a replica after a failover, a cluster that
# is down or migrating. To a tenant these are the budget server being unavailable, so its fail
# mode decides (closed: 503, open: go ahead), not a 500. redis-py has no class for the others
# (a script running too long, a failed snapshot, too few replicas), so their code decides.
REFUSING = (OutOfMemoryError, ReadOnlyError, ClusterDownError, TryAgainError, MasterDownError)
REFUSING_CODES = ("BUSY", "MISCONF", "NOREPLICAS")

# A script call answers in well under a millisecond; a server that takes seconds is as good as
# down, and the tenant's fail mode (closed: 503, open: go ahead) should decide quickly.
SOCKET_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 2.0
# redis-py's async cluster client refuses (MaxConnectionsError) rather than waits beyond this
# many connections per node; a gateway process under load can have this many calls in flight.
CLUSTER_MAX_CONNECTIONS = 4096
# A standalone client waits for one of this many connections instead of opening one per call
# in flight: a burst of hundreds of requests on a cold process would otherwise open hundreds of
# connections at once, and on a starved machine some connects time out (503s, lost settles).
# A script call holds a connection for well under a millisecond, so 64 serve a busy process.
MAX_CONNECTIONS = 64
RETRIES = 2


class Standalone(aioredis.Redis):
    """redis-py's client, with the pipes the ledger's script calls take (:mod:`.pipe`)."""

    pipes: Pipes | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        if self.pipes is not None:
            self.pipes.close()
        await super().aclose(close_connection_pool)


class Cluster(RedisCluster):
    """redis-py's cluster client, with the pipes the ledger's script calls take."""

    pipes: Pipes | None = None

    async def aclose(self) -> None:
        if self.pipes is not None:
            self.pipes.close()
        await super().aclose()


async def connect(
    url: str,
    *,
    cluster: bool = False,
    credential_provider: CredentialProvider | None = None,
    max_connection_age_s: float = CONNECTION_MAX_AGE_S,
) -> Any:
    """A ready client for ``url`` (``redis://`` or ``rediss://`` for TLS, as on ElastiCache).

    A cluster client loads the slot map now, before the first request: clients that start
    cold under concurrency send to the wrong node and see a burst of MOVED replies.

    With ElastiCache IAM auth configured in the environment (ledger/iam_auth.py), or a
    ``credential_provider`` given, every connection authenticates with the provider's user and
    password, and reconnects (authenticating again) once older than ``max_connection_age_s``:
    ElastiCache drops an IAM-authenticated connection after 12 hours.

    The client carries :class:`.pipe.Pipes` for the ledger's script calls, with the same
    settings (TLS, credentials, timeouts, the 12-hour reconnect).
    """
    provider = credential_provider or provider_from_env()
    common: dict[str, Any] = {
        "socket_timeout": SOCKET_TIMEOUT_S,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "health_check_interval": 30,
        # A pooled connection the server closed (restart, failover, idle timeout) fails once;
        # retrying is safe because every script is idempotent or errs toward holding more:
        # admit and settle by reservation id, extend only over-reserves, usage only reads.
        # Timeouts are not retried: a hung server should meet the tenant's fail mode quickly.
        "retry": Retry(
            ExponentialBackoff(cap=0.25, base=0.02),
            RETRIES,
            supported_errors=(RedisConnectionError,),
        ),
    }
    if provider is not None:
        common["credential_provider"] = provider
    max_age = max_connection_age_s if provider is not None else None
    if not cluster:
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=MAX_CONNECTIONS, timeout=SOCKET_TIMEOUT_S, **common
        )
        standalone = Standalone(connection_pool=pool)
        standalone.auto_close_connection_pool = True  # as Redis.from_pool: it owns the pool
        standalone.pipes = Pipes(standalone, timeout_s=SOCKET_TIMEOUT_S, max_age_s=max_age)
        return reauthenticating(standalone, max_connection_age_s) if provider else standalone
    client = cast(Cluster, Cluster.from_url(url, max_connections=CLUSTER_MAX_CONNECTIONS, **common))
    client.pipes = Pipes(client, timeout_s=SOCKET_TIMEOUT_S, max_age_s=max_age)
    if provider is not None:
        reauthenticating(client, max_connection_age_s)
    try:
        await client.initialize()
    except UNREACHABLE as e:
        await client.aclose()
        raise LedgerUnavailable(f"budget server cluster unreachable at {url}: {e}") from e
    return client


async def guarded(call: Awaitable[T]) -> T:
    """Await a call to the budget server; its failures become :class:`LedgerUnavailable` (could
    not reach it, no answer in time, or it cannot serve now: out of memory, read-only, cluster
    down) or :class:`LedgerProtocolError` (it answered an error about the call: a script bug or
    a version mismatch)."""
    try:
        return await call
    except UNREACHABLE as e:
        raise LedgerUnavailable(f"budget server unreachable: {e}") from e
    except REFUSING as e:
        raise LedgerUnavailable(f"budget server cannot serve now: {e}") from e
    except ResponseError as e:
        if str(e).split(" ", 1)[0] in REFUSING_CODES:
            raise LedgerUnavailable(f"budget server cannot serve now: {e}") from e
        raise LedgerProtocolError(f"budget server error: {e}") from e
