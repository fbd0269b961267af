"""The ASGI app: routes, the one boundary where errors become OpenAI-shaped responses, and the
clients built once per process (per Lambda execution environment).

The same app runs under uvicorn (`hardcap serve`, and on Lambda behind the Lambda Web Adapter
for response streaming) and under Mangum (buffered invocations, event-driven tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hardcap_core import env
from hardcap_core.config import Config, Principal, load_config
from hardcap_core.errors import ConfigError, GatewayError, LedgerUnavailable, ServiceUnavailable
from hardcap_core.gateway.pipeline import Gateway, request_id
from hardcap_core.ledger.client import Ledger
from hardcap_core.ledger.connection import connect
from hardcap_core.logs import logger
from hardcap_core.providers.openai_compat import Upstream, make_http_client

Handler = Callable[[Gateway, Request, Principal], Awaitable[Response]]


class Runtime:
    """Clients and the gateway, built on first use and reused by every later request."""

    def __init__(
        self,
        config: Config,
        ledger_client: Any = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self.config = config
        self._ledger_client = ledger_client
        self._http_client = http_client
        self._gateway: Gateway | None = None
        self._lock = asyncio.Lock()

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
        self._http_client = self._http_client or make_http_client()
        ledger = Ledger(client, reservation_ttl_s=g.reservation_ttl_seconds)
        return Gateway(self.config, ledger, Upstream(self._http_client))

    async def aclose(self) -> None:
        if self._http_client is not None:
            await self._http_client.aclose()
        if self._ledger_client is not None:
            await self._ledger_client.aclose()


def create_app(
    config: Config, *, ledger_client: Any = None, http_client: httpx.AsyncClient | None = None
) -> Starlette:
    """The gateway app for ``config``; pass clients to share or inject them (tests, benchmarks)."""
    runtime = Runtime(config, ledger_client, http_client)

    def authenticated(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            rid = request_id(request)
            principal: Principal | None = None
            gateway: Gateway | None = None
            status = 500
            try:
                gateway = await runtime.gateway()
                principal = gateway.authenticate(request)
                response = await handler(gateway, request, principal)
                status = response.status_code
                response.headers["x-request-id"] = rid
                return response
            except GatewayError as e:
                status = e.status
                headers = dict(e.headers)
                if gateway and principal and status not in (429, 503) and not headers:
                    headers = await gateway.headers_for(principal)
                return error_response(e, {**headers, "x-request-id": rid})
            except Exception:
                # The last line of defence: a bug must still answer in the OpenAI shape.
                logger.exception("unhandled error", extra={"request_id": rid})
                return error_response(
                    GatewayError("Internal error in the gateway."), {"x-request-id": rid}
                )
            finally:
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

        return endpoint

    async def chat(gateway: Gateway, request: Request, principal: Principal) -> Response:
        return await gateway.chat_completions(request, principal)

    async def usage(gateway: Gateway, request: Request, principal: Principal) -> Response:
        return await gateway.usage(principal)

    async def models(gateway: Gateway, request: Request, principal: Principal) -> Response:
        return gateway.models(principal)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def not_found(request: Request, exc: Exception) -> Response:
        return JSONResponse(
            {
                "error": {
                    "message": f"No route {request.url.path}",
                    "type": "invalid_request_error",
                    "code": "not_found",
                    "param": None,
                }
            },
            status_code=404,
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Clients are built on first use (cheap cold start); closed here on shutdown.
        yield
        await runtime.aclose()

    app = Starlette(
        lifespan=lifespan,
        routes=[
            Route("/v1/chat/completions", authenticated(chat), methods=["POST"]),
            Route("/v1/models", authenticated(models), methods=["GET"]),
            Route("/v1/hardcap/usage", authenticated(usage), methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        exception_handlers={404: not_found},
    )
    app.state.runtime = runtime
    return app


def error_response(error: GatewayError, headers: dict[str, str]) -> Response:
    """The OpenAI-shaped error body the official SDKs map to their exception classes."""
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def app_from_env() -> Starlette:
    """The app as Lambda and ``uvicorn --factory`` build it: config path from HARDCAP_CONFIG."""
    path = os.environ.get(env.CONFIG_PATH)
    if not path:
        raise ConfigError(f"set {env.CONFIG_PATH} to the path of the config file")
    return create_app(load_config(path))
