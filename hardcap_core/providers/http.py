"""The HTTP client shared by every provider, and the one boundary where httpx's errors and a
provider's error statuses become errors a client can act on."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx

from hardcap_core import sse
from hardcap_core.errors import (
    GatewayError,
    InvalidRequest,
    TooManyRequests,
    UpstreamFailed,
    UpstreamMalformed,
    UpstreamTimeout,
)
from hardcap_core.events import Event, Read
from hardcap_core.logs import logger

# Provider errors a client can fix or act on are passed on with their status; anything else
# (a wrong provider key, a provider outage) is the gateway's problem: 502.
PASS_THROUGH = {400: InvalidRequest, 422: InvalidRequest, 429: TooManyRequests}
CONNECT_TIMEOUT_S = 10.0


def make_http_client() -> httpx.AsyncClient:
    """The process-wide client: pooled keep-alive connections to every provider."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(300.0, connect=CONNECT_TIMEOUT_S),
        limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
    )


def transport_error(upstream: str, e: httpx.HTTPError) -> GatewayError:
    """A failure to reach the provider, or to get its answer in time, before any reply."""
    if isinstance(e, httpx.TimeoutException):
        return UpstreamTimeout(f"The provider for '{upstream}' did not answer in time.")
    return UpstreamFailed(f"The provider for '{upstream}' could not be reached.")


def stream_error(e: httpx.HTTPError) -> GatewayError:
    """A failure of the connection while the provider was streaming."""
    if isinstance(e, httpx.TimeoutException):
        return UpstreamTimeout("The provider stopped sending in time.")
    logger.warning("stream failed", extra={"error": type(e).__name__})
    return UpstreamFailed("The provider connection failed mid-stream.")


def status_error(upstream: str, status: int, content: bytes) -> GatewayError:
    """The error a client gets for a provider's error status."""
    message = f"The provider for '{upstream}' answered {status}."
    try:
        detail = json.loads(content).get("error", {}).get("message")
        if isinstance(detail, str) and status in PASS_THROUGH:
            message = f"{message} {detail}"
    except (ValueError, AttributeError):
        pass
    cls = PASS_THROUGH.get(status, UpstreamFailed)
    code = "upstream_rate_limited" if status == 429 else None
    return cls(message, code=code)


def post(
    client: httpx.AsyncClient,
    url: str,
    headers: Mapping[str, str],
    body: Any,
    timeout_s: float,
) -> httpx.Request:
    """A JSON POST with the upstream's timeout (and the shared connect timeout)."""
    timeout = httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S)
    return client.build_request(
        "POST", url, headers=dict(headers), content=json.dumps(body), timeout=timeout
    )


async def send_json(
    client: httpx.AsyncClient, request: httpx.Request, route: str
) -> dict[str, Any]:
    """Send a whole-reply request; its JSON object. A refusal or no answer raises the error
    the client gets; a 200 whose body is not a JSON object raises :class:`UpstreamMalformed`
    (the provider generated, and bills, it)."""
    try:
        response = await client.send(request)
    except httpx.HTTPError as e:
        raise transport_error(route, e) from e
    if response.status_code >= 400:
        raise status_error(route, response.status_code, response.content)
    try:
        data = response.json()
    except ValueError as e:
        raise UpstreamMalformed(f"Provider for '{route}' sent invalid JSON.") from e
    if not isinstance(data, dict):
        raise UpstreamMalformed(f"Provider for '{route}' sent an unexpected body.")
    return data


@asynccontextmanager
async def open_sse(
    client: httpx.AsyncClient,
    request: httpx.Request,
    route: str,
    decode: Callable[[str], Event],
) -> AsyncIterator[AsyncIterator[Read]]:
    """An open SSE stream: connects and checks the status on entry (raising the error the
    client gets), yields one batch of ``decode``d events per network read, and closes the
    connection on exit so the provider stops generating."""
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as e:
        raise transport_error(route, e) from e
    reads = _sse_reads(response, decode)
    try:
        if response.status_code >= 400:
            raise status_error(route, response.status_code, await response.aread())
        yield reads
    finally:
        await reads.aclose()
        await response.aclose()


async def _sse_reads(
    response: httpx.Response, decode: Callable[[str], Event]
) -> AsyncGenerator[Read, None]:
    """One batch of events per network read. ``aiter_bytes`` undoes any content encoding a
    provider applied although we asked for none."""
    parser = sse.SSEParser()
    try:
        async for piece in response.aiter_bytes():
            yield [decode(data) for data in parser.feed(piece)]
    except httpx.HTTPError as e:
        raise stream_error(e) from e
    tail = [decode(data) for data in parser.flush()]
    if tail:
        yield tail
