"""Stored Responses, owned per tenant: what ``store`` keeps, what ``previous_response_id``
loads, and the endpoints that read them (``GET``/``DELETE /v1/responses/{id}``,
``/input_items``, ``/cancel``).

The gateway keeps the responses itself (:mod:`hardcap_core.ledger.stored_responses`), on its
own cache, never the provider's: every request goes upstream by translation with its whole
conversation in it, so what the provider bills is input the gateway counted. A
``previous_response_id`` is looked up for the caller's tenant and user only; one the gateway
never served them is a 404 (``previous_response_not_found``) before admission, which costs
nothing. The endpoints call no upstream and charge nothing.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hardcap_core.chat import ChatRequest
from hardcap_core.config import Config, Principal, Route
from hardcap_core.errors import InvalidRequest, LedgerUnavailable, MethodNotAllowed, NotFound
from hardcap_core.ledger import Ledger
from hardcap_core.ledger.stored_responses import Owner, StoredResponse, StoredResponses
from hardcap_core.logs import logger
from hardcap_core.wire import json_body
from hardcap_core.wire.openai_responses_request import ResponsesRequest, parse_responses_request

# What a response id may be (the gateway makes `resp_<hex>`); anything else names none.
RESPONSE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
PREVIOUS = "previous_response_id"
MAX_LIST = 100  # input_items: the most a page may hold (the API's limit)
DEFAULT_LIST = 20


def owner_of(principal: Principal) -> Owner:
    """Who a caller is to its stored responses: its tenant, and its user if it is one (a key
    with no user level reads what keys of its tenant stored, never a user's)."""
    return Owner(principal.scope, principal.tenant_id, principal.user, principal.key_id)


class Keeper:
    """Keeps one response: :meth:`keep` (sync, as the reply's final object is made) decides
    whether it fits; :meth:`write` (before the reply's last bytes go out) stores it."""

    def __init__(
        self,
        store: StoredResponses,
        owner: Owner,
        items: tuple[dict[str, Any], ...],
        previous: str | None,
    ) -> None:
        self.store = store
        self.owner = owner
        self.items = items
        self.previous = previous
        self._record: bytes | None = None
        self._id = ""

    def keep(self, response: dict[str, Any]) -> bool:
        response["previous_response_id"] = self.previous
        response["store"] = True
        record = self.store.record(self.owner, response, self.items)
        if record is None:  # past gateway.stored_response_max_bytes: served, not kept
            response["store"] = False
            return False
        self._record, self._id = record, str(response["id"])
        return True

    async def write(self) -> None:
        record, self._record = self._record, None
        if record is None:
            return
        try:
            await self.store.put(self.owner, self._id, record)
        except LedgerUnavailable as e:
            # The reply was served and charged; only its later reads will not find it.
            logger.warning("stored response not kept", extra={"id": self._id, "error": str(e)})


class Stored:
    """The stored Responses of every tenant, on the ledger's cache client."""

    def __init__(self, config: Config, ledger: Ledger) -> None:
        g = config.gateway
        self.config = config
        self.store = StoredResponses(
            ledger.client,
            ledger.keys,
            ttl_s=g.stored_response_ttl_seconds,
            max_bytes=g.stored_response_max_bytes,
        )

    async def parse(
        self, raw: bytes, caller: Principal, *, counting: bool = False
    ) -> ResponsesRequest:
        """A Responses body, with the conversation its ``previous_response_id`` names (the
        caller's own, or a 404) ahead of its input."""
        earlier: list[dict[str, Any]] | None = None
        if PREVIOUS.encode() in raw:  # only then is the body read twice
            body = json_body.loads(raw)
            previous = body.get(PREVIOUS) if isinstance(body, dict) else None
            if previous is not None:
                route = self._route(body.get("model"))
                earlier = [] if route is None else await self._earlier(previous, route, caller)
        return parse_responses_request(raw, counting=counting, earlier=earlier)

    def continues(self, raw: bytes) -> bool:
        """Whether an OpenAI body (a quote's: chat or Responses) is a Responses one naming a
        ``previous_response_id``."""
        if PREVIOUS.encode() not in raw:
            return False
        body = json_body.loads(raw)
        return (
            isinstance(body, dict)
            and "input" in body
            and "messages" not in body
            and body.get(PREVIOUS) is not None
        )

    def keeping(self, chat: ChatRequest, route: Route, caller: Principal) -> ChatRequest:
        """``chat`` with what keeps its response, when it is a Responses request with
        ``store`` (true unless it says false) on a route that keeps them."""
        if not isinstance(chat, ResponsesRequest) or not route.store_responses:
            return chat
        if chat.echo.get("store", True) is False:
            return chat
        items = tuple(_with_id(item) for item in chat.items)
        previous = chat.echo.get(PREVIOUS)
        keeper = Keeper(self.store, owner_of(caller), items, previous)
        return dataclasses.replace(chat, keeper=keeper)

    async def answer(self, request: Request, caller: Principal) -> Response:
        """``GET``/``DELETE /v1/responses/{id}``, ``GET .../input_items``, ``POST .../cancel``:
        for the tenant (and user) that made the response only; a 404 for anyone else."""
        response_id = request.path_params["response_id"]
        verb = request.path_params.get("verb")
        method = request.method
        if verb not in (None, "input_items", "cancel"):
            raise NotFound(f"No route {request.url.path}", code="not_found")
        allowed = {None: ("GET", "DELETE"), "input_items": ("GET",), "cancel": ("POST",)}[verb]
        if method not in allowed:
            raise MethodNotAllowed(
                f"{method} is not allowed on {request.url.path}; use {', '.join(allowed)}."
            )
        if request.query_params.get("stream", "false").lower() != "false":
            raise InvalidRequest(
                "'stream': a stored response is returned whole here, not replayed as events.",
                param="stream",
            )
        owner = owner_of(caller)
        found = await self._find(owner, response_id)
        if verb is None and method == "DELETE":
            if not await self.store.delete(owner, response_id):
                raise _not_found(response_id)
            return JSONResponse({"id": response_id, "object": "response", "deleted": True})
        if verb == "cancel":
            # A response the gateway answered while its request lasted is over by the time its
            # id is known: only background responses can be cancelled, and none is served.
            raise InvalidRequest(
                "Only responses created with background=true can be cancelled.",
                code="invalid_request_error",
            )
        if verb == "input_items":
            return JSONResponse(_page(found.input, request.query_params))
        return JSONResponse(found.response)

    async def _find(self, owner: Owner, response_id: str) -> StoredResponse:
        found = None
        if RESPONSE_ID.fullmatch(response_id):
            found = await self.store.get(owner, response_id)
        if found is None:
            raise _not_found(response_id)
        return found

    async def _earlier(
        self, previous: Any, route: Route, caller: Principal
    ) -> list[dict[str, Any]]:
        if not isinstance(previous, str) or not previous:
            raise InvalidRequest(f"'{PREVIOUS}' must be a non-empty string.", param=PREVIOUS)
        if not route.store_responses:
            raise InvalidRequest(
                f"'{PREVIOUS}': the model '{route.name}' keeps no responses here "
                "(store_responses: false); send the whole conversation in 'input'.",
                param=PREVIOUS,
            )
        found = None
        if RESPONSE_ID.fullmatch(previous):
            found = await self.store.get(owner_of(caller), previous)
        if found is None:
            raise NotFound(
                f"Previous response with id '{previous}' not found.",
                param=PREVIOUS,
                code="previous_response_not_found",
            )
        output = found.response.get("output") or []
        return [*found.input, *(item for item in output if isinstance(item, dict))]

    def _route(self, model: Any) -> Route | None:
        return self.config.routes.get(model) if isinstance(model, str) else None


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", code="not_found")


def _with_id(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as it is listed: with an id (the API gives every item one)."""
    if isinstance(item.get("id"), str):
        return item
    prefix = "msg" if item.get("type", "message") == "message" else "item"
    return {"id": f"{prefix}_{uuid.uuid4().hex}", **item}


def _page(items: list[dict[str, Any]], query: Any) -> dict[str, Any]:
    """One page of input items, as the API lists them: ``order`` desc (its default) or asc,
    ``after`` an item id, ``limit`` 1 to 100."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' must be asc or desc.", param="order")
    raw_limit = query.get("limit", str(DEFAULT_LIST))
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST:
        raise InvalidRequest(f"'limit' must be an integer from 1 to {MAX_LIST}.", param="limit")
    limit = int(raw_limit)
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise InvalidRequest(f"'after': no input item '{after}'.", param="after")
        ordered = ordered[ids.index(after) + 1 :]
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0].get("id") if data else None,
        "last_id": data[-1].get("id") if data else None,
        "has_more": len(ordered) > limit,
    }
