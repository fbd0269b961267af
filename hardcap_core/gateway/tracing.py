"""OpenTelemetry traces of chat requests, exported over OTLP/HTTP (docs/tracing.md).

Imported only when tracing is on (``gateway.otlp_endpoint``, ``HARDCAP_OTLP_ENDPOINT`` or the
SDK's ``OTEL_EXPORTER_OTLP_*`` endpoint: :func:`hardcap_core.config.settings.env_overrides`):
the SDK costs a cold start tens of milliseconds, and a gateway without an endpoint never
imports it (tests/unit/test_cold_start_imports.py). With tracing off a request does nothing
more than find no trace in its scope.

One trace per chat request: a server span (``chat {model}``, the GenAI semantic conventions'
name) whose children are the admission (the queue and the admit script), one client span per
upstream attempt (the route, then its fallbacks, each with its position in the chain) and the
settle. The server span carries the GenAI attributes and Hardcap's own (tenant, key, user,
route, hold, what was charged, how the request ended) and ends when the request is settled, or
when its answer is sent if it never was (a refusal): either way before the last byte, since on
Lambda the environment may freeze once the response ends.

Export: a :class:`BatchSpanProcessor` (spans go out from its thread, off the request path), and
on Lambda a ``force_flush`` after each request's server span ends, awaited in a worker thread
before the last byte: a frozen environment runs no thread, and a span still in the batch would
wait for the next invocation or die with the environment. The flush is bounded
(:data:`FLUSH_TIMEOUT_MS`): an unreachable collector delays a reply by at most that.

Prompts and completions are never in a span unless the route opts in (``trace_content``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from contextvars import Token
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from hardcap_core.chat import OPENAI_EMBEDDINGS, ChatRequest
from hardcap_core.config import Principal, Route
from hardcap_core.errors import GatewayError
from hardcap_core.ledger import Admitted, Refused
from hardcap_core.outcome import Outcome
from hardcap_core.providers.http import TRACE_HEADERS

TRACES_PATH = "/v1/traces"  # where an OTLP/HTTP receiver takes spans, under its base URL
# How long a Lambda invocation waits for its spans to be exported before its last byte.
FLUSH_TIMEOUT_MS = 1000
# The exporter's own deadline for one POST (the SDK's default is 10 s).
EXPORT_TIMEOUT_S = 2.0
SERVICE_NAME = "hardcap"
# gen_ai.provider.name by upstream kind (the conventions' well-known values).
PROVIDER_NAMES = {"openai": "openai", "anthropic": "anthropic", "bedrock": "aws.bedrock"}
_PROPAGATOR = TraceContextTextMapPropagator()


def traces_url(endpoint: str) -> str:
    """The URL spans are POSTed to: ``endpoint`` if it names ``/v1/traces``, else that path
    under it (``OTEL_EXPORTER_OTLP_ENDPOINT``'s convention: a collector's base URL)."""
    if urlsplit(endpoint).path.rstrip("/").endswith(TRACES_PATH):
        return endpoint
    return endpoint.rstrip("/") + TRACES_PATH


def outcome_class(outcome: Outcome) -> str:
    """``hardcap.outcome`` of a settled request: completed, cut (the gateway stopped the
    provider) or failed (the provider failed or could not be reached, or the gateway did)."""
    if outcome is Outcome.COMPLETED:
        return "completed"
    return "cut" if outcome.cut else "failed"


class Tracing:
    """The process's tracer and exporter, built once (with the app); ``flush_each``: flush
    after every request (on Lambda)."""

    def __init__(self, endpoint: str, *, flush_each: bool) -> None:
        attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": SERVICE_NAME}
        self.provider = TracerProvider(resource=Resource.create(attributes))
        exporter = OTLPSpanExporter(endpoint=traces_url(endpoint), timeout=EXPORT_TIMEOUT_S)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("hardcap_core.gateway")
        self.flush_each = flush_each

    def begin(self, headers: Mapping[str, str], path: str, request_id: str) -> RequestTrace:
        """A trace for a chat request with these headers (its ``traceparent`` and
        ``tracestate``, if any, make it a child of the client's span)."""
        return RequestTrace(self, headers, path, request_id)

    async def flush(self) -> None:
        """Export what is batched now, waiting at most :data:`FLUSH_TIMEOUT_MS`."""
        await asyncio.to_thread(self.provider.force_flush, FLUSH_TIMEOUT_MS)

    def shutdown(self) -> None:
        """Export what is left and stop the exporter's thread (the server is stopping)."""
        self.provider.shutdown()


class Child:
    """A child span of a request's trace: the admission, an upstream attempt or the settle."""

    def __init__(self, span: Span, token: Token[Mapping[str, str] | None] | None = None) -> None:
        self.span = span
        self._token = token  # the upstream trace headers this attempt set, until detached
        self._ended = False

    def end(self, error: BaseException | None = None) -> None:
        """End the span (once), failed if ``error``."""
        if self._ended:
            return
        self._ended = True
        if error is not None:
            status = error.upstream_status if isinstance(error, GatewayError) else None
            if status is not None:
                self.span.set_attribute("http.response.status_code", status)
            self.span.set_attribute("error.type", type(error).__name__)
            self.span.set_status(Status(StatusCode.ERROR, str(error)))
        self.span.end()

    def detach(self) -> None:
        """Stop giving this attempt's trace headers to upstream requests."""
        if self._token is not None:
            TRACE_HEADERS.reset(self._token)
            self._token = None


class RequestTrace:
    """One chat request's spans (see the module's docstring)."""

    def __init__(
        self, tracing: Tracing, headers: Mapping[str, str], path: str, request_id: str
    ) -> None:
        self._tracing = tracing
        self.operation = "embeddings" if path.endswith("/embeddings") else "chat"
        parent = _PROPAGATOR.extract(headers)
        self.root = tracing.tracer.start_span(
            self.operation, context=parent, kind=SpanKind.SERVER,
            attributes={"gen_ai.operation.name": self.operation, "http.request.method": "POST",
                        "url.path": path, "hardcap.request_id": request_id},
        )  # fmt: skip
        self._context = trace.set_span_in_context(self.root, parent)
        self.content = False  # the route opted in to prompts and completions in its spans
        self.streaming = False  # the answer is a stream: its settle ends the trace
        self._settled = False
        self._ended = False
        self._refusal: str | None = None
        self._finish: str | None = None
        self._provider = ""

    def _child(self, name: str, kind: SpanKind, attributes: dict[str, Any]) -> Span:
        return self._tracing.tracer.start_span(
            name, context=self._context, kind=kind, attributes=attributes
        )

    def requested(self, chat: ChatRequest, route: Route, who: Principal, max_tokens: int) -> None:
        """What was asked, by whom, of which route (the output cap as the gateway applies it)."""
        self._provider = PROVIDER_NAMES.get(route.upstream.kind, route.upstream.kind)
        self.content = route.trace_content
        root = self.root
        root.update_name(f"{self.operation} {chat.model}")
        root.set_attributes({
            "gen_ai.request.model": chat.model, "gen_ai.provider.name": self._provider,
            "hardcap.route": route.name, "hardcap.tenant": who.tenant_id,
            "hardcap.key_id": who.key_id, "hardcap.stream": chat.stream,
        })  # fmt: skip
        if chat.dialect != OPENAI_EMBEDDINGS:
            root.set_attribute("gen_ai.request.max_tokens", max_tokens)
        if who.org_id:
            root.set_attribute("hardcap.org", who.org_id)
        if who.user:
            root.set_attribute("hardcap.user", who.user)
        if self.content:
            messages = chat.body.get("messages", chat.body.get("input"))
            root.set_attribute("gen_ai.input.messages", json.dumps(messages, default=str))

    def admit_span(self) -> Child:
        """The admission: the tenant's queue, if it waits, and the admit script."""
        return Child(self._child("hardcap.admit", SpanKind.INTERNAL, {"db.system.name": "valkey"}))

    def admitted(self, span: Child, waited_s: float, result: object) -> None:
        """The admission's answer (admitted, refused, or unguarded: the tenant failed open)."""
        wait_ms = round(waited_s * 1000, 3)
        attributes: dict[str, Any] = {"hardcap.queue_wait_ms": wait_ms}
        if isinstance(result, Refused):
            self._refusal = result.reason.value
            attributes["hardcap.refusal.reason"] = self._refusal
            attributes["hardcap.refusal.dimension"] = result.dimension
        elif isinstance(result, Admitted):
            attributes["hardcap.hold_tokens"] = result.reservation.output_reserved
        else:
            attributes["hardcap.budget"] = "unenforced"  # the budget server was unreachable
        span.span.set_attributes(attributes)
        self.root.set_attributes(attributes)
        span.end()

    def attempt(self, target: Route, position: int) -> Child:
        """An upstream attempt at ``target``, ``position`` in the route's chain (0: the route
        itself). Until it is detached, upstream requests carry its ``traceparent``."""
        parts = urlsplit(target.upstream.base_url)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": self.operation, "gen_ai.request.model": target.model,
            "gen_ai.provider.name": PROVIDER_NAMES.get(target.upstream.kind, target.upstream.kind),
            "hardcap.upstream": target.upstream.name, "hardcap.fallback.position": position,
            "hardcap.route": target.name,
        }  # fmt: skip
        if parts.hostname:
            attributes["server.address"] = parts.hostname
            attributes["server.port"] = parts.port or (443 if parts.scheme == "https" else 80)
        span = self._child(f"{self.operation} {target.model}", SpanKind.CLIENT, attributes)
        headers: dict[str, str] = {}
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span, self._context))
        return Child(span, TRACE_HEADERS.set(headers))

    def answered(self, span: Child) -> None:
        """The attempt's upstream answered with a success status."""
        span.span.set_attribute("http.response.status_code", 200)

    def finished(self, reason: str | None) -> None:
        """The provider's finish reason (a cut stream's is ``length``, as its client sees)."""
        self._finish = reason

    def output(self, completion: Any) -> None:
        """The completion, if the route opted in to content in its traces."""
        if self.content:
            text = (
                completion if isinstance(completion, str) else json.dumps(completion, default=str)
            )
            self.root.set_attribute("gen_ai.output.messages", text)

    def settle_span(self) -> Child:
        """The settle: the settle script (with its retries) and the estimator's sample."""
        return Child(self._child("hardcap.settle", SpanKind.INTERNAL, {"db.system.name": "valkey"}))

    async def settled(
        self,
        span: Child | None,
        outcome: Outcome,
        served: Route | None,
        context: Mapping[str, Any],
        *,
        estimated: bool,
    ) -> None:
        """The request was charged, ending as ``outcome``, served by ``served`` (the target
        tried last), by Hardcap's estimate if ``estimated``: ``context`` is its settle line's
        (gateway/metrics.py), whose fields the span reads."""
        finish = "length" if outcome.cut else self._finish
        attributes: dict[str, Any] = {
            "hardcap.outcome": outcome_class(outcome), "hardcap.settle.outcome": outcome.value,
            "hardcap.charged.input_tokens": context["input_tokens"],
            "hardcap.charged.output_tokens": context["output_tokens"],
            "hardcap.cost_usd": context["cost_nusd"] / 1e9,
            "hardcap.estimated": estimated,
            "hardcap.expiry_charged": context["expiry_charged"],
            "hardcap.queue_wait_ms": context["queue_wait_ms"],
            "gen_ai.usage.input_tokens": context["input_tokens"],
            "gen_ai.usage.output_tokens": context["output_tokens"],
        }  # fmt: skip
        if served is not None:
            attributes["gen_ai.response.model"] = served.model
            attributes["hardcap.upstream"] = served.upstream.name
        if finish:
            attributes["gen_ai.response.finish_reasons"] = [finish]
        if span is not None:
            span.span.set_attributes({"hardcap.settle.outcome": outcome.value})
            span.end()
        self.root.set_attributes(attributes)
        if outcome is not Outcome.COMPLETED and not outcome.cut:
            self.root.set_status(Status(StatusCode.ERROR, outcome.value))
        self._settled = True
        if self.streaming:
            await self._end()

    async def streams(self) -> None:
        """The answer is a stream, now open: its settle ends the trace."""
        self.streaming = True
        if self._settled:
            await self._end()

    async def end(self, status: int, error: GatewayError | None = None) -> None:
        """The answer was sent with ``status``: a request never settled was refused (before
        anything was generated), for ``error``'s reason or the admission's."""
        self.root.set_attribute("http.response.status_code", status)
        if not self._settled:
            self.root.set_attribute("hardcap.outcome", "refused")
            reason = self._refusal or (error.code if error is not None else None)
            if reason or status != 200:
                self.root.set_attribute("hardcap.refusal.reason", reason or str(status))
        if status >= 500:
            self.root.set_status(Status(StatusCode.ERROR, str(status)))
        await self._end()

    async def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self.root.end()
        if self._tracing.flush_each:
            await self._tracing.flush()
