"""Traces end to end: the gateway exports its spans over OTLP/HTTP to a real receiver on
127.0.0.1, which decodes them with opentelemetry-proto as a collector would.

The official `openai` SDK sends, each with its own W3C ``traceparent``, a completed request, a
stream the budget cuts and a request the budget refuses. What an operator would notice if each
failed: the request is missing from their tracing backend, or cannot be joined with the
client's trace or the provider's; its spans do not say what it was charged or why it was cut
or refused; or a prompt lands in a third party's span store.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.stack import start_gateway
from hardcap_core.local.valkey import LocalValkey
from tests.stack import KEYS, Mock, config_data, gateway_thread

SECRET = "zebra-quartz-7781"  # in every prompt: it must appear in no span but an opted-in one
# The client's trace context, one trace per request: version 00, trace id, parent id, sampled.
CLIENT = {
    "completed": ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"),
    "cut": ("1bf7651916cd43dd8448eb211c80319d", "c7ad6b7169203332"),
    "refused": ("2cf7651916cd43dd8448eb211c80319e", "d7ad6b7169203333"),
    "content": ("3df7651916cd43dd8448eb211c80319f", "e7ad6b7169203334"),
}


class Receiver:
    """An OTLP/HTTP trace receiver: ``POST /v1/traces`` with a protobuf body."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                with receiver._lock:
                    receiver.paths.append(self.path)
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            receiver.spans.extend(scope.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # no line per export on the test's stderr

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def of_trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id.hex() == trace_id]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attributes(span: Span) -> dict[str, Any]:
    return {a.key: value(a.value) for a in span.attributes}


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0.5, seed=7))
    yield m
    m.stop()


@pytest.fixture(scope="module")
def traced(mock: Mock, valkey: LocalValkey) -> Iterator[tuple[Receiver, dict[str, Any]]]:
    """The four requests through a traced gateway on a 60-output-token budget; the receiver
    once the gateway has stopped (its shutdown exports every span left), and what the
    requests answered."""
    import redis

    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    receiver = Receiver()
    budget = [{"dimension": "output_tokens", "limit": 60, "window": "day"}]
    data = config_data(mock.url, valkey.url, **{"tenants.0.budgets": budget})
    data["gateway"]["otlp_endpoint"] = receiver.url  # the base URL: /v1/traces is added
    data["routes"][3]["trace_content"] = True  # route "allow" opts in
    answers: dict[str, Any] = {}
    with gateway_thread(data) as base:
        client = openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0)

        def headers(name: str) -> dict[str, str]:
            trace_id, parent = CLIENT[name]
            return {"traceparent": f"00-{trace_id}-{parent}-01", "tracestate": "client=1"}

        ask = [{"role": "user", "content": f"{SECRET} [mock:tokens=5]"}]
        answers["completed"] = client.chat.completions.with_raw_response.create(
            model="small", messages=ask, max_tokens=10, extra_headers=headers("completed")
        )
        ask = [{"role": "user", "content": f"{SECRET} [mock:tokens=3]"}]
        answers["content"] = client.chat.completions.create(
            model="allow", messages=ask, max_tokens=8, extra_headers=headers("content")
        )
        ask = [{"role": "user", "content": f"{SECRET} [mock:tokens=400]"}]
        stream = client.chat.completions.create(
            model="small", messages=ask, max_tokens=400, stream=True,
            extra_headers=headers("cut"),
        )  # fmt: skip
        answers["cut"] = [c.choices[0].finish_reason for c in stream if c.choices]
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(
                model="small", messages=ask, max_tokens=400, extra_headers=headers("refused")
            )
        answers["refused"] = refused.value
        answers["traceparents"] = mock.http.get("/mock/traceparents").json()
        client.close()
    yield receiver, answers
    receiver.stop()


def server_span(spans: list[Span]) -> Span:
    (root,) = [s for s in spans if s.kind == Span.SPAN_KIND_SERVER]
    return root


def children(spans: list[Span], root: Span) -> dict[str, list[Span]]:
    named: dict[str, list[Span]] = {}
    for s in spans:
        if s is not root:
            assert s.parent_span_id == root.span_id, s.name  # every one a child of the request
            named.setdefault(s.name, []).append(s)
    return named


def test_spans_are_posted_to_the_receivers_traces_path(
    traced: tuple[Receiver, dict[str, Any]],
) -> None:
    receiver, _ = traced
    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}


def test_a_completed_request_is_one_trace_joined_to_the_clients_and_the_providers(
    traced: tuple[Receiver, dict[str, Any]],
) -> None:
    receiver, answers = traced
    trace_id, parent = CLIENT["completed"]
    spans = receiver.of_trace(trace_id)
    root = server_span(spans)
    assert root.parent_span_id.hex() == parent  # the client's span is its parent
    assert root.name == "chat small"
    named = children(spans, root)
    assert set(named) == {"hardcap.admit", "chat mock-small", "hardcap.settle"}
    (attempt,) = named["chat mock-small"]
    assert attempt.kind == Span.SPAN_KIND_CLIENT
    a = attributes(attempt)
    assert a["server.address"] == "127.0.0.1" and a["http.response.status_code"] == 200
    assert a["hardcap.fallback.position"] == 0 and a["gen_ai.request.model"] == "mock-small"
    # The provider got the attempt's context: the same trace, the attempt span as parent.
    sent = f"00-{trace_id}-{attempt.span_id.hex()}-01"
    assert sent in answers["traceparents"]
    r = attributes(root)
    reply = answers["completed"]
    charged_out = reply.parse().usage.completion_tokens
    assert {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "small", "gen_ai.response.model": "mock-small",
        "gen_ai.request.max_tokens": 10, "gen_ai.response.finish_reasons": ["stop"],
        "hardcap.tenant": "alpha", "hardcap.key_id": "alpha-k", "hardcap.route": "small",
        "hardcap.hold_tokens": 10, "hardcap.outcome": "completed",
        "hardcap.settle.outcome": "completed", "hardcap.queue_wait_ms": 0,
        "gen_ai.usage.output_tokens": charged_out,
        "hardcap.charged.output_tokens": charged_out,
        "http.response.status_code": 200,
    }.items() <= r.items()  # fmt: skip
    assert charged_out == 5
    assert r["gen_ai.usage.input_tokens"] == r["hardcap.charged.input_tokens"] > 0
    charged = r["hardcap.charged.input_tokens"] + r["hardcap.charged.output_tokens"]
    assert charged == int(reply.headers["x-hardcap-tokens-charged"])
    assert r["hardcap.cost_usd"] == pytest.approx(float(reply.headers["x-hardcap-cost-usd"]))
    # Each child lies within the request's span, in the order the gateway ran them.
    admit, settle = named["hardcap.admit"][0], named["hardcap.settle"][0]
    assert root.start_time_unix_nano <= admit.start_time_unix_nano
    assert admit.end_time_unix_nano <= attempt.start_time_unix_nano
    assert attempt.end_time_unix_nano <= settle.start_time_unix_nano
    assert settle.end_time_unix_nano <= root.end_time_unix_nano


def test_a_stream_the_budget_cuts_says_so(traced: tuple[Receiver, dict[str, Any]]) -> None:
    receiver, answers = traced
    assert answers["cut"][-1] == "length"
    trace_id, parent = CLIENT["cut"]
    spans = receiver.of_trace(trace_id)
    root = server_span(spans)
    assert root.parent_span_id.hex() == parent
    named = children(spans, root)
    assert set(named) == {"hardcap.admit", "chat mock-small", "hardcap.settle"}
    r = attributes(root)
    assert r["hardcap.outcome"] == "cut" and r["hardcap.settle.outcome"] == "truncated"
    assert r["gen_ai.response.finish_reasons"] == ["length"]
    assert r["hardcap.stream"] is True
    # What the hold allowed, at most what was left of the 60-token budget after the first two.
    assert 0 < r["hardcap.charged.output_tokens"] <= 60 - 5 - 3
    (attempt,) = named["chat mock-small"]
    assert f"00-{trace_id}-{attempt.span_id.hex()}-01" in answers["traceparents"]


def test_a_refused_request_says_why_and_calls_no_upstream(
    traced: tuple[Receiver, dict[str, Any]],
) -> None:
    receiver, answers = traced
    trace_id, parent = CLIENT["refused"]
    spans = receiver.of_trace(trace_id)
    root = server_span(spans)
    assert root.parent_span_id.hex() == parent
    named = children(spans, root)
    assert set(named) == {"hardcap.admit"}  # no attempt, no settle
    r = attributes(root)
    assert r["hardcap.outcome"] == "refused" and r["http.response.status_code"] == 429
    assert r["hardcap.refusal.reason"] == answers["refused"].body["code"]
    assert (
        attributes(named["hardcap.admit"][0])["hardcap.refusal.reason"]
        == r["hardcap.refusal.reason"]
    )
    assert not any(trace_id in tp for tp in answers["traceparents"])


def test_no_prompt_or_completion_is_in_a_span_unless_the_route_opts_in(
    traced: tuple[Receiver, dict[str, Any]],
) -> None:
    receiver, answers = traced
    opted = CLIENT["content"][0]
    for span in receiver.spans:
        for v in attributes(span).values():
            if span.trace_id.hex() != opted:
                assert SECRET not in str(v), span.name
    root = attributes(server_span(receiver.of_trace(opted)))
    assert SECRET in root["gen_ai.input.messages"]
    reply = answers["content"].choices[0].message.content
    assert reply and reply in root["gen_ai.output.messages"]


def test_hardcap_serve_otlp_exports_each_request(
    mock: Mock, valkey: LocalValkey, tmp_path: Path
) -> None:
    """``hardcap serve --otlp URL``, the local way to see traces: a request's spans reach the
    collector by the time the gateway has shut down (SIGTERM, as Ctrl-C)."""
    receiver = Receiver()
    try:
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config_data(mock.url, valkey.url)))
        service = start_gateway(path, tmp_path, options=["--otlp", receiver.url])
        try:
            client = openai.OpenAI(base_url=f"{service.url}/v1", api_key=KEYS["beta"])
            trace_id, parent = CLIENT["completed"]
            client.chat.completions.create(
                model="small", messages=[{"role": "user", "content": "hi [mock:tokens=2]"}],
                max_tokens=5, extra_headers={"traceparent": f"00-{trace_id}-{parent}-01"},
            )  # fmt: skip
            client.close()
        finally:
            service.stop()
        (root,) = [s for s in receiver.of_trace(trace_id) if s.kind == Span.SPAN_KIND_SERVER]
        assert attributes(root)["hardcap.tenant"] == "beta"
        assert "traces to" in service.log.read_text()
    finally:
        receiver.stop()
