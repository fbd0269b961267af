"""The HTTP client shared by every provider, and the one boundary where a transport's errors
and a provider's error statuses become errors a client can act on."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

from hardcap_core import json_codec, sse
from hardcap_core.errors import (
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    TooManyRequests,
    UpstreamFailed,
    UpstreamMalformed,
    UpstreamRefused,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from hardcap_core.events import Event, Read
from hardcap_core.logs import logger
from hardcap_core.providers.transport import (
    BadResponse,
    ConnectFailed,
    StreamReply,
    TimedOut,
    Transport,
    TransportError,
    UpstreamRequest,
)

# Provider errors a client can fix or act on are passed on with their status; anything else
# (a wrong provider key, a provider outage) is the gateway's problem: 502.
PASS_THROUGH = {
    400: InvalidRequest,
    413: PayloadTooLarge,
    422: InvalidRequest,
    429: TooManyRequests,
}
# 4xx statuses that are the provider's trouble, not the request's: counted by its breaker.
UPSTREAM_4XX = frozenset({408, 429})
# The W3C trace context (traceparent, tracestate) of the upstream attempt under way, set by the
# request's trace while tracing is on (gateway/tracing.py): every provider request built by
# :func:`post` carries it, so the provider's spans join the client's trace. Unset: no headers.
TRACE_HEADERS: ContextVar[Mapping[str, str] | None] = ContextVar("trace_headers", default=None)


def make_transport() -> Transport:
    """The process-wide transport: pooled keep-alive connections to every provider. Its TLS
    context (~30 ms: loading the CA bundle) is made by the first HTTPS request, or before a
    SnapStart snapshot (:meth:`Transport.prepare`)."""
    from hardcap_core.providers.aiohttp_transport import AiohttpTransport

    return AiohttpTransport()


def transport_error(upstream: str, e: TransportError) -> GatewayError:
    """A failure to reach the provider, or to get its answer in time, before any reply."""
    if isinstance(e, TimedOut):
        return UpstreamTimeout(f"The provider for '{upstream}' did not answer in time.")
    if isinstance(e, BadResponse):
        # Its status line or headers could not be read: no reply began that it could bill
        # (UpstreamMalformed is for a reply it generated), and another target may serve.
        return UpstreamFailed(
            f"The provider for '{upstream}' sent a reply the gateway cannot read."
        )
    message = f"The provider for '{upstream}' could not be reached."
    return UpstreamUnreachable(message) if isinstance(e, ConnectFailed) else UpstreamFailed(message)


def stream_error(e: TransportError) -> GatewayError:
    """A failure of the connection while the provider was streaming."""
    if isinstance(e, TimedOut):
        return UpstreamTimeout("The provider stopped sending in time.")
    logger.warning("stream failed", extra={"error": type(e).__name__, "detail": str(e)})
    if isinstance(e, BadResponse):
        return UpstreamMalformed("The provider sent a stream the gateway cannot read.")
    return UpstreamFailed("The provider connection failed mid-stream.")


def status_error(upstream: str, status: int, content: bytes) -> GatewayError:
    """The error a client gets for a provider's error status: a 4xx it can act on is passed
    on, anything else (a 5xx, a 3xx: nothing is followed) is the provider's failure, 502."""
    message = f"The provider for '{upstream}' answered {status}."
    try:
        detail = json.loads(content).get("error", {}).get("message")
        if isinstance(detail, str) and status in PASS_THROUGH:
            message = f"{message} {detail}"
    except (ValueError, AttributeError):
        pass
    refused = 400 <= status < 500 and status not in UPSTREAM_4XX
    cls = PASS_THROUGH.get(status, UpstreamRefused if refused else UpstreamFailed)
    code = "upstream_rate_limited" if status == 429 else None
    error = cls(message, code=code)
    error.upstream_status = status
    return error


def post(
    url: str,
    headers: Mapping[str, str],
    body: Any,
    timeout_s: float,
    head_timeout_s: float | None = None,
) -> UpstreamRequest:
    """A JSON POST; ``timeout_s`` bounds each wait for the provider's next bytes (a whole
    reply: all of it), ``head_timeout_s`` the wait for a stream's status and headers. It
    carries the trace context of the attempt under way, if tracing is on
    (:data:`TRACE_HEADERS`)."""
    if (trace := TRACE_HEADERS.get()) is not None:
        headers = {**headers, **trace}
    return UpstreamRequest(
        url, headers, json_codec.dumps(body), timeout_s, head_timeout_s=head_timeout_s
    )


async def send_json(transport: Transport, request: UpstreamRequest, route: str) -> dict[str, Any]:
    """Send a whole-reply request; its JSON object. A refusal or no answer raises the error
    the client gets; a 200 whose body is not a JSON object raises :class:`UpstreamMalformed`
    (the provider generated, and bills, it)."""
    try:
        reply = await transport.send(request)
    except TransportError as e:
        if e.answered:
            # It answered 200 and then broke off, stalled past the deadline or sent more than a
            # reply can be: it generated (and bills) the reply, which is charged, not retried.
            raise UpstreamMalformed(
                f"The provider for '{route}' began its reply but did not deliver it whole."
            ) from e
        raise transport_error(route, e) from e
    if not 200 <= reply.status < 300:
        # A 3xx too: the provider's API never redirects a POST, and one followed could send
        # the request (its key) elsewhere; nothing is followed, the body is not a reply.
        raise status_error(route, reply.status, reply.body)
    try:
        data = json_codec.loads(reply.body)
    except ValueError as e:
        raise UpstreamMalformed(f"Provider for '{route}' sent invalid JSON.") from e
    if not isinstance(data, dict):
        raise UpstreamMalformed(f"Provider for '{route}' sent an unexpected body.")
    return data


@asynccontextmanager
async def open_sse(
    transport: Transport,
    request: UpstreamRequest,
    route: str,
    decode: Callable[[str], Event],
) -> AsyncIterator[AsyncIterator[Read]]:
    """An open SSE stream: connects and checks the status on entry (raising the error the
    client gets), yields one batch of ``decode``d events per network read, and closes the
    connection on exit so the provider stops generating."""
    try:
        opened = transport.stream(request)
        response = await opened.__aenter__()
    except TransportError as e:
        raise transport_error(route, e) from e
    reads = _sse_reads(response, decode)
    try:
        if not 200 <= response.status < 300:  # a 3xx is an error too (send_json)
            try:
                content = await response.aread()
            except TransportError:
                content = b""
            raise status_error(route, response.status, content)
        yield reads
    finally:
        await reads.aclose()
        await opened.__aexit__(None, None, None)


async def _sse_reads(
    response: StreamReply, decode: Callable[[str], Event]
) -> AsyncGenerator[Read, None]:
    """One batch of events per wake-up: everything that arrived since the last."""
    parser = sse.SSEParser()
    try:
        async for piece in response.reads():
            yield [decode(data) for data in parser.feed(piece)]
    except TransportError as e:
        raise stream_error(e) from e
    except sse.EventTooLarge as e:
        # A line with no end, or an event without a blank line after it: nothing more of this
        # stream can be read, and holding more of it would grow memory without a bound.
        logger.warning("stream failed", extra={"error": "EventTooLarge", "detail": str(e)})
        raise UpstreamMalformed("The provider sent an event larger than the gateway reads.") from e
    tail = [decode(data) for data in parser.flush()]
    if tail:
        yield tail
