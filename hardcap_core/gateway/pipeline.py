"""The request path: authenticate -> route -> admit -> send -> meter -> settle.

:class:`Gateway` holds what one process builds once (config, ledger, providers, estimators) and
serves each endpoint in the wire format the endpoint speaks. It raises :class:`GatewayError`;
:mod:`.app` turns those into responses in one place.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from hardcap_core import json_codec
from hardcap_core.chat import ANTHROPIC_MESSAGES, OPENAI_RESPONSES, ChatRequest
from hardcap_core.config import Config, Principal, Route
from hardcap_core.errors import (
    ConfigStale,
    LedgerUnavailable,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ServiceUnavailable,
    UpstreamMalformed,
)
from hardcap_core.gateway.answers import refusal, upstream_states, usage_row
from hardcap_core.gateway.callers import Callers
from hardcap_core.gateway.failover import Targets
from hardcap_core.gateway.loop_lag import LoopLag
from hardcap_core.gateway.meter import Meter, MeterSettings, SettleFallback
from hardcap_core.gateway.metrics import record_request
from hardcap_core.gateway.money import ToolHold, output_cap, policy_for, request_prices, tool_hold
from hardcap_core.gateway.pace import Listened, RouteRate
from hardcap_core.gateway.queue import Wakeups, admit_in_turn
from hardcap_core.gateway.relay import Relay
from hardcap_core.gateway.request_id import new_id
from hardcap_core.gateway.response import RelayResponse
from hardcap_core.gateway.stored import Stored
from hardcap_core.ledger import (
    Admitted,
    BudgetState,
    Ledger,
    Refused,
    ReservationMeta,
    Unguarded,
)
from hardcap_core.ledger.breakers import Breakers
from hardcap_core.ledger.estimators import (
    Estimator,
    FixedEstimator,
    MaxTokensEstimator,
    SharedP95Estimator,
)
from hardcap_core.logs import logger
from hardcap_core.outcome import Outcome
from hardcap_core.providers.base import Provider
from hardcap_core.providers.transport import Transport
from hardcap_core.tokenize.routes import InputCounts
from hardcap_core.wire.anthropic_request import with_headers
from hardcap_core.wire.base import Charged, WireFormat
from hardcap_core.wire.openai_input import check_pdf_pages
from hardcap_core.wire.openai_responses_request import keeper_of

if TYPE_CHECKING:  # the live config is imported only where a config table is named (app.py)
    from hardcap_core.control.live import LiveConfig
    from hardcap_core.gateway.tracing import RequestTrace  # only when tracing is on

DEADLINE_MARGIN_S = 3.0  # end and settle a stream this long before Lambda's timeout
# A request stops waiting to be admitted at least this long before Lambda's timeout, so that
# what it was admitted for still has time to run.
QUEUE_MARGIN_S = 10.0
QUEUE_WAIT_HEADER = "x-hardcap-queue-wait-ms"
# A request carrying it draws from that lease (admit.lua); the lease endpoints (gateway/leases.py,
# ledger/leases.py) are imported on their first request, not for this name.
LEASE_HEADER = "x-hardcap-lease"
# How often a request reloads the config when its admit finds it stale before giving up (503):
# only a storm of admin changes to one tenant hierarchy needs more than one.
STALE_RETRIES = 3
# Where a chat request's trace is kept in its ASGI scope while tracing is on (app.py puts it
# there, gateway/tracing.py); absent: tracing is off, and that lookup is all it costs.
TRACE_SCOPE_KEY = "hardcap.trace"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Admission:
    meter: Meter
    headers: dict[str, str]
    output_room: int | None = None  # output tokens the budgets held for this request, at most
    counted: int | None = None  # the input by the route's tokenizer, when it was counted


class Gateway:
    def __init__(
        self,
        config: Config,
        ledger: Ledger,
        providers: Mapping[str, Provider],
        fallback: SettleFallback | None = None,
        *,
        loop_lag: LoopLag | None = None,
        live: LiveConfig | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.config = config  # the file's: routes, upstreams, settings (a reload keeps them)
        self.live = live  # tenants, keys and budgets as the config table holds them, if it does
        self.callers = Callers(config, live, transport)
        self.wakeups = Wakeups()  # settles here wake this process's queued requests
        # This process's event-loop lag monitor (the app starts it; readings are 0 when it
        # does not run): recent_max_s is how long the gateway may stall again, a margin the
        # meter adds to a stream's tokens in flight.
        self.loop_lag = loop_lag or LoopLag()
        self.ledger = ledger
        self.providers = providers  # by upstream kind: openai, anthropic, bedrock
        self.breakers = Breakers(ledger.client, ledger.scripts, ledger.keys)
        # Per route, once: its chain of targets.
        self.chains = {name: config.chain(r) for name, r in config.routes.items()}
        self.fallback = fallback  # where a settle the cache does not take is kept
        # Per route: its input bound, and its tokenizer's count where that changes a decision.
        self.counts = InputCounts(config, providers)
        self.estimators = {name: self._estimator(r) for name, r in config.routes.items()}
        # Per route: its provider's speed in this process, for cuts of barely measured streams.
        self.rates = {name: RouteRate() for name in config.routes}
        g = config.gateway
        self.meter_settings = MeterSettings.of(g)
        # The Responses each tenant had kept (store), on the same cache.
        self.stored = Stored(config, ledger)

    def _estimator(self, route: Route) -> Estimator:
        kind = route.estimator.kind
        if kind == "fixed":
            return FixedEstimator(route.estimator.fixed_tokens or 1)
        if kind == "p95":
            return SharedP95Estimator(self.ledger, min_samples=route.estimator.min_samples)
        return MaxTokensEstimator()

    # -- endpoints ------------------------------------------------------------------------------

    async def authenticate(self, request: Request) -> Principal:
        """The principal of the request's key or token (OpenAI's SDKs send `Authorization:
        Bearer`, Anthropic's `x-api-key`: either works)."""
        return await self.callers.principal(request)

    async def chat(
        self, request: Request, principal: Principal, wire: WireFormat, request_id: str
    ) -> Response:
        """A chat completion in ``wire``'s format, streamed or not."""
        arrived = time.perf_counter()
        trace: RequestTrace | None = request.scope.get(TRACE_SCOPE_KEY)
        raw = await self.read_body(request)
        if wire.dialect == OPENAI_RESPONSES:  # its previous_response_id loaded, the caller's own
            parsed: ChatRequest = await self.stored.parse(raw, principal)
        else:
            parsed = wire.parse(raw)
        chat = with_headers(parsed, request.headers)
        deadline = _deadline(request)  # read once: the queue and the stream stop before it
        wait_until = None if deadline is None else deadline - QUEUE_MARGIN_S
        for attempt in range(STALE_RETRIES + 1):
            if not principal.allows(chat.model):  # refused, unless this copy is stale
                principal = await self.callers.allowing(principal, chat.model, request)
            caller = principal  # who owns what it stores (not the end user a body names)
            principal = self.callers.for_request(principal, chat)
            route = self.route_for(chat.model, principal)
            check_pdf_pages(chat.body, route.max_pdf_pages)  # a 400 past the route's cap
            max_tokens = output_cap(route, chat)  # or a 400
            tools = tool_hold(self.config, route, chat)  # or a 400 naming the tool
            chat = tools.bounded(chat)  # the provider is sent the uses held
            if trace is not None:
                trace.requested(chat, route, principal, max_tokens)
            meta = ReservationMeta(
                route.name, route.model, principal.key_id, request_id, principal.tenant_id,
                principal.org_id or "", route.upstream.name, principal.user,
                request.headers.get(LEASE_HEADER, ""),  # drawn from that lease (leases.py)
            )  # fmt: skip
            try:
                admission = await self._admit(
                    principal, route, chat, max_tokens, meta, wire, arrived, wait_until,
                    request, tools,
                )  # fmt: skip
                break
            except ConfigStale as stale:
                # An admin changed this tenant's hierarchy since this copy was read: nothing
                # was reserved. Read the config again and start over as the new one says (the
                # key may be revoked now: then this is a 401).
                if self.live is None or attempt == STALE_RETRIES:
                    raise ServiceUnavailable("The configuration is changing; retry.") from stale
                await self.live.reload(stale.version)
                principal = await self.authenticate(request)
        chat = self.stored.keeping(chat, route, caller)  # a Responses reply with store kept
        # A stream of Anthropic's format not from Anthropic starts with its input (message_start).
        up_front = chat.stream and wire.dialect == ANTHROPIC_MESSAGES
        up_front = up_front and not self._same_dialect(route, wire)
        chat = await self.counts.told(route, chat, admission.counted, up_front=up_front)
        if self.config.gateway.log_prompts:  # opt-in only: prompts may hold personal data
            logger.info("prompt", extra={"route": route.name, "messages": chat.messages})
        if not chat.stream:
            return await self._complete(route, chat, admission, max_tokens, wire)
        targets = self._targets(route, admission.meter)
        same = self._same_dialect(route, wire)
        upstream_cap = admission.meter.policy.stream_cap(max_tokens, admission.output_room)
        admission.meter.asked_for(upstream_cap)
        keeper = keeper_of(chat)
        relay = Relay(
            Listened(targets.stream(chat, upstream_cap), admission.meter.pace),
            admission.meter,
            wire.encoder(chat, model=route.name, same_dialect=same),
            deadline=None if deadline is None else deadline - DEADLINE_MARGIN_S,
            log_completion=self.config.gateway.log_prompts,
            keep=None if keeper is None else keeper.write,
            trace_content=trace is not None and route.trace_content,
        )
        await relay.open()
        if trace is not None:
            await trace.streams()
        return RelayResponse(relay, admission.headers)

    async def usage(self, principal: Principal, wire: WireFormat) -> Response:
        usage = await self._ledger_call(self.ledger.usage(principal.scope))
        rows = [usage_row(row) for row in usage.rows]
        states = [BudgetState(r.budget, r.remaining, r.reset_ms) for r in usage.rows]
        return JSONResponse(
            {
                "object": "hardcap.usage",
                "tenant": principal.tenant_id,
                "key": principal.key_id,
                "org": principal.org_id,
                "live_reservations": usage.live_reservations,
                "budgets": rows,
                "upstreams": await self._ledger_call(
                    upstream_states(self.config, self.breakers, principal)
                ),
            },
            headers=wire.budget_headers(states, (), usage.server_time_ms),
        )

    async def models(self, principal: Principal, wire: WireFormat) -> Response:
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": route.upstream.name}
            for name, route in self.config.routes.items()
            if principal.allows(name)
        ]
        headers = await self.headers_for(principal, wire)
        return JSONResponse({"object": "list", "data": data}, headers=headers)

    async def headers_for(self, principal: Principal, wire: WireFormat) -> dict[str, str]:
        """Budget headers for a reply that was not admitted (best effort: none if the budget
        server is unreachable)."""
        try:
            usage = await self.ledger.usage(principal.scope)
        except LedgerUnavailable:
            return {}
        states = [BudgetState(r.budget, r.remaining, r.reset_ms) for r in usage.rows]
        return wire.budget_headers(states, (), usage.server_time_ms)

    # -- steps ------------------------------------------------------------------------------------

    async def read_body(self, request: Request) -> bytes:
        """The request's body, refused past ``gateway.max_body_bytes``."""
        cap = self.config.gateway.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > cap:
            raise PayloadTooLarge(f"The request body is larger than {cap} bytes.")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > cap:
                raise PayloadTooLarge(f"The request body is larger than {cap} bytes.")
        return bytes(body)

    def route_for(self, model: str, principal: Principal) -> Route:
        """The route ``model`` names, if this principal may use it (else 404 / 403)."""
        route = self.config.routes.get(model)
        if route is None:
            raise NotFound(f"The model '{model}' does not exist.", param="model")
        if not principal.allows(model):
            raise PermissionDenied(f"This key may not use the model '{model}'.", param="model")
        return route

    async def _admit(
        self,
        principal: Principal,
        route: Route,
        chat: ChatRequest,
        max_tokens: int,
        meta: ReservationMeta,
        wire: WireFormat,
        arrived: float,
        deadline: float | None,
        request: Request,
        tools: ToolHold,
    ) -> Admission:
        money = policy_for(route.policy)  # what it holds, may generate and is charged
        estimator = self.estimators[route.name]
        # The cheap bound first; the route's count where it always wants it, or (admit, below)
        # where the bound does not fit (tokenize/routes.py).
        inputs = await self.counts.reserving(route, chat)
        # Server tools' results come back as input of later sampling turns: held on top.
        extra_in = tools.input_tokens
        held, prices = request_prices(self.config, route, chat, inputs.tokens + extra_in, tools)
        expected = None
        if money.asks_estimate(chat.stream):  # never raises: without the budget server, the cap
            expected = await estimator.estimate(route.name, max_tokens, tenant=principal.tenant_id)
        hold = money.hold(route, chat, max_tokens, expected)  # as the quote works it out
        rid = new_id()
        g = self.config.gateway

        def admit(ticket_ms: int) -> Any:
            return inputs.admit(lambda tokens, record: reserve(ticket_ms, tokens, record))

        def reserve(ticket_ms: int, input_tokens: int, record_refusal: bool) -> Any:
            nonlocal held, prices
            input_tokens += extra_in
            held, prices = request_prices(self.config, route, chat, input_tokens, tools)
            return self.ledger.admit(
                principal.scope,
                input_tokens=input_tokens,
                output_estimate=hold.estimate,
                min_output=hold.least,
                prices=held,
                reservation_id=rid,
                # No lease without the budget server: a request under one fails closed.
                fail_open=principal.fail_mode == "open" and not meta.lease,
                meta=meta,
                # A hold whose settle never comes (the instance died) is charged, not
                # refunded: it is the gateway's own upper estimate of what was generated.
                charge_on_expiry=True,
                queue_ticket_ms=ticket_ms,
                queue_priority=principal.queue_priority,
                headroom=g.extend_headroom_tokens,
                config_version=None if self.live is None else self.live.version,
                record_refusal=record_refusal,
                shared=route.shared,  # the route's and its upstream's limits over every tenant
            )

        wait_s = principal.queue_wait_s(route, g.queue_wait_seconds)
        if deadline is not None:
            wait_s = min(wait_s, deadline - asyncio.get_running_loop().time())
        trace: RequestTrace | None = request.scope.get(TRACE_SCOPE_KEY)
        span = None if trace is None else trace.admit_span()
        try:
            waited = await self._ledger_call(
                admit_in_turn(
                    admit, ledger=self.ledger, scope=principal.scope, reservation_id=rid,
                    meta=meta, wait_s=wait_s, wakeups=self.wakeups, receive=request.receive,
                )
            )  # fmt: skip
        except BaseException as e:
            if span is not None:
                span.end(e)
            raise
        result, left = waited.result, waited.client_left  # left: its client left the queue
        if span is not None and trace is not None:
            trace.admitted(span, waited.seconds, result)
        wait_header = {QUEUE_WAIT_HEADER: str(round(waited.seconds * 1000))}
        if isinstance(result, Refused):
            error = refusal(result, wire)
            error.headers.update(wait_header)
            if waited.seconds:
                record_request(
                    outcome=Outcome.CLIENT_GONE.value if left else result.reason.value,
                    upstream=route.upstream.name, added_latency_ms=0.0,
                    queue_wait_ms=waited.seconds * 1000, message="request refused after waiting",
                    context={"route": route.name, "request_id": meta.request_id,
                             "tenant": meta.tenant, "key_id": meta.key_id},
                )  # fmt: skip
            raise ClientDisconnect() if left else error  # nobody to answer, nothing sent
        reservation = None
        room = None
        unguarded_id = None
        if isinstance(result, Unguarded):
            unguarded_id = result.reservation_id
            logger.warning(
                "budget server unreachable; tenant fails open",
                extra={"tenant": principal.tenant_id, "route": route.name},
            )
            headers = {"x-hardcap-budget": "unenforced"}
        else:
            assert isinstance(result, Admitted)
            reservation = result.reservation
            headers = wire.budget_headers(result.budgets, result.rates, result.server_time_ms)
            room = money.room(result, held, hold.unseen)
        headers.update(wait_header)
        meter = Meter(
            self.ledger,
            principal.scope,
            reservation,
            self.meter_settings,
            policy=money,
            input_estimate=inputs.tokens + extra_in,
            tools=tools,
            estimator=estimator,
            route=route.name,
            prices=prices,
            meta=meta,
            cap=max_tokens,
            unguarded_id=unguarded_id,
            fallback=self.fallback,
            upstream=route.upstream.name,
            unseen=hold.unseen,
            admitted_in_s=time.perf_counter() - arrived,
            queue_wait_s=waited.seconds,
            loop_lag=self.loop_lag.recent_max_s,
            route_rate=self.rates.get(route.name),
            on_settled=lambda: self.wakeups.freed(principal.scope),
            trace=trace,
        )
        return Admission(meter, headers, room, inputs.reserved_count)

    async def _complete(
        self,
        route: Route,
        chat: ChatRequest,
        admission: Admission,
        max_tokens: int,
        wire: WireFormat,
    ) -> Response:
        """A whole reply; it is settled here, once, by how the call ended."""
        meter = admission.meter
        # A reply that cannot be cut is capped upstream at what is reserved.
        cap = meter.policy.upstream_cap(meter.reserved, max_tokens)
        meter.asked_for(cap)
        try:
            completion = await self._targets(route, meter).complete(chat, cap)
        except UpstreamMalformed:
            # It answered 200 with a reply we cannot use: it was generated and is billed, up
            # to the cap it was sent.
            meter.received_whole(cap)
            with anyio.CancelScope(shield=True):
                await meter.settle(Outcome.UPSTREAM_ERROR)
            raise
        except BaseException:
            # The provider did not answer: nothing was generated, nothing is charged.
            with anyio.CancelScope(shield=True):
                await meter.settle(Outcome.UPSTREAM_UNAVAILABLE)
            raise
        # A report the provider could not have billed is no report (gateway/money.py).
        usage = meter.believe(completion.usage)
        if meter.trace is not None:
            meter.trace.finished(completion.finish)
        reported = usage is not None and usage.output_tokens is not None
        # Without the provider's count, a length guess could be low: charge the cap it was sent.
        meter.received_whole(completion.tokens if reported else max(completion.tokens, cap))
        await meter.settle(Outcome.COMPLETED, usage)
        same = self._same_dialect(route, wire)
        charged = Charged(meter.charged_input, meter.charged_output, usage, meter.charged_cost)
        body = wire.reply(completion, model=route.name, same_dialect=same, charged=charged)
        keeper = keeper_of(chat)
        if keeper is not None and keeper.keep(body):
            await keeper.write()  # before the reply: the client's next turn may name it
        if self.config.gateway.log_prompts:
            logger.info("completion", extra={"route": route.name, "reply": body})
        if meter.trace is not None:
            meter.trace.output(body)
        headers = {**admission.headers, **charged.headers()}
        if meter.final_budgets:
            headers = {**headers, **wire.budget_headers(meter.final_budgets, (), _now_ms())}
        return Response(json_codec.dumps(body), media_type="application/json", headers=headers)

    def _targets(self, route: Route, meter: Meter) -> Targets:
        return Targets(self.chains[route.name], self.providers, self.breakers, meter)

    def _same_dialect(self, route: Route, wire: WireFormat) -> bool:
        """Whether every target speaks the client's dialect, so its chunks may pass through."""
        return all(
            self.providers[t.upstream.kind].dialect == wire.dialect for t in self.chains[route.name]
        )

    async def _ledger_call(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except LedgerUnavailable as e:
            logger.warning("budget server unreachable", extra={"error": str(e)})
            raise ServiceUnavailable(
                "The budget server is unreachable, and this tenant fails closed. Retry shortly."
            ) from e


def _deadline(request: Request) -> float | None:
    """The Lambda invocation's deadline in event-loop time, from the Lambda Web Adapter's
    context header (None outside Lambda)."""
    raw = request.headers.get("x-amzn-lambda-context")
    if not raw:
        return None
    try:
        deadline_ms = int(json.loads(raw)["deadline"])
    except (ValueError, KeyError, TypeError):
        return None
    return asyncio.get_running_loop().time() + deadline_ms / 1000 - time.time()


def _now_ms() -> int:
    return int(time.time() * 1000)
