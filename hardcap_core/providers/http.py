"""The HTTP client shared by every provider, and the one boundary where httpx's errors and a
provider's error statuses become errors a client can act on."""

from __future__ import annotations

import json

import httpx

from hardcap_core.errors import (
    GatewayError,
    InvalidRequest,
    TooManyRequests,
    UpstreamFailed,
    UpstreamTimeout,
)
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
