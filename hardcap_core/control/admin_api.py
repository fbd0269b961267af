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

    return [Mount(PREFIX, routes=[
        r("/tenants", _list_tenants, "GET"),
        r("/tenants", _create_tenant, "POST", 201),
        r("/tenants/{id}", _show_tenant, "GET"),
        r("/tenants/{id}", _update_tenant, "PATCH"),
        r("/tenants/{id}/disable", _disable_tenant, "POST"),
        r("/tenants/{id}/enable", _enable_tenant, "POST"),
        r("/orgs", _list_orgs, "GET"),
        r("/orgs", _create_org, "POST", 201),
        r("/orgs/{id}", _update_org, "PATCH"),
        r("/orgs/{id}/disable", _disable_org, "POST"),
        r("/orgs/{id}/enable", _enable_org, "POST"),
        r("/keys", _list_keys, "GET"),
        r("/keys", _create_key, "POST", 201),
        r("/keys/{id}/rotate", _rotate_key, "POST", 201),
        r("/keys/{id}/revoke", _revoke_key, "POST"),
        r("/budgets", _set_budget, "PUT"),
        r("/budgets/remove", _remove_budget, "POST"),
        r("/rate-limits", _set_rate_limits, "PUT"),
        r("/overrides", _list_overrides, "GET"),
        r("/overrides/{id}", _cancel_override, "DELETE"),
        r("/usage", _usage, "GET"),
        r("/audit", _audit, "GET"),
        r("/config/plan", _plan, "POST"),
        r("/config/apply", _apply, "POST"),
        r("/config/export", _export, "GET"),
    ])]  # fmt: skip


# -- the verbs, from a request ------------------------------------------------------------------


async def _list_tenants(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.list_tenants()


async def _create_tenant(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.create_tenant(who, await _json(request))


async def _show_tenant(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.show_tenant(_id(request))


async def _update_tenant(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.update_tenant(who, _id(request), await _json(request))


async def _disable_tenant(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.disable_tenant(who, _id(request))


async def _enable_tenant(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.enable_tenant(who, _id(request))


async def _list_orgs(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.list_orgs()


async def _create_org(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.create_org(who, await _json(request))


async def _update_org(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.update_org(who, _id(request), await _json(request))


async def _disable_org(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.disable_org(who, _id(request))


async def _enable_org(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.enable_org(who, _id(request))


async def _list_keys(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.list_keys(request.query_params.get("tenant"))


async def _create_key(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.create_key(who, await _json(request))


async def _rotate_key(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.rotate_key(who, _id(request), await _json(request))


async def _revoke_key(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.revoke_key(who, _id(request))


async def _set_budget(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.set_budget(who, await _json(request))


async def _remove_budget(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.remove_budget(who, await _json(request))


async def _set_rate_limits(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.set_rate_limits(who, await _json(request))


async def _list_overrides(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.list_overrides(_flag(request, "all"))


async def _cancel_override(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.cancel_override(who, _id(request))


async def _usage(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    q = request.query_params
    return await admin.usage(q.get("since", "24h"), q.get("until", "now"), q.getlist("tenant"))


async def _audit(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.audit(_int(request, "limit", 100), _float(request, "since"))


async def _plan(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.plan(await _json(request))


async def _apply(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.apply(who, await _json(request))


async def _export(admin: Admin, request: Request, who: str) -> dict[str, Any]:
    return await admin.export()


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


async def _json(request: Request) -> dict[str, Any]:
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


def _id(request: Request) -> str:
    return str(request.path_params["id"])


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "").lower() in ("1", "true", "yes")


def _int(request: Request, name: str, default: int) -> int:
    text = request.query_params.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise InvalidRequest(f"{name} must be a whole number", param=name) from None


def _float(request: Request, name: str) -> float | None:
    text = request.query_params.get(name)
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise InvalidRequest(f"{name} must be epoch seconds", param=name) from None
