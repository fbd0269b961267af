"""ElastiCache IAM authentication: the cache user's password is a short-lived token signed with
the function role's credentials, so nothing long-lived unlocks the cache.

The token is a SigV4 presigned URL of ``http://<cache-name>/?Action=connect&User=<user-id>``
(plus ``&ResourceType=ServerlessCache`` for a serverless cache), service ``elasticache``, valid
for 900 s, with the scheme stripped (AWS, "Authenticating with IAM",
https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/auth-iam.html). It is signed here with
hashlib and hmac rather than botocore, which a cold start would otherwise import for one
signature (tests/unit/test_iam_auth.py proves the two agree byte for byte).

ElastiCache checks the token when a connection authenticates, and drops an IAM-authenticated
connection after 12 hours unless it authenticates again; :func:`reauthenticating` makes pooled
connections reconnect (and so authenticate with a fresh token) before that.

Configured by the environment (set by infra/template.yaml): :data:`IAM_USER` (empty or unset: no
IAM, the URL's own credentials if any), :data:`IAM_CACHE_NAME`, :data:`IAM_SERVERLESS`; the
credentials and region are Lambda's own ``AWS_*`` variables.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from redis.credentials import CredentialProvider

# The ElastiCache user id the functions connect as (IAM users: user id == user name).
IAM_USER = "HARDCAP_REDIS_IAM_USER"
# The serverless cache's name (or a replication group's id): the host of the signed URL.
IAM_CACHE_NAME = "HARDCAP_REDIS_IAM_CACHE_NAME"
# "true" for a serverless cache (signs ResourceType=ServerlessCache), "false" for node-based.
IAM_SERVERLESS = "HARDCAP_REDIS_IAM_SERVERLESS"
# Lambda sets these from the function's role in every execution environment.
ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
SESSION_TOKEN = "AWS_SESSION_TOKEN"
REGION = "AWS_REGION"

SERVICE = "elasticache"
# "The IAM authentication token is valid for 15 minutes" (auth-iam.html): the longest expiry.
TOKEN_EXPIRY_S = 900
# A token is reused for new connections this long, so a burst of connections signs once, and a
# reused token still has 5 minutes left when a connection presents it.
TOKEN_REUSE_S = 600
# "An IAM authenticated connection ... will automatically be disconnected after 12 hours"
# (auth-iam.html): a pooled connection older than this reconnects before its next command.
CONNECTION_MAX_AGE_S = 11 * 3600

_ALGORITHM = "AWS4-HMAC-SHA256"
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _quote(value: str) -> str:
    # RFC 3986 unreserved characters stay; everything else is %XX (SigV4's encoding).
    return quote(value, safe="-_.~")


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


class AwsCredentials:
    """An access key, its secret and (for a role's temporary credentials) the session token.
    A plain class: a dataclass costs a cold start about a millisecond to build."""

    __slots__ = ("access_key_id", "secret_access_key", "session_token")

    def __init__(
        self, access_key_id: str, secret_access_key: str, session_token: str | None = None
    ) -> None:
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.session_token = session_token


def presign_url(
    host: str,
    params: list[tuple[str, str]],
    *,
    region: str,
    service: str,
    credentials: AwsCredentials,
    now: datetime.datetime,
    expires: int,
) -> str:
    """An ``http://`` GET URL of ``host`` with ``params``, presigned with SigV4 query
    authentication exactly as botocore's ``SigV4QueryAuth`` does it: operation parameters first,
    then the X-Amz-* ones, then the signature; the canonical query sorted; the host the one
    signed header; the payload the empty body's hash (the URL is plain http)."""
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    datestamp = amz_date[:8]
    scope = f"{datestamp}/{region}/{service}/aws4_request"
    auth = [
        ("X-Amz-Algorithm", _ALGORITHM),
        ("X-Amz-Credential", f"{credentials.access_key_id}/{scope}"),
        ("X-Amz-Date", amz_date),
        ("X-Amz-Expires", str(expires)),
        ("X-Amz-SignedHeaders", "host"),
    ]
    if credentials.session_token is not None:
        auth.append(("X-Amz-Security-Token", credentials.session_token))
    encoded = [(_quote(k), _quote(v)) for k, v in params + auth]
    query = "&".join(f"{k}={v}" for k, v in encoded)
    canonical_query = "&".join(f"{k}={v}" for k, v in sorted(encoded))
    canonical_request = "\n".join(
        ["GET", "/", canonical_query, f"host:{host}\n", "host", _EMPTY_SHA256]
    )
    string_to_sign = "\n".join(
        [_ALGORITHM, amz_date, scope, hashlib.sha256(canonical_request.encode()).hexdigest()]
    )
    key = _hmac(f"AWS4{credentials.secret_access_key}".encode(), datestamp)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    return f"http://{host}/?{query}&X-Amz-Signature={signature}"


def auth_token(
    cache_name: str,
    user_id: str,
    *,
    region: str,
    credentials: AwsCredentials,
    serverless: bool = True,
    now: datetime.datetime | None = None,
) -> str:
    """The password for ``AUTH <user_id> <token>``: the presigned connect URL without its
    scheme. Cache names are lower case in ElastiCache, and the name is what is signed."""
    params = [("Action", "connect"), ("User", user_id)]
    if serverless:
        params.append(("ResourceType", "ServerlessCache"))
    url = presign_url(
        cache_name.lower(),
        params,
        region=region,
        service=SERVICE,
        credentials=credentials,
        now=now or datetime.datetime.now(datetime.UTC).replace(tzinfo=None),
        expires=TOKEN_EXPIRY_S,
    )
    return url.removeprefix("http://")


def credentials_from(environ: Mapping[str, str]) -> AwsCredentials:
    """The role's credentials as Lambda puts them in the environment."""
    try:
        return AwsCredentials(
            environ[ACCESS_KEY_ID], environ[SECRET_ACCESS_KEY], environ.get(SESSION_TOKEN) or None
        )
    except KeyError as e:
        missing = e.args[0]
        raise RuntimeError(f"ElastiCache IAM auth needs AWS credentials: {missing} is unset") from e


class IamCredentialProvider(CredentialProvider):
    """redis-py's credential provider for an IAM-enabled ElastiCache user: every new connection
    authenticates as ``user_id`` with a token, signed at most once per :data:`TOKEN_REUSE_S`.

    Credentials are read from the environment at each signing, not once, so credentials the
    runtime replaces (a restored snapshot) are picked up."""

    def __init__(
        self,
        cache_name: str,
        user_id: str,
        *,
        region: str,
        serverless: bool = True,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        reuse_s: float = TOKEN_REUSE_S,
    ) -> None:
        self.cache_name = cache_name
        self.user_id = user_id
        self.region = region
        self.serverless = serverless
        self._environ = os.environ if environ is None else environ
        self._clock = clock
        self._reuse_s = reuse_s
        self._token = ""
        self._signed_at = 0.0
        self.signatures = 0  # how many tokens were signed (tests, metrics)

    def token(self) -> str:
        now = self._clock()
        if not self._token or now - self._signed_at >= self._reuse_s:
            when = datetime.datetime.fromtimestamp(now, datetime.UTC).replace(tzinfo=None)
            self._token = auth_token(
                self.cache_name,
                self.user_id,
                region=self.region,
                credentials=credentials_from(self._environ),
                serverless=self.serverless,
                now=when,
            )
            self._signed_at = now
            self.signatures += 1
        return self._token

    def get_credentials(self) -> tuple[str, str]:
        return self.user_id, self.token()

    async def get_credentials_async(self) -> tuple[str, str]:
        return self.get_credentials()


def provider_from_env(environ: Mapping[str, str] | None = None) -> IamCredentialProvider | None:
    """The provider the environment asks for, or None when IAM auth is not configured."""
    env = os.environ if environ is None else environ
    user = env.get(IAM_USER, "")
    if not user:
        return None
    cache_name = env.get(IAM_CACHE_NAME, "")
    region = env.get(REGION, "")
    if not cache_name or not region:
        raise RuntimeError(f"{IAM_USER} is set: {IAM_CACHE_NAME} and {REGION} must be set too")
    serverless = env.get(IAM_SERVERLESS, "true").lower() != "false"
    return IamCredentialProvider(
        cache_name, user, region=region, serverless=serverless, environ=env
    )


# ---------------------------------------------------------------- the 12-hour limit

_AGED: dict[tuple[type[Any], float], type[Any]] = {}


def aged_connection_class(base: type[Any], max_age_s: float = CONNECTION_MAX_AGE_S) -> type[Any]:
    """A subclass of a redis-py asyncio connection class whose connections, once older than
    ``max_age_s`` since they authenticated, disconnect before their next command; the base
    class then reconnects, which authenticates again with a fresh token."""
    cached = _AGED.get((base, max_age_s))
    if cached is not None:
        return cached

    class Reauthenticating(base):  # type: ignore[misc]
        _authenticated_at = 0.0

        async def on_connect_check_health(self, check_health: bool = True) -> None:
            # Stamped before the handshake, whose own AUTH goes through send_packed_command.
            self._authenticated_at = time.monotonic()
            await super().on_connect_check_health(check_health=check_health)

        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            if self.is_connected and time.monotonic() - self._authenticated_at >= max_age_s:
                await self.disconnect()
            await super().send_packed_command(command, check_health=check_health)

    Reauthenticating.__name__ = Reauthenticating.__qualname__ = f"Reauthenticating{base.__name__}"
    _AGED[(base, max_age_s)] = Reauthenticating
    return Reauthenticating


def reauthenticating(client: Any, max_age_s: float = CONNECTION_MAX_AGE_S) -> Any:
    """Make a redis-py asyncio client's future connections re-authenticate before ElastiCache's
    12-hour cut-off: the standalone client's pool, or every node of a cluster client (the
    template its nodes are made from, and the startup nodes already made from it, as redis-py
    itself does for its maintenance-notification settings). Returns the client."""
    nodes_manager = getattr(client, "nodes_manager", None)
    if nodes_manager is None:
        pool = client.connection_pool
        pool.connection_class = aged_connection_class(pool.connection_class, max_age_s)
        return client
    kwargs = nodes_manager.connection_kwargs
    kwargs["connection_class"] = aged_connection_class(kwargs["connection_class"], max_age_s)
    for node in nodes_manager.startup_nodes.values():
        node.connection_class = aged_connection_class(node.connection_class, max_age_s)
    return client
