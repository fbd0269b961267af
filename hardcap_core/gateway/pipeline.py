"""The request path: authenticate -> model allowlist -> admit -> forward -> count -> settle.

:class:`Gateway` holds what one process builds once (config, ledger, provider client,
estimators) and serves each endpoint. It raises :class:`GatewayError`; ``app.py`` turns those
into OpenAI-shaped responses in one place.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hardcap_core.auth import bearer_token
from hardcap_core.budgets import NANO_USD_PER_USD, Dimension
from hardcap_core.config import Config, Principal, Route
from hardcap_core.errors import (
    AuthenticationFailed,
    InvalidRequest,
    LedgerUnavailable,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ServiceUnavailable,
    TooManyRequests,
)
from hardcap_core.gateway.meter import Meter, MeterSettings
from hardcap_core.gateway.relay import StreamRelay
from hardcap_core.gateway.response import RelayResponse
from hardcap_core.ledger.client import (
    Admitted,
    BudgetState,
    Ledger,
    Refusal,
    Refused,
    Unguarded,
    UsageRow,
)
from hardcap_core.ledger.estimators import (
    Estimator,
    FixedEstimator,
    MaxTokensEstimator,
    SharedP95Estimator,
)
from hardcap_core.logs import logger
from hardcap_core.providers.openai_compat import Upstream
from hardcap_core.tokens import input_tokens, message_output_tokens
from hardcap_core.wire.headers import budget_headers
from hardcap_core.wire.openai_chat import ChatRequest, parse_chat_request

DEADLINE_MARGIN_S = 3.0  # end and settle a stream this long before Lambda's timeout


@dataclass(frozen=True, slots=True)
class Admission:
    meter: Meter
    headers: dict[str, str]


class Gateway:
    def __init__(self, config: Config, ledger: Ledger, upstream: Upstream) -> None:
        self.config = config
        self.ledger = ledger
        self.upstream = upstream
        self.estimators = {name: self._estimator(r) for name, r in config.routes.items()}
        g = config.gateway
        self.meter_settings = MeterSettings(
            step=g.extend_step_tokens,
            within=g.extend_when_within,
            guard=g.truncate_guard_tokens,
            guard_s=g.truncate_guard_ms / 1000,
            heartbeat_s=g.reservation_ttl_seconds / 3,
        )

    def _estimator(self, route: Route) -> Estimator:
        kind = route.estimator.kind
        if kind == "fixed":
            return FixedEstimator(route.estimator.fixed_tokens or 1)
        if kind == "p95":
            return SharedP95Estimator(self.ledger, min_samples=route.estimator.min_samples)
        return MaxTokensEstimator()

    # -- endpoints ------------------------------------------------------------------------------

    def authenticate(self, request: Request) -> Principal:
        key = bearer_token(request.headers.get("authorization"))
        if not key:
            raise AuthenticationFailed(
                "Missing API key: send it as 'Authorization: Bearer <key>'.", code="missing_api_key"
            )
        principal = self.config.authenticate(key)
        if principal is None:
            raise AuthenticationFailed("Incorrect API key provided.")
        return principal

    async def chat_completions(self, request: Request, principal: Principal) -> Response:
        raw = await self._read_body(request)
        chat = parse_chat_request(raw)
        route = self._route(chat.model, principal)
        limit = route.max_output_tokens
        if chat.max_tokens is not None and chat.max_tokens > limit:
            raise InvalidRequest(
                f"'{chat.max_tokens_field}' is {chat.max_tokens}; the most this model allows "
                f"here is {limit}.",
                param=chat.max_tokens_field,
            )
        max_tokens = chat.max_tokens or limit
        prompt = input_tokens(chat.body, self.config.gateway.chars_per_token)
        admission = await self._admit(principal, route, chat, prompt, max_tokens)
        meter = admission.meter
        if self.config.gateway.log_prompts:  # opt-in only: prompts may hold personal data
            logger.info("prompt", extra={"route": route.name, "messages": chat.body["messages"]})
        body = dict(chat.body, model=route.model)
        body.pop("max_tokens", None)
        body.pop("max_completion_tokens", None)
        if not chat.stream:
            return await self._complete(route, chat, body, meter, admission.headers, max_tokens)

        body[chat.max_tokens_field] = max_tokens
        body["stream_options"] = {**(chat.body.get("stream_options") or {}), "include_usage": True}
        relay = StreamRelay(
            self.upstream.stream(route, body),
            meter,
            public_model=route.name,
            include_usage=chat.include_usage,
            chars_per_token=self.config.gateway.chars_per_token,
            deadline=_deadline(request),
            log_completion=self.config.gateway.log_prompts,
        )
        try:
            await relay.open()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await relay.close(upstream_failed=True)
            raise
        return RelayResponse(relay, admission.headers)

    async def usage(self, principal: Principal) -> Response:
        usage = await self._ledger_call(self.ledger.usage(principal.scope))
        rows = [_usage_row(row) for row in usage.rows]
        states = [BudgetState(r.budget, r.remaining, r.reset_ms) for r in usage.rows]
        return JSONResponse(
            {
                "object": "hardcap.usage",
                "tenant": principal.tenant_id,
                "key": principal.key_id,
                "org": principal.org_id,
                "live_reservations": usage.live_reservations,
                "budgets": rows,
            },
            headers=budget_headers(states, (), usage.server_time_ms),
        )

    def models(self, principal: Principal) -> Response:
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": route.upstream.name}
            for name, route in self.config.routes.items()
            if principal.allows(name)
        ]
        return JSONResponse({"object": "list", "data": data})

    async def headers_for(self, principal: Principal) -> dict[str, str]:
        """Budget headers for an error answered before admission (best effort)."""
        try:
            usage = await self.ledger.usage(principal.scope)
        except LedgerUnavailable:
            return {}
        states = [BudgetState(r.budget, r.remaining, r.reset_ms) for r in usage.rows]
        return budget_headers(states, (), usage.server_time_ms)

    # -- steps ------------------------------------------------------------------------------------

    async def _read_body(self, request: Request) -> bytes:
        cap = self.config.gateway.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > cap:
            raise PayloadTooLarge(f"The request body is larger than {cap} bytes.")
        body = b""
        async for part in request.stream():
            body += part
            if len(body) > cap:
                raise PayloadTooLarge(f"The request body is larger than {cap} bytes.")
        return body

    def _route(self, model: str, principal: Principal) -> Route:
        route = self.config.routes.get(model)
        if route is None:
            raise NotFound(f"The model '{model}' does not exist.", param="model")
        if not principal.allows(model):
            raise PermissionDenied(f"This key may not use the model '{model}'.", param="model")
        return route

    async def _admit(
        self, principal: Principal, route: Route, chat: ChatRequest, prompt: int, max_tokens: int
    ) -> Admission:
        truncate = route.policy == "truncate"
        estimator = self.estimators[route.name]
        if route.policy == "count_after":
            estimate = 1  # the baseline: the budget sees nothing of the reply until it ends
        elif chat.stream:
            estimate = await self._ledger_call(estimator.estimate(route.name, max_tokens))
        else:
            estimate = max_tokens  # a reply that cannot be cut is capped at what is reserved
        least = min(route.min_output_reservation, estimate) if truncate else estimate
        result = await self._ledger_call(
            self.ledger.admit(
                principal.scope,
                input_tokens=prompt,
                output_estimate=estimate,
                min_output=least,
                prices=route.prices,
                fail_open=principal.fail_mode == "open",
            )
        )
        meter_args: dict[str, Any] = {
            "input_estimate": prompt,
            "estimator": estimator,
            "route": route.name,
            "prices": route.prices,
        }
        settings = self.meter_settings if truncate else _allow(self.meter_settings, route.policy)
        if isinstance(result, Refused):
            raise _refusal(result)
        if isinstance(result, Unguarded):
            logger.warning(
                "budget server unreachable; tenant fails open",
                extra={"tenant": principal.tenant_id, "route": route.name},
            )
            meter = Meter(self.ledger, principal.scope, None, settings, **meter_args)
            return Admission(meter, {"x-hardcap-budget": "unenforced"})
        assert isinstance(result, Admitted)
        meter = Meter(self.ledger, principal.scope, result.reservation, settings, **meter_args)
        return Admission(meter, budget_headers(result.budgets, result.rates, result.server_time_ms))

    async def _complete(
        self,
        route: Route,
        chat: ChatRequest,
        body: dict[str, Any],
        meter: Meter,
        headers: dict[str, str],
        max_tokens: int,
    ) -> Response:
        reserved = meter.reserved if meter.reservation else max_tokens
        body[chat.max_tokens_field] = reserved if route.policy == "truncate" else max_tokens
        try:
            data = await self.upstream.complete(route, body)
        except BaseException:
            # The provider did not answer: nothing was generated, nothing is charged.
            await meter.settle(input_tokens=0, output_tokens=0, truncated=True)
            raise
        usage = data.get("usage") or {}
        out = usage.get("completion_tokens")
        if not isinstance(out, int):
            cpt = self.config.gateway.chars_per_token
            out = sum(
                message_output_tokens(c.get("message") or {}, cpt) for c in data.get("choices", [])
            )
        prompt = usage.get("prompt_tokens")
        await meter.settle(
            input_tokens=prompt if isinstance(prompt, int) else None,
            output_tokens=out,
            truncated=False,
        )
        data["model"] = route.name
        if self.config.gateway.log_prompts:
            logger.info("completion", extra={"route": route.name, "choices": data.get("choices")})
        if meter.final_budgets:
            headers = {**headers, **budget_headers(meter.final_budgets, (), _now_ms())}
        return Response(json.dumps(data), media_type="application/json", headers=headers)

    async def _ledger_call(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except LedgerUnavailable as e:
            logger.warning("budget server unreachable", extra={"error": str(e)})
            raise ServiceUnavailable(
                "The budget server is unreachable, and this tenant fails closed. Retry shortly."
            ) from e


def _allow(s: MeterSettings, policy: str) -> MeterSettings:
    extend = policy != "count_after"
    return dataclasses.replace(s, truncate=False, extend=extend)


def _usage_row(row: UsageRow) -> dict[str, Any]:
    b = row.budget
    cost = b.dimension is Dimension.COST_USD
    out: dict[str, Any] = {
        "level": b.level.kind.value,
        "id": b.level.id,
        "dimension": b.dimension.value,
        "window": b.window.spec,
        "unit": "nano_usd" if cost else "tokens",
        "limit": b.limit,
        "used": row.used,
        "reserved": row.reserved,
        "remaining": row.remaining,
        "reset_seconds": round(row.reset_ms / 1000, 3),
    }
    if cost:
        for name in ("limit", "used", "reserved", "remaining"):
            out[f"{name}_usd"] = out[name] / NANO_USD_PER_USD
    return out


def _refusal(r: Refused) -> TooManyRequests:
    retry_s = max(1, -(-r.retry_after_ms // 1000))
    headers = budget_headers(r.budgets, r.rates, r.server_time_ms)
    headers["retry-after"] = str(1 if r.reason is Refusal.BUSY else retry_s)
    headers["retry-after-ms"] = str(r.retry_after_ms)
    return TooManyRequests(r.message, code=r.reason.value, headers=headers)


def _deadline(request: Request) -> float | None:
    """Monotonic time by which a stream must end, from the Lambda Web Adapter's context header."""
    raw = request.headers.get("x-amzn-lambda-context")
    if not raw:
        return None
    try:
        deadline_ms = int(json.loads(raw)["deadline"])
    except (ValueError, KeyError, TypeError):
        return None
    left = deadline_ms / 1000 - time.time() - DEADLINE_MARGIN_S
    return asyncio.get_running_loop().time() + left


def _now_ms() -> int:
    return int(time.time() * 1000)


def request_id(request: Request) -> str:
    return request.headers.get("x-request-id") or uuid.uuid4().hex
