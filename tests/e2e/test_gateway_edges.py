"""What every response carries and every route answers, whatever the path: request ids, the
OpenAI error shape on routes the app does not serve, budget headers, and a provider that
compresses its stream although asked not to."""

from __future__ import annotations

import io
import logging
import socket
import time

import httpx
import openai
import pytest

from hardcap_core.logs import logger
from tests.stack import KEYS, Mock

AUTH = {"authorization": f"Bearer {KEYS['alpha']}"}


def root(base: str) -> str:
    return base.removesuffix("/v1")


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/healthz", 200),
        ("GET", "/v1/models", 200),
        ("GET", "/v1/no-such-route", 404),
        ("GET", "/v1/chat/completions", 405),
        ("POST", "/v1/chat/completions", 400),
        ("GET", "/v1/hardcap/usage", 200),
        ("POST", "/v1/messages", 400),
        ("GET", "/v1/messages", 405),
        ("POST", "/v1/messages/batches", 404),
    ],
)
def test_every_response_has_a_request_id(base: str, method: str, path: str, status: int) -> None:
    r = httpx.request(method, root(base) + path, headers=AUTH, content=b"{}")
    assert r.status_code == status
    assert len(r.headers["x-request-id"]) == 32  # a fresh uuid4 hex
    assert r.headers["request-id"] == r.headers["x-request-id"]  # the name Anthropic's SDKs read
    echoed = httpx.request(
        method, root(base) + path, headers={**AUTH, "x-request-id": "client-42.a:b"}, content=b"{}"
    )
    assert echoed.headers["x-request-id"] == echoed.headers["request-id"] == "client-42.a:b"


def test_an_oversized_or_odd_request_id_is_replaced_not_echoed(base: str) -> None:
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logger.registered_formatter)
    logger.addHandler(handler)
    try:
        for presented in ("x" * 8000, "has space", 'quote"d', "x" * 129):
            r = httpx.get(f"{base}/models", headers={**AUTH, "x-request-id": presented})
            assert r.status_code == 200
            assert r.headers["x-request-id"] != presented
            assert len(r.headers["x-request-id"]) <= 128
    finally:
        logger.removeHandler(handler)
    assert "x" * 129 not in buffer.getvalue()


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/nope", 404, "not_found"),
        ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
        ("DELETE", "/v1/models", 405, "method_not_allowed"),
        ("POST", "/healthz", 405, "method_not_allowed"),
    ],
)
def test_unserved_routes_answer_in_the_openai_error_shape(
    base: str, method: str, path: str, status: int, code: str
) -> None:
    r = httpx.request(method, root(base) + path, headers=AUTH)
    assert r.status_code == status
    error = r.json()["error"]
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "code", "param"}
    if status == 405:
        assert r.headers["allow"]
        assert method in error["message"]


def test_the_sdk_raises_its_own_errors_for_unserved_routes(base: str) -> None:
    with openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as raised:
            client.get("/nope", cast_to=object)
        assert raised.value.code == "not_found"


def test_models_carries_budget_headers(base: str) -> None:
    r = httpx.get(f"{base}/models", headers=AUTH)
    assert r.status_code == 200
    assert {m["id"] for m in r.json()["data"]} >= {"small", "p95"}
    # alpha: 1,000,000 total tokens a day, nothing spent yet.
    assert r.headers["x-token-budget-limit"] == "1000000"
    assert r.headers["x-token-budget-remaining"] == "1000000"
    assert r.headers["x-ratelimit-remaining-tokens"] == "1000000"


def test_a_stream_the_provider_gzips_anyway_reaches_the_client_intact(
    base: str, mock: Mock
) -> None:
    """httpx asks for gzip by default and the relay used to parse raw bytes: a compressed
    stream reached the SSE parser undecoded and the client got a broken stream."""
    with openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0) as client:
        chunks = list(
            client.chat.completions.create(
                model="small",
                messages=[{"role": "user", "content": "hi [mock:gzip=1] [mock:tokens=30]"}],
                stream=True,
                stream_options={"include_usage": True},
                user="alpha",
            )
        )
    pieces = [c.choices[0].delta.content for c in chunks if c.choices]
    assert len([p for p in pieces if p]) == 30  # the mock streams one token per chunk
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["stop"]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 30 == mock.truth("alpha")["completion_tokens"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v1/messages", "POST"),
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/v1/messages/count_tokens", "POST"),
        ("POST", "/v1/models", "GET"),
    ],
)
def test_a_405_names_the_methods_allowed(base: str, method: str, path: str, allowed: str) -> None:
    """It said "use ." (the Allow header was read under a name of another case)."""
    r = httpx.request(method, root(base) + path, headers=AUTH)
    assert r.status_code == 405
    assert allowed in r.headers["allow"].split(", ")
    message = r.json()["error"]["message"]
    assert f"{method} is not allowed on {path}; use {r.headers['allow']}." == message


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens"]
)
def test_a_client_that_leaves_mid_upload_is_an_info_line_not_an_error(
    base: str, mock: Mock, path: str
) -> None:
    """It was logged as an unhandled error, with a traceback (starlette's ClientDisconnect)."""
    captured = Captured()
    loggers = [logging.getLogger("uvicorn.error"), logging.getLogger()]
    logger.addHandler(captured)
    for each in loggers:
        each.addHandler(captured)
    try:
        url = httpx.URL(root(base))
        sock = socket.create_connection((url.host, url.port or 80))
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {url.host}\r\nAuthorization: {AUTH['authorization']}"
            "\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n".encode()
            + b'{"model": "small", "messages": [{"role": "user", "content": "half a bo'
        )
        time.sleep(0.2)  # the gateway is reading the body
        sock.close()
        deadline = time.monotonic() + 5
        while not [r for r in captured.records if getattr(r, "path", None) == path]:
            assert time.monotonic() < deadline, "the request was never logged"
            time.sleep(0.02)
    finally:
        logger.removeHandler(captured)
        for each in loggers:
            each.removeHandler(captured)
    errors = [r for r in captured.records if r.levelno >= logging.WARNING or r.exc_info]
    assert errors == []
    line = next(r for r in captured.records if getattr(r, "path", None) == path)
    assert line.levelno == logging.INFO and getattr(line, "status", None) == 499
    assert mock.truth("alpha") == {}
