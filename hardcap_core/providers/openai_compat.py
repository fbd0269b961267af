"""Calling providers: one shared httpx client per process, errors translated at this boundary.

Provider and transport failures become :class:`GatewayError` subclasses here, so the rest of the
gateway only ever sees errors a client can act on.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from hardcap_core.config import Route
from hardcap_core.errors import (
    GatewayError,
    InvalidRequest,
    TooManyRequests,
    UpstreamFailed,
    UpstreamTimeout,
)

# Provider errors a client can fix or act on are passed on with their status; anything else
# (a wrong provider key, a provider outage) is the gateway's problem: 502.
PASS_THROUGH = {400: InvalidRequest, 422: InvalidRequest, 429: TooManyRequests}


def make_http_client() -> httpx.AsyncClient:
    """The process-wide client: pooled keep-alive connections to every provider."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(300.0, connect=10.0),
        limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
    )


class Upstream:
    """Sends a chat completion to a route's provider."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    def _request(self, route: Route, body: dict[str, Any]) -> httpx.Request:
        headers = {"content-type": "application/json", "accept": "application/json"}
        key = route.upstream.api_key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        url = route.upstream.base_url.rstrip("/") + "/chat/completions"
        timeout = httpx.Timeout(route.upstream.timeout_seconds, connect=10.0)
        return self.client.build_request(
            "POST", url, headers=headers, content=json.dumps(body), timeout=timeout
        )

    async def complete(self, route: Route, body: dict[str, Any]) -> dict[str, Any]:
        """A non-streamed completion's JSON."""
        try:
            response = await self.client.send(self._request(route, body))
        except httpx.HTTPError as e:
            raise translate_transport_error(route, e) from e
        if response.status_code >= 400:
            raise provider_error(route, response.status_code, response.content)
        try:
            data = response.json()
        except ValueError as e:
            raise UpstreamFailed(f"Provider for '{route.name}' sent invalid JSON.") from e
        if not isinstance(data, dict):
            raise UpstreamFailed(f"Provider for '{route.name}' sent an unexpected body.")
        return data

    @asynccontextmanager
    async def stream(self, route: Route, body: dict[str, Any]) -> AsyncIterator[httpx.Response]:
        """An open streamed response; leaving the block closes the connection to the provider."""
        try:
            response = await self.client.send(self._request(route, body), stream=True)
        except httpx.HTTPError as e:
            raise translate_transport_error(route, e) from e
        try:
            if response.status_code >= 400:
                raise provider_error(route, response.status_code, await response.aread())
            yield response
        finally:
            await response.aclose()


def translate_transport_error(route: Route, e: httpx.HTTPError) -> GatewayError:
    if isinstance(e, httpx.TimeoutException):
        return UpstreamTimeout(f"The provider for '{route.name}' did not answer in time.")
    return UpstreamFailed(f"The provider for '{route.name}' could not be reached.")


def provider_error(route: Route, status: int, content: bytes) -> GatewayError:
    """The error a client gets for a provider's error status."""
    message = f"The provider for '{route.name}' answered {status}."
    try:
        detail = json.loads(content).get("error", {}).get("message")
        if isinstance(detail, str) and status in PASS_THROUGH:
            message = f"{message} {detail}"
    except (ValueError, AttributeError):
        pass
    cls = PASS_THROUGH.get(status, UpstreamFailed)
    code = "upstream_rate_limited" if status == 429 else None
    return cls(message, code=code)
