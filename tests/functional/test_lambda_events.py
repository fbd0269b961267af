"""The sample function URL events in ``events/`` through the buffered (Mangum) handler.

The handler module is loaded as Lambda loads it, once, from ``functions/gateway/buffered.py``
with HARDCAP_CONFIG pointing at the demo config (hardcap_core/local/demo.yaml) rewired to the mock
upstream and a real Valkey. It runs in one worker thread: Mangum drives the thread's own event
loop, the one the handler's clients stay bound to between invocations, as on Lambda.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from tests.lambda_handler import (
    EVENTS,
    ROOT,
    LambdaHandler,
    demo_config,
    lambda_handler,
    load_event,
)
from tests.stack import Mock

HANDLER = ROOT / "functions" / "gateway" / "buffered.py"

Invoke = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass
class FakeContext:
    """The attributes of a Lambda context object that Mangum and the handler use."""

    remaining_ms: int = 300_000
    function_name: str = "hardcap-gateway"
    function_version: str = "$LATEST"
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:hardcap-gateway"
    memory_limit_in_mb: int = 512
    aws_request_id: str = "3f0c2a9e-5b8d-4e21-9c1f-7a6d5e4b3c2a"
    log_group_name: str = "/aws/lambda/hardcap-gateway"
    log_stream_name: str = "2026/11/29/[$LATEST]0123456789abcdef"
    identity: Any = None
    client_context: Any = None
    _started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms - int((time.monotonic() - self._started) * 1000)


def body_of(response: dict[str, Any]) -> str:
    body: str = response.get("body") or ""
    if response.get("isBase64Encoded"):
        return base64.b64decode(body).decode()
    return body


def sse_payloads(body: str) -> list[str]:
    return [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0.0, seed=7))
    yield m
    m.stop()


@pytest.fixture(scope="module")
def handler_module(
    valkey: LocalValkey, mock: Mock, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LambdaHandler]:
    """buffered.py imported once, in its own thread, against the demo config."""
    path, _ = demo_config(tmp_path_factory.mktemp("lambda"), mock.url)
    with gateway_handler(valkey, path, "buffered") as handler:
        yield handler


@contextmanager
def gateway_handler(valkey: LocalValkey, config: Path, name: str) -> Iterator[LambdaHandler]:
    """The gateway's buffered handler, imported as ``name``, on the config file ``config``
    (:func:`~tests.lambda_handler.demo_config`) and the cache ``valkey`` (flushed first); its
    clients closed after."""
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    with pytest.MonkeyPatch.context() as env:
        for variable, value in {
            "HARDCAP_CONFIG": str(config),
            "HARDCAP_REDIS_URL": valkey.url,
            "HARDCAP_REDIS_CLUSTER": "false",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
        }.items():
            env.setenv(variable, value)
        with lambda_handler(HANDLER, f"hardcap_{name}_under_test", FakeContext) as handler:
            yield handler
            handler.close_gateway()


@pytest.fixture
def invoke(handler_module: LambdaHandler) -> Invoke:
    return handler_module.invoke


def test_streaming_completion(invoke: Invoke) -> None:
    response = invoke(load_event("function-url-chat-stream"))
    assert response["statusCode"] == 200, body_of(response)
    assert response["headers"]["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(body_of(response))
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")
    )
    assert text
    usage = chunks[-1]["usage"]  # stream_options.include_usage: the last chunk
    assert usage["completion_tokens"] > 0
    assert usage["completion_tokens"] <= 64  # the event's max_tokens


def test_completion(invoke: Invoke) -> None:
    response = invoke(load_event("function-url-chat"))
    assert response["statusCode"] == 200, body_of(response)
    body = json.loads(body_of(response))
    assert body["object"] == "chat.completion"
    assert body["model"] == "demo"
    assert body["choices"][0]["message"]["content"]
    assert 0 < body["usage"]["completion_tokens"] <= 64
    assert "x-request-id" in response["headers"]


def test_usage_counts_a_completion(invoke: Invoke) -> None:
    def tenant_used() -> int:
        response = invoke(load_event("function-url-usage"))
        assert response["statusCode"] == 200, body_of(response)
        body = json.loads(body_of(response))
        assert body["object"] == "hardcap.usage"
        assert (body["tenant"], body["key"], body["org"]) == ("alpha", "alpha-dev", "acme")
        # hardcap_core/local/demo.yaml: alpha's one total_tokens budget (20000 a day).
        rows = [
            r for r in body["budgets"]
            if (r["level"], r["dimension"]) == ("tenant", "total_tokens")
        ]  # fmt: skip
        assert [r["limit"] for r in rows] == [20000]
        return int(rows[0]["used"])

    before = tenant_used()
    completion = json.loads(body_of(invoke(load_event("function-url-chat"))))
    assert tenant_used() == before + completion["usage"]["total_tokens"]


def test_bad_key_is_an_openai_401(invoke: Invoke) -> None:
    response = invoke(load_event("function-url-bad-key"))
    assert response["statusCode"] == 401
    error = json.loads(body_of(response))["error"]
    assert error["type"] == "authentication_error"
    assert error["code"] == "invalid_api_key"
    assert set(error) == {"message", "type", "code", "param"}
    assert "sk-this-key-is-not-configured" not in error["message"]  # never echo a key


def test_client_cannot_choose_the_deadline(handler_module: LambdaHandler) -> None:
    """The handler sets x-amzn-lambda-context from the context, over any client value."""
    module = handler_module.module
    event = load_event("function-url-chat")
    event["headers"]["X-Amzn-Lambda-Context"] = json.dumps({"deadline": 9_999_999_999_999})
    before_ms = int(time.time() * 1000)
    module._stamp_deadline(event, FakeContext(remaining_ms=120_000))
    names = [n for n in event["headers"] if n.lower() == "x-amzn-lambda-context"]
    assert names == ["x-amzn-lambda-context"]
    stamped = json.loads(event["headers"]["x-amzn-lambda-context"])
    assert before_ms + 119_000 <= stamped["deadline"] <= int(time.time() * 1000) + 120_000
    assert stamped["request_id"] == FakeContext().aws_request_id


@pytest.mark.parametrize("name", sorted(p.stem for p in EVENTS.glob("function-url-*.json")))
def test_sample_events_are_real_shaped(name: str) -> None:
    """What Lambda sends for a function URL (payload format 2.0), consistent in itself."""
    event = load_event(name)
    assert (event["version"], event["routeKey"]) == ("2.0", "$default")
    ctx = event["requestContext"]
    assert ctx["http"]["path"] == event["rawPath"]
    assert (
        ctx["domainName"]
        == event["headers"]["host"]
        == f"{ctx['domainPrefix']}" + (".lambda-url.us-east-1.on.aws")
    )
    assert ctx["http"]["sourceIp"] == event["headers"]["x-forwarded-for"]
    assert all(k == k.lower() for k in event["headers"]), "function URLs lower-case headers"
    if "body" in event:
        body = event["body"]
        raw = base64.b64decode(body) if event["isBase64Encoded"] else body.encode()
        assert int(event["headers"]["content-length"]) == len(raw)
        assert ctx["http"]["method"] == "POST"
    else:
        assert ctx["http"]["method"] == "GET"
