"""The admin API: the admin verbs (:class:`hardcap_core.control.admin.Admin`) as JSON routes
under ``/admin/v1``, and the one boundary where their errors become replies.

Who may call it is the caller's business: the routes take an ``authenticate(request)`` that
names the caller for the audit (None: 401). On AWS that is the admin function's URL, whose
AuthType AWS_IAM means Lambda checked a SigV4 signature before the function runs, and the
identity is the IAM principal (``functions/admin/app.py``); under ``hardcap serve`` it is a
bearer admin token (:func:`token_authenticator`). A tenant's API key never authenticates
here: the routes do not look keys up at all.

Errors: ``{"error": {"message", "type", "param", "code"}}`` with 400 (a change that does not
validate: ``param`` names the field), 401, 403, 404, 409 (an id taken, the table kept moving),
503 (the config or usage table unreachable).
"""

from __future__ import annotations

import hmac
import json
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from hardcap_core import env
from hardcap_core.control.admin import Admin
from hardcap_core.control.publish import LedgerPublisher
from hardcap_core.errors import (
    AuthenticationFailed,
    ConfigError,
    ConfigStoreUnavailable,
    DurableStoreUnavailable,
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    ServiceUnavailable,
)
from hardcap_core.gateway.loop_lag import on_lambda
from hardcap_core.ledger import Ledger
from hardcap_core.ledger.connection import connect
from hardcap_core.logs import logger

PREFIX = "/admin/v1"
MAX_BODY_BYTES = 5 * 1024 * 1024  # a whole file's orgs and tenants (a function URL takes 6 MB)
OPERATOR_HEADER = "x-hardcap-operator"  # who the local admin says they are, for the audit
_OPERATOR = re.compile(r"^[A-Za-z0-9_.@+\-]{1,64}$")

Authenticate = Callable[[Request], str | None]
Verb = Callable[[Admin, Request, str], Awaitable[dict[str, Any]]]


def admin_routes(admin: Admin, authenticate: Authenticate) -> list[BaseRoute]:
    """The routes under :data:`PREFIX`, each authenticated by ``authenticate``."""

    def endpoint(verb: Verb, status: int = 200) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            try:
                who = authenticate(request)
                if who is None:
                    raise AuthenticationFailed("Admin credentials required.", code="unauthorized")
                reply = await verb(admin, request, who)
            except GatewayError as e:
                return error_reply(e)
            except (ConfigStoreUnavailable, DurableStoreUnavailable) as e:
                logger.warning("admin call failed: a table is unreachable", extra={"error": str(e)})
                return error_reply(ServiceUnavailable(str(e), code="store_unavailable"))
            except Exception:
                logger.exception("admin call failed", extra={"path": request.url.path})
                return error_reply(GatewayError("Internal error in the admin API."))
            return JSONResponse(reply, status_code=status)

        return serve

    def r(path: str, verb: Verb, method: str, status: int = 200) -> Route:
        return Route(path, endpoint(verb, status), methods=[method])

    A = Admin
    return [Mount(PREFIX, routes=[
        r("/tenants", call(A.list_tenants), "GET"),
        r("/tenants", call(A.create_tenant, _who, _json), "POST", 201),
        r("/tenants/{id}", call(A.show_tenant, _id), "GET"),
        r("/tenants/{id}", call(A.update_tenant, _who, _id, _json), "PATCH"),
        r("/tenants/{id}/disable", call(A.disable_tenant, _who, _id), "POST"),
        r("/tenants/{id}/enable", call(A.enable_tenant, _who, _id), "POST"),
        r("/orgs", call(A.list_orgs), "GET"),
        r("/orgs", call(A.create_org, _who, _json), "POST", 201),
        r("/orgs/{id}", call(A.update_org, _who, _id, _json), "PATCH"),
        r("/orgs/{id}/disable", call(A.disable_org, _who, _id), "POST"),
        r("/orgs/{id}/enable", call(A.enable_org, _who, _id), "POST"),
        r("/keys", call(A.list_keys, _query("tenant")), "GET"),
        r("/keys", call(A.create_key, _who, _json), "POST", 201),
        r("/keys/{id}/rotate", call(A.rotate_key, _who, _id, _json), "POST", 201),
        r("/keys/{id}/revoke", call(A.revoke_key, _who, _id), "POST"),
        r("/budgets", call(A.set_budget, _who, _json), "PUT"),
        r("/budgets/remove", call(A.remove_budget, _who, _json), "POST"),
        r("/rate-limits", call(A.set_rate_limits, _who, _json), "PUT"),
        r("/overrides", call(A.list_overrides, _flag("all")), "GET"),
        r("/overrides/{id}", call(A.cancel_override, _who, _id), "DELETE"),
        r("/usage", call(A.usage, _query("since", "24h"), _query("until", "now"),
                         _queries("tenant")), "GET"),
        r("/audit", call(A.audit, _number("limit", int, 100, "a whole number"),
                         _number("since", float, None, "epoch seconds")), "GET"),
        r("/config/plan", call(A.plan, _json), "POST"),
        r("/config/apply", call(A.apply, _who, _json), "POST"),
        r("/config/export", call(A.export), "GET"),
    ])]  # fmt: skip


# -- the verbs, from a request ------------------------------------------------------------------

# What a verb takes from the request: the caller (``who``), a path or query parameter, the body.
Arg = Callable[[Request, str], Awaitable[Any]]


def call(method: Callable[..., Awaitable[dict[str, Any]]], *args: Arg) -> Verb:
    """The admin verb ``method`` (an :class:`Admin` method) as a route's handler: called with
    ``args`` read from the request, in order. One shape for every route, so a route is one
    line of the table in :func:`admin_routes` (a verb's own checks stay in :class:`Admin`)."""

    async def verb(admin: Admin, request: Request, who: str) -> dict[str, Any]:
        return await method(admin, *[await arg(request, who) for arg in args])

    return verb


def mount_admin(app: Starlette, admin: Admin, token: str) -> bool:
    """Serve the admin routes from ``app`` (a local gateway), authenticated by ``token``.

    Never on Lambda: a gateway function's URL is open to every tenant, and the admin API there
    is its own function behind IAM; a token that reached a gateway function's environment is
    refused (logged) rather than opening the live config to whoever guesses it. Returns
    whether the routes were mounted."""
    if on_lambda():
        logger.error("admin API not mounted: on Lambda it is the admin function's (AWS_IAM)")
        return False
    app.router.routes[:0] = admin_routes(admin, token_authenticator(token))
    return True


def admin_from_env() -> Admin:
    """The admin service as the admin function builds it: the config file ``HARDCAP_CONFIG``
    names, the config table ``HARDCAP_CONFIG_TABLE``, the usage table ``HARDCAP_USAGE_TABLE``
    (optional: no usage, no last use), and the gateways' cache for publishing (the file's
    ``gateway.redis_url`` or ``HARDCAP_REDIS_URL``; without one, gateways learn of a change by
    polling the table). Clients are made on first use: the cache's on the invocation's loop."""
    from hardcap_core.config.loader import load_config, read_data
    from hardcap_core.control.store import ConfigStore
    from hardcap_core.rollup.table import UsageTable

    path = os.environ.get(env.CONFIG_PATH)
    if not path:
        raise ConfigError(f"set {env.CONFIG_PATH} to the path of the config file")
    table = os.environ.get(env.CONFIG_TABLE)
    if not table:
        raise ConfigError(f"set {env.CONFIG_TABLE} to the name of the config table")
    store = ConfigStore(table)
    usage_name = os.environ.get(env.USAGE_TABLE)
    gateway = load_config(path).gateway
    publisher = None
    if gateway.redis_url:
        cache = CacheLedger(gateway.redis_url, gateway.redis_cluster)
        publisher = LedgerPublisher(cache, cache.aclose)
    else:
        logger.warning("no redis_url: admin changes reach gateways by their poll of the table")
    usage = UsageTable(None, usage_name) if usage_name else None
    return Admin(store, read_data(path), publisher, usage)


class CacheLedger:
    """The ledger over one cache client, connected on the first call (on the caller's event
    loop, which the client then belongs to) and kept."""

    def __init__(self, url: str, cluster: bool) -> None:
        self.url = url
        self.cluster = cluster
        self._ledger: Ledger | None = None

    async def __call__(self) -> Ledger:
        if self._ledger is None:
            self._ledger = Ledger(await connect(self.url, cluster=self.cluster))
        return self._ledger

    async def aclose(self) -> None:
        if self._ledger is not None:
            await self._ledger.client.aclose()
            self._ledger = None


def iam_principal(event: Mapping[str, Any]) -> str | None:
    """The ARN of the IAM principal whose SigV4 signature the function URL (AuthType AWS_IAM)
    checked, from the event; None when there is none (a URL without IAM auth)."""
    context = event.get("requestContext")
    authorizer = context.get("authorizer") if isinstance(context, Mapping) else None
    iam = authorizer.get("iam") if isinstance(authorizer, Mapping) else None
    arn = iam.get("userArn") if isinstance(iam, Mapping) else None
    return arn if isinstance(arn, str) and arn.startswith("arn:") else None


def lambda_authenticator(request: Request) -> str | None:
    """The caller of an invocation Mangum serves: the IAM principal of its event."""
    event = request.scope.get("aws.event")
    return iam_principal(event) if isinstance(event, Mapping) else None


def error_reply(error: GatewayError) -> JSONResponse:
    """The admin API's error body."""
    body = {"message": error.message, "type": error.type, "param": error.param,
            "code": error.code}  # fmt: skip
    return JSONResponse({"error": body}, status_code=error.status, headers=error.headers)


def token_authenticator(token: str) -> Authenticate:
    """The local admin API's check: ``Authorization: Bearer <token>``, compared in constant
    time. The caller is ``local:<operator>``, the operator named by the ``X-Hardcap-Operator``
    header (``admin`` without one): whoever holds the token is trusted to say who they are."""
    if len(token) < 16:
        raise ValueError("an admin token of at least 16 characters")
    expected = token.encode()

    def authenticate(request: Request) -> str | None:
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            presented.strip().encode(), expected
        ):
            return None
        operator = request.headers.get(OPERATOR_HEADER, "admin")
        if not _OPERATOR.match(operator):
            raise InvalidRequest(f"{OPERATOR_HEADER} must match {_OPERATOR.pattern}",
                                 param=OPERATOR_HEADER)  # fmt: skip
        return f"local:{operator}"

    return authenticate


async def _who(request: Request, who: str) -> str:
    """The caller, as the route's authenticator named them: for the audit."""
    return who


async def _json(request: Request, who: str) -> dict[str, Any]:
    """The request's JSON object, read up to :data:`MAX_BODY_BYTES`."""
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise PayloadTooLarge(f"The body is more than {MAX_BODY_BYTES} bytes.")
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        raise InvalidRequest("The body is not JSON.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidRequest("The body must be a JSON object.", code="invalid_json")
    return data


async def _id(request: Request, who: str) -> str:
    return str(request.path_params["id"])


def _query(name: str, default: str | None = None) -> Arg:
    async def read(request: Request, who: str) -> str | None:
        return request.query_params.get(name, default)

    return read


def _queries(name: str) -> Arg:
    async def read(request: Request, who: str) -> list[str]:
        return request.query_params.getlist(name)

    return read


def _flag(name: str) -> Arg:
    async def read(request: Request, who: str) -> bool:
        return request.query_params.get(name, "").lower() in ("1", "true", "yes")

    return read


def _number(name: str, kind: Callable[[str], float], default: float | None, what: str) -> Arg:
    """A query parameter as a number of ``kind`` (``int``, ``float``); 400 naming ``what`` it
    must be when it is not one."""

    async def read(request: Request, who: str) -> float | None:
        text = request.query_params.get(name)
        if text is None:
            return default
        try:
            return kind(text)
        except ValueError:
            raise InvalidRequest(f"{name} must be {what}", param=name) from None

    return read
