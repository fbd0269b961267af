"""The ASGI app: routes, the one boundary where errors become responses in the endpoint's wire
format, and the clients built once per process (per Lambda execution environment).

The same app runs under uvicorn (`hardcap serve`, and on Lambda behind the Lambda Web Adapter
for response streaming) and under Mangum (buffered invocations, event-driven tests).

The clients are built when the server starts (on Lambda: the init phase), so a SnapStart snapshot
holds them and the first request does not wait for them; around a snapshot the cache client is
dropped and built again (:meth:`Runtime.before_snapshot`, :meth:`Runtime.after_restore`), through
the adapter's hook paths when they are configured (see docs/coldstart.md).

What most requests never touch is imported on its first use, not with the app: the quote and
lease endpoints (on their first request), the live config (only when a config table is named),
and the tokenizers (only for a route that has one: :mod:`hardcap_core.tokenize.routes`). A test
holds this (tests/unit/test_cold_start_imports.py). Before a SnapStart snapshot they are all
imported (:func:`preload`): init time before a snapshot is free, a first request's is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hardcap_core import env
from hardcap_core.chat import ChatRequest
from hardcap_core.config import Config, Principal, load_config
from hardcap_core.errors import (
    ConfigError,
    GatewayError,
    HardcapError,
    LedgerUnavailable,
    MethodNotAllowed,
    NotFound,
    Overloaded,
    ServiceUnavailable,
)
from hardcap_core.gateway.loop_lag import LoopLag, on_lambda
from hardcap_core.gateway.meter import SettleFallback
from hardcap_core.gateway.metrics import record_request
from hardcap_core.gateway.pipeline import TRACE_SCOPE_KEY, Gateway
from hardcap_core.gateway.request_id import RequestIdMiddleware, request_id
from hardcap_core.gateway.shed import SHED_OUTCOME, Shedder
from hardcap_core.ledger import Ledger
from hardcap_core.ledger.connection import connect
from hardcap_core.logs import logger
from hardcap_core.providers.http import make_transport
from hardcap_core.providers.registry import providers_for
from hardcap_core.providers.transport import Transport
from hardcap_core.wire.anthropic_count import count_tokens_reply
from hardcap_core.wire.anthropic_messages import AnthropicMessages
from hardcap_core.wire.anthropic_request import parse_messages_request
from hardcap_core.wire.base import WireFormat
from hardcap_core.wire.openai_chat import OpenAIChat
from hardcap_core.wire.openai_embeddings import OpenAIEmbeddings
from hardcap_core.wire.openai_responses import OpenAIResponses
from hardcap_core.wire.openai_responses_request import parse_openai_body

if TYPE_CHECKING:
    from hardcap_core.control.live import LiveConfig
    from hardcap_core.gateway.tracing import RequestTrace, Tracing

Handler = Callable[[Gateway, Request, Principal, WireFormat], Awaitable[Response]]
OPENAI = OpenAIChat()
ANTHROPIC = AnthropicMessages()
RESPONSES = OpenAIResponses()
EMBEDDINGS = OpenAIEmbeddings()
# Paths whose 404 and 405 answer in Anthropic's error shape (its SDKs read no other).
ANTHROPIC_PATHS = "/v1/messages"
CLIENT_CLOSED_REQUEST = 499  # the status logged for a client that left (nginx's convention)


class Runtime:
    """Clients and the gateway, built on first use and reused by every later request."""

    def __init__(
        self,
        config: Config,
        ledger_client: Any = None,
        http_client: Transport | None = None,
        live: LiveConfig | None = None,
    ) -> None:
        self.config = config
        self.live = live  # tenants and keys from the config table, if one is configured
        self._ledger_client = ledger_client
        self._owns_ledger_client = ledger_client is None  # injected ones are the caller's
        self._http_client = http_client
        self._gateway: Gateway | None = None
        self._lock = asyncio.Lock()
        # How late this process's event loop runs (started with the server, off on Lambda),
        # and the check that refuses new chat requests while it is too late.
        self.loop_lag = LoopLag(threshold_s=config.gateway.shed_when_loop_lag_ms / 1000)
        self.shedder = Shedder(self.loop_lag)
        self.tracing = tracing_for(config)

    async def warm(self) -> None:
        """Build the clients and the gateway now instead of on the first request. A failure is
        logged and left to the first request, which tries again and answers the error."""
        try:
            await self.gateway()
        except HardcapError as e:  # the cache unreachable, or no cache configured
            logger.warning("gateway not built at start", extra={"error": str(e)})

    async def before_snapshot(self) -> None:
        """Close the cache client before a SnapStart snapshot: its connections (and, with IAM
        auth, its token) would be stale in every environment restored from it. The HTTP client
        stays: it has opened no connection yet (no request has run), and its TLS context is
        what the snapshot should keep: it is made now. What the app imports on first use is
        imported now, so the snapshot holds it (:func:`preload`)."""
        preload()
        if self._http_client is not None:
            self._http_client.prepare()
        async with self._lock:
            client, self._gateway = self._ledger_client, None
            if self._owns_ledger_client and client is not None:
                self._ledger_client = None
                await client.aclose()

    async def after_restore(self) -> None:
        """After a SnapStart restore: reseed ``random`` (every restored environment would share
        the snapshot's state) and build the gateway again, with a new cache client."""
        random.seed()
        await self.before_snapshot()  # whatever the snapshot held, nothing of it is reused
        await self.warm()

    async def gateway(self) -> Gateway:
        if self._gateway is None:
            async with self._lock:
                if self._gateway is None:
                    self._gateway = await self._build()
        return self._gateway

    async def _build(self) -> Gateway:
        g = self.config.gateway
        client = self._ledger_client
        if client is None:
            if not g.redis_url:
                raise ConfigError("gateway.redis_url is not set (or set HARDCAP_REDIS_URL)")
            try:
                client = await connect(g.redis_url, cluster=g.redis_cluster)
            except LedgerUnavailable as e:
                raise ServiceUnavailable("The budget server is unreachable.") from e
        self._ledger_client = client
        self._http_client = self._http_client or make_transport()
        live = self.live
        if live is not None and live.config is None:
            try:
                await live.reload()
            except HardcapError as e:
                raise ServiceUnavailable("The configuration table is unreachable.") from e
        config = self.config if live is None or live.config is None else live.config
        ledger, fallback = _ledger(client, config)
        if live is not None:
            live.watch(ledger.published_config_version)  # a refusal's check of its copy
        if live is not None and fallback is not None:
            # A lost cache is restored for the hierarchies the live config has now.
            counters: Any = ledger.counters
            live.on_change(lambda new: setattr(counters, "config", new))
        providers = providers_for(self.config, self._http_client)
        return Gateway(
            self.config, ledger, providers, fallback, loop_lag=self.loop_lag, live=live,
            transport=self._http_client,
        )  # fmt: skip

    async def aclose(self) -> None:
        if self._gateway is not None:
            await self._gateway.callers.aclose()  # its key-set fetches, before their client
        if self._http_client is not None:
            await self._http_client.aclose()
        if self._ledger_client is not None:
            await self._ledger_client.aclose()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # what is batched goes out first


def tracing_for(config: Config) -> Tracing | None:
    """The process's tracing if the config names an OTLP endpoint; else None, and the
    OpenTelemetry SDK is not imported (gateway/tracing.py)."""
    endpoint = config.gateway.otlp_endpoint
    if not endpoint:
        return None
    from hardcap_core.gateway.tracing import Tracing

    return Tracing(endpoint, flush_each=on_lambda())


def _ledger(client: Any, config: Config) -> tuple[Ledger, SettleFallback | None]:
    """The ledger, durable when ``HARDCAP_USAGE_TABLE`` names a table: lost counters come back
    from it and settles the cache misses are kept in it. Without one, neither (and boto3 is
    never imported)."""
    ttl = config.gateway.reservation_ttl_seconds
    if not os.environ.get(env.USAGE_TABLE):
        return Ledger(client, reservation_ttl_s=ttl), None
    from hardcap_core.rollup.service import gateway_ledger, usage_table_from_env

    return gateway_ledger(client, config, usage_table_from_env(), reservation_ttl_s=ttl)


def create_app(
    config: Config,
    *,
    ledger_client: Any = None,
    http_client: Transport | None = None,
    live: LiveConfig | None = None,
) -> Starlette:
    """The gateway app for ``config``; pass clients to share or inject them (tests, benchmarks);
    ``live``: tenants, keys and budgets from the config table (``HARDCAP_CONFIG_TABLE``)."""
    runtime = Runtime(config, ledger_client, http_client, live)
    tracing = runtime.tracing

    def endpoint(handler: Handler, wire: WireFormat) -> Callable[[Request], Awaitable[Response]]:
        """An authenticated endpoint speaking ``wire``: errors become its error bodies here."""

        async def serve(request: Request) -> Response:
            started = time.perf_counter()
            rid = request_id(request.scope)
            principal: Principal | None = None
            gateway: Gateway | None = None
            status = 500
            shed = False
            trace: RequestTrace | None = None
            error: GatewayError | None = None
            if tracing is not None and handler is chat:
                trace = tracing.begin(request.headers, request.url.path, rid)
                request.scope[TRACE_SCOPE_KEY] = trace
            try:
                gateway = await runtime.gateway()
                principal = await gateway.authenticate(request)
                if handler is chat:
                    runtime.shedder.check()  # before admission: a shed request costs nothing
                response = await handler(gateway, request, principal, wire)
                status = response.status_code
                return response
            except ClientDisconnect:
                # The client left before its answer: mid-upload, or while its request waited
                # in the admission queue (which it has left). Nobody reads this reply, and the
                # error is not the gateway's: the request's line says 499, no traceback.
                status = CLIENT_CLOSED_REQUEST
                return Response(status_code=status)
            except GatewayError as e:
                status, error = e.status, e
                shed = isinstance(e, Overloaded)
                headers = dict(e.headers)
                if gateway and principal and status not in (429, 503) and not headers:
                    headers = await gateway.headers_for(principal, wire)
                return JSONResponse(wire.error_body(e), status_code=e.status, headers=headers)
            except Exception:
                # The last line of defence: a bug must still answer in the client's format.
                logger.exception("unhandled error", extra={"request_id": rid})
                error = GatewayError("Internal error in the gateway.")
                return JSONResponse(wire.error_body(error), status_code=error.status)
            finally:
                # An admitted chat request's line is written when it settles (the metrics
                # line, gateway/metrics.py): one line per request, not two.
                if shed:
                    _record_shed(request, rid, principal, started)
                elif not (status == 200 and handler is chat):
                    _log_request(request, rid, status, principal, started)
                if trace is not None and not trace.streaming:  # a stream's ends at its settle
                    await trace.end(status, error)

        return serve

    async def chat(gw: Gateway, request: Request, who: Principal, wire: WireFormat) -> Response:
        return await gw.chat(request, who, wire, request_id(request.scope))

    async def count_tokens(
        gw: Gateway, request: Request, who: Principal, wire: WireFormat
    ) -> Response:
        """Anthropic's count_tokens: the route's count, the input admission would reserve
        (see :mod:`hardcap_core.wire.anthropic_count`). Authenticated and held to the key's
        routes like a message; not charged (only a route with ``count_api`` asks upstream)."""
        counted = parse_messages_request(await gw.read_body(request), counting=True)
        if not who.allows(counted.model):  # refused, unless this copy is stale (callers.py)
            who = await gw.callers.allowing(who, counted.model, request)
        route = gw.route_for(counted.model, who)  # raises for a model unknown or not allowed
        headers = await gw.headers_for(who, wire)
        tokens = await gw.counts.reported(route, counted)  # the route's tokenizer's, if it has one
        return JSONResponse(count_tokens_reply(counted, tokens), headers=headers)

    async def input_tokens(
        gw: Gateway, request: Request, who: Principal, wire: WireFormat
    ) -> Response:
        """The Responses API's input_tokens: the input admission would reserve for the body, by
        the route's tokenizer where it has one (else the bound). Held to the key's routes like
        a response; calls no upstream, charges nothing."""
        # A previous_response_id's stored conversation counted with it (the caller's own).
        counted = await gw.stored.parse(await gw.read_body(request), who, counting=True)
        if not who.allows(counted.model):  # refused, unless this copy is stale (callers.py)
            who = await gw.callers.allowing(who, counted.model, request)
        route = gw.route_for(counted.model, who)
        headers = await gw.headers_for(who, wire)
        tokens = await gw.counts.reported(route, counted)
        body = {"object": "response.input_tokens", "input_tokens": tokens}
        return JSONResponse(body, headers=headers)

    async def stored_response(
        gw: Gateway, request: Request, who: Principal, wire: WireFormat
    ) -> Response:
        """A stored response (get, delete, cancel, its input items: gateway/stored.py), for
        the tenant and user that made it only; no upstream call, no charge."""
        response = await gw.stored.answer(request, who)
        response.headers.update(await gw.headers_for(who, wire))
        return response

    async def usage(gw: Gateway, request: Request, who: Principal, wire: WireFormat) -> Response:
        return await gw.usage(who, wire)

    async def quote(gw: Gateway, request: Request, who: Principal, wire: WireFormat) -> Response:
        """What a request would cost and whether it would be admitted now (gateway/quote.py):
        authenticated and parsed like a chat request; calls no upstream, reserves nothing."""
        from hardcap_core.gateway.quote import quote as quote_request  # on the first quote

        # OpenAI's own path takes a chat-completions body or a Responses one.
        parse: Callable[[bytes], ChatRequest] = parse_openai_body if wire is OPENAI else wire.parse
        raw = await gw.read_body(request)
        if wire is OPENAI and gw.stored.continues(raw):
            # A Responses body continuing a stored response: quoted with its conversation.
            continued = await gw.stored.parse(raw, who)
            parse = lambda _: continued  # noqa: E731
        body = await quote_request(gw, raw, who, parse)
        return JSONResponse(body, headers=await gw.headers_for(who, wire))

    async def open_lease(
        gw: Gateway, request: Request, who: Principal, wire: WireFormat
    ) -> Response:
        from hardcap_core.gateway import leases  # on the first lease request

        return await leases.open_lease(gw, request, who, wire)

    async def lease(gw: Gateway, request: Request, who: Principal, wire: WireFormat) -> Response:
        from hardcap_core.gateway import leases

        return await leases.lease(gw, request, who, wire)

    async def models(gw: Gateway, request: Request, who: Principal, wire: WireFormat) -> Response:
        return await gw.models(who, wire)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def http_error(request: Request, exc: Exception) -> Response:
        """Starlette's own 404 and 405, in the error shape of the API the path belongs to."""
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        headers = dict(exc.headers or {}) if isinstance(exc, HTTPException) else {}
        error: GatewayError
        if status == 405:
            # Starlette names the header "Allow": HTTP header names are case-insensitive.
            allowed = next((v for k, v in headers.items() if k.lower() == "allow"), "")
            error = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}; "
                                     f"use {allowed}.")  # fmt: skip
        elif status == 404:
            error = NotFound(f"No route {request.url.path}", code="not_found")
        else:
            error = GatewayError(str(getattr(exc, "detail", "Internal error in the gateway.")))
            error.status = status
        wire = ANTHROPIC if request.url.path.startswith(ANTHROPIC_PATHS) else OPENAI
        return JSONResponse(wire.error_body(error), status_code=status, headers=headers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Built before the server listens (Lambda's init phase, held by a SnapStart snapshot);
        # closed on shutdown. The loop-lag monitor runs with the server (not on Lambda: see
        # hardcap_core/gateway/loop_lag.py).
        if not on_lambda():
            runtime.loop_lag.start()
        await runtime.warm()
        yield
        await runtime.loop_lag.stop()
        await runtime.aclose()

    app = Starlette(
        lifespan=lifespan,
        routes=[
            Route("/v1/chat/completions", endpoint(chat, OPENAI), methods=["POST"]),
            Route("/v1/messages", endpoint(chat, ANTHROPIC), methods=["POST"]),
            Route("/v1/responses", endpoint(chat, RESPONSES), methods=["POST"]),
            Route(
                "/v1/responses/input_tokens", endpoint(input_tokens, RESPONSES), methods=["POST"]
            ),
            Route(
                "/v1/responses/{response_id}",
                endpoint(stored_response, RESPONSES),
                methods=["GET", "DELETE"],
            ),
            Route(
                "/v1/responses/{response_id}/{verb:str}",
                endpoint(stored_response, RESPONSES),
                methods=["GET", "POST", "DELETE"],
            ),
            Route("/v1/messages/count_tokens", endpoint(count_tokens, ANTHROPIC), methods=["POST"]),
            Route("/v1/embeddings", endpoint(chat, EMBEDDINGS), methods=["POST"]),
            Route("/v1/models", endpoint(models, OPENAI), methods=["GET"]),
            Route("/v1/hardcap/usage", endpoint(usage, OPENAI), methods=["GET"]),
            Route("/v1/hardcap/leases", endpoint(open_lease, OPENAI), methods=["POST"]),
            Route(
                "/v1/hardcap/leases/{lease_id}", endpoint(lease, OPENAI), methods=["GET", "DELETE"]
            ),
            Route("/v1/hardcap/quote", endpoint(quote, OPENAI), methods=["POST"]),
            Route("/v1/messages/quote", endpoint(quote, ANTHROPIC), methods=["POST"]),
            Route("/v1/embeddings/quote", endpoint(quote, EMBEDDINGS), methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            *snapstart_routes(runtime),
        ],
        middleware=[Middleware(RequestIdMiddleware)],
        exception_handlers={404: http_error, 405: http_error},
    )
    app.state.runtime = runtime
    app.state.loop_lag = runtime.loop_lag
    return app


# Imported on first use (see the module's docstring); :func:`preload` imports them all at once.
LAZY_MODULES = (
    "hardcap_core.gateway.quote",
    "hardcap_core.gateway.leases",
    "hardcap_core.tokenize.counters",
    "hardcap_core.tokenize.count_api",
    "hardcap_core.tokenize.vocabularies",
)


def preload() -> None:
    """Import what the app otherwise imports on first use: before a SnapStart snapshot, so that
    no restored environment pays for it on a request. (The vocabularies themselves stay loaded
    on first count: only routes with a tokenizer need them, and they are large.)"""
    for name in LAZY_MODULES:
        importlib.import_module(name)


# The Lambda Web Adapter POSTs to these paths around a SnapStart snapshot when they are set, and
# answers 403 itself to any outside request for them. The routes exist only then: without the
# adapter's guard, anyone could close the cache client under running requests.
SNAPSTART_HOOKS = {
    "AWS_LWA_SNAPSTART_BEFORE_CHECKPOINT_PATH": Runtime.before_snapshot,
    "AWS_LWA_SNAPSTART_AFTER_RESTORE_PATH": Runtime.after_restore,
}


def snapstart_routes(runtime: Runtime) -> list[Route]:
    """The adapter's SnapStart hooks the environment names, each calling its Runtime method."""
    routes = []
    for variable, hook in SNAPSTART_HOOKS.items():
        path = os.environ.get(variable, "").strip()
        if not path:
            continue

        async def run_hook(request: Request, hook: Any = hook) -> Response:
            await hook(runtime)
            return JSONResponse({"ok": True})

        routes.append(Route(path, run_hook, methods=["POST"]))
    return routes


def _log_request(
    request: Request, rid: str, status: int, principal: Principal | None, started: float
) -> None:
    logger.info(
        "request",
        extra={
            "request_id": rid,
            "path": request.url.path,
            "status": status,
            "tenant": principal.tenant_id if principal else None,
            "key_id": principal.key_id if principal else None,
            "ms": round((time.perf_counter() - started) * 1000, 2),
        },
    )


def _record_shed(request: Request, rid: str, principal: Principal | None, started: float) -> None:
    """A shed request's line: the request metric with outcome ``shed`` (no upstream)."""
    record_request(
        outcome=SHED_OUTCOME,
        upstream="",
        added_latency_ms=(time.perf_counter() - started) * 1000,
        message="request shed",
        context={
            "request_id": rid,
            "path": request.url.path,
            "status": 503,
            "tenant": principal.tenant_id if principal else None,
            "key_id": principal.key_id if principal else None,
            "outcome": SHED_OUTCOME,
        },
    )


def app_from_env() -> Starlette:
    """The app as Lambda and ``uvicorn --factory`` build it: config path from HARDCAP_CONFIG."""
    path = os.environ.get(env.CONFIG_PATH)
    if not path:
        raise ConfigError(f"set {env.CONFIG_PATH} to the path of the config file")
    live = None
    if os.environ.get(env.CONFIG_TABLE):  # else the live config's modules are never imported
        from hardcap_core.control.live import live_from_env

        live = live_from_env(path)
    return create_app(load_config(path), live=live)
