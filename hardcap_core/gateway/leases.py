"""The lease endpoints: ``POST /v1/hardcap/leases`` opens one on the caller's scope (a key's, or
a user's when the caller is one), ``GET`` and ``DELETE /v1/hardcap/leases/{id}`` read and close
it. Requests carrying ``x-hardcap-lease: <id>`` then draw from it (:mod:`.pipeline`). The
ledger's side is :mod:`hardcap_core.ledger.leases`; here: the body, the owner, the answer.

Only the lease's own tenant (and user, when it was opened by one) may use, read or close it:
anyone else gets the 404 an unknown id gets. A lease needs the budget server: without it the
answer is 503, whatever the tenant's fail mode (an envelope nobody holds bounds nothing).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hardcap_core.budgets import NANO_USD_PER_USD
from hardcap_core.config.model import Principal
from hardcap_core.errors import InvalidRequest, LedgerUnavailable, ServiceUnavailable
from hardcap_core.gateway.answers import refusal
from hardcap_core.gateway.pipeline import Gateway
from hardcap_core.ledger.leases import LeaseOpened, LeaseOwner, Leases
from hardcap_core.wire.base import WireFormat
from hardcap_core.wire.json_body import loads

T = TypeVar("T")
_FIELDS = frozenset(("tokens", "usd", "ttl_seconds", "parent"))


def owner_of(principal: Principal) -> LeaseOwner:
    """Who owns a lease this principal opens (and who may use one)."""
    return LeaseOwner(principal.tenant_id, principal.user)


def leases_of(gw: Gateway) -> Leases:
    g = gw.config.gateway
    return Leases(gw.ledger, max_depth=g.lease_max_depth)


async def open_lease(gw: Gateway, request: Request, who: Principal, wire: WireFormat) -> Response:
    """``{tokens?, usd?, ttl_seconds, parent?}`` -> ``{id, expires_at, tokens, usd}`` (201), or
    the 429 a request that does not fit gets."""
    body = loads(await gw.read_body(request))
    if not isinstance(body, dict):
        raise InvalidRequest("The body must be a JSON object.")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise InvalidRequest(f"Unknown field '{unknown[0]}'.", param=unknown[0])
    tokens = _number(body, "tokens", int)
    usd = _number(body, "usd", float)
    ttl = _number(body, "ttl_seconds", float)
    if ttl is None:
        raise InvalidRequest("'ttl_seconds' is required.", param="ttl_seconds")
    most = gw.config.gateway.lease_max_ttl_seconds
    if ttl > most:
        raise InvalidRequest(f"'ttl_seconds' is at most {most:g}.", param="ttl_seconds")
    parent = body.get("parent")
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise InvalidRequest("'parent' must be a lease id.", param="parent")
    usd_nusd = None if usd is None else round(usd * NANO_USD_PER_USD)
    result = await _held(
        leases_of(gw).open(
            who.scope, owner_of(who), ttl_s=ttl, tokens=tokens, usd_nusd=usd_nusd, parent=parent
        )
    )
    if not isinstance(result, LeaseOpened):
        raise refusal(result, wire)
    headers = wire.budget_headers(result.budgets, (), result.server_time_ms)
    return JSONResponse(result.to_json(), status_code=201, headers=headers)


async def lease(gw: Gateway, request: Request, who: Principal, wire: WireFormat) -> Response:
    """GET: the lease's envelope, spent, held, remaining; DELETE: close it, answering its last
    state (``remaining`` is what went back)."""
    lease_id = str(request.path_params["lease_id"])
    book = leases_of(gw)
    if request.method == "DELETE":
        state = await _held(book.close(who.scope, owner_of(who), lease_id))
        return JSONResponse({**state.to_json(), "closed": True})
    state = await _held(book.read(who.scope, owner_of(who), lease_id))
    return JSONResponse(state.to_json())


async def _held(call: Awaitable[T]) -> T:
    """``call``'s result; 503 without the budget server, whatever the tenant's fail mode."""
    try:
        return await call
    except LedgerUnavailable as e:
        raise ServiceUnavailable(
            "The budget server is unreachable: no lease can be held or read. Retry shortly."
        ) from e


def _number(body: dict[str, Any], name: str, kind: type[int] | type[float]) -> Any:
    """``body[name]`` as a positive ``kind``, or None when absent."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"'{name}' must be a number.", param=name)
    if kind is int and value != int(value):
        raise InvalidRequest(f"'{name}' must be a whole number.", param=name)
    if value <= 0:
        raise InvalidRequest(f"'{name}' must be positive.", param=name)
    return kind(value)
