"""Every error a client can meet: the status, the OpenAI shape, the matching SDK exception, and
that a refused or failed request charges nothing and leaks no reservation."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
import redis

from hardcap_core.local.valkey import LocalValkey, free_port
from tests.stack import KEYS, Mock, config_data, gateway_thread

HI = [{"role": "user", "content": "hello"}]


@pytest.fixture
def sdk() -> Iterator[Callable[..., openai.OpenAI]]:
    """Make SDK clients; each is closed after the test (no leaked keep-alive sockets)."""
    made: list[openai.OpenAI] = []

    def make(base: str, key: str = KEYS["alpha"]) -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=base, api_key=key, max_retries=0))
        return made[-1]

    yield make
    for c in made:
        c.close()


def nothing_charged(base: str, key: str = KEYS["alpha"]) -> None:
    r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {key}"})
    body = r.json()
    assert body["live_reservations"] == 0
    for row in body["budgets"]:
        assert (row["used"], row["reserved"]) == (0, 0), row


def post(base: str, body: bytes | str, key: str | None = KEYS["alpha"]) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(f"{base}/chat/completions", content=body, headers=headers)


BAD_BODIES = [
    ("invalid JSON", b'{"model": "small", "messages": [', None),
    ("not an object", b"[1, 2]", None),
    ("missing messages", b'{"model": "small"}', "messages"),
    ("empty messages", b'{"model": "small", "messages": []}', "messages"),
    ("messages wrong type", b'{"model": "small", "messages": "hi"}', "messages"),
    ("bad role", b'{"model": "small", "messages": [{"role": "robot"}]}', "messages[0].role"),
    ("missing model", b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
    ("model wrong type", b'{"model": 5, "messages": [{"role": "user", "content": "x"}]}', "model"),
    (
        "stream wrong type",
        b'{"model":"small","stream":"yes","messages":[{"role":"user","content":"x"}]}',
        "stream",
    ),
    (
        "max_tokens string",
        b'{"model":"small","max_tokens":"9","messages":[{"role":"user","content":"x"}]}',
        "max_tokens",
    ),
    (
        "max_tokens negative",
        b'{"model":"small","max_tokens":-5,"messages":[{"role":"user","content":"x"}]}',
        "max_tokens",
    ),
    (
        "max_tokens absurd",
        b'{"model":"small","max_tokens":10000000,"messages":[{"role":"user","content":"x"}]}',
        "max_tokens",
    ),
    ("n > 1", b'{"model":"small","n":3,"messages":[{"role":"user","content":"x"}]}', "n"),
]


@pytest.mark.parametrize(("case", "body", "param"), BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
def test_bad_input_is_a_clear_400_and_costs_nothing(
    base: str, mock: Mock, case: str, body: bytes, param: str | None
) -> None:
    r = post(base, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    assert error["param"] == param
    assert r.headers["x-token-budget-remaining"]  # budget headers on errors too
    nothing_charged(base)
    assert mock.truth("alpha") == {}


def test_sdk_raises_bad_request_naming_the_field(
    base: str, sdk: Callable[..., openai.OpenAI]
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        sdk(base).chat.completions.create(model="small", messages=HI, max_tokens=999_999)
    assert e.value.param == "max_tokens"
    nothing_charged(base)


def test_missing_and_unknown_keys(base: str, sdk: Callable[..., openai.OpenAI]) -> None:
    r = post(base, b"{}", key=None)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "missing_api_key"
    with pytest.raises(openai.AuthenticationError) as e:
        sdk(base, "sk-not-a-key").chat.completions.create(model="small", messages=HI)
    assert e.value.code == "invalid_api_key"
    r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": "Bearer nope"})
    assert r.status_code == 401


def test_unknown_model_is_404_and_a_forbidden_one_403(
    base: str, sdk: Callable[..., openai.OpenAI]
) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        sdk(base).chat.completions.create(model="gpt-nope", messages=HI)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.PermissionDeniedError):
        sdk(base, KEYS["beta"]).chat.completions.create(model="reason", messages=HI)
    nothing_charged(base)
    nothing_charged(base, KEYS["beta"])


def test_oversized_body_is_413(base: str) -> None:
    big = '{"model":"small","messages":[{"role":"user","content":"' + "x" * 300_000 + '"}]}'
    r = post(base, big)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    nothing_charged(base)


def _gateway(valkey: LocalValkey, mock: Mock, **overrides: Any) -> Any:
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    return gateway_thread(config_data(mock.url, valkey.url, **overrides))


def _holding_stream(c: openai.OpenAI, tokens: int, pace_ms: int) -> Any:
    """A stream with max_tokens 280: it holds nearly all of a 300-token budget while it runs
    (``tokens`` tokens, one per ``pace_ms``)."""
    text = f"x [mock:tokens={tokens}] [mock:pace_ms={pace_ms}]"
    return c.chat.completions.create(
        model="small",
        messages=[{"role": "user", "content": text}],
        max_tokens=280,
        stream=True,
        user="alpha",
    )


def test_budget_busy_then_exceeded(
    valkey: LocalValkey, mock: Mock, sdk: Callable[..., openai.OpenAI]
) -> None:
    budgets = [{"dimension": "total_tokens", "limit": 300, "window": "day"}]
    # This tenant does not wait in the admission queue: busy is answered at once.
    overrides = {"tenants.0.budgets": budgets, "tenants.0.queue_wait_seconds": 0}
    with _gateway(valkey, mock, **overrides) as url:
        c = sdk(url)
        # A stream with max_tokens 280 holds nearly all of the 300 while it runs ...
        stream = _holding_stream(c, 5, 300)
        # ... so another request is busy (it would fit with nothing in flight), not exceeded.
        with pytest.raises(openai.RateLimitError) as busy:
            c.chat.completions.create(model="small", messages=HI, max_tokens=100)
        assert busy.value.code == "budget_busy"
        assert busy.value.response.headers["retry-after"] == "1"
        assert busy.value.response.headers["x-hardcap-queue-wait-ms"] == "0"
        list(stream)  # settles at what it really used: the hold is released
        spend = [{"role": "user", "content": "x [mock:tokens=270]"}]
        c.chat.completions.create(model="small", messages=spend, max_tokens=280, user="alpha")
        with pytest.raises(openai.RateLimitError) as spent:
            c.chat.completions.create(model="small", messages=HI, max_tokens=1024)
        assert spent.value.code == "budget_exceeded"
        assert "tenant alpha" in spent.value.message
        assert int(spent.value.response.headers["retry-after"]) > 1
        assert (
            spent.value.response.headers["x-token-budget-remaining"] == "0"
            or int(spent.value.response.headers["x-token-budget-remaining"]) < 16
        )
        truth = mock.truth("alpha")
        assert truth["total_tokens"] <= 300


def test_a_request_larger_than_the_whole_budget_is_told_so_and_not_to_retry(
    valkey: LocalValkey, mock: Mock, sdk: Callable[..., openai.OpenAI]
) -> None:
    """It was refused as 'spent for this window, resets in 15 h' with that Retry-After,
    though nothing had been spent."""
    budgets = [{"dimension": "total_tokens", "limit": 300, "window": "day"}]
    with _gateway(valkey, mock, **{"tenants.0.budgets": budgets}) as url:
        big = [{"role": "user", "content": "budget " * 2000}]
        with pytest.raises(openai.RateLimitError) as refused:
            sdk(url).chat.completions.create(model="small", messages=big, max_tokens=10)
        assert refused.value.code == "budget_exceeded"
        assert "larger than the whole" in refused.value.message
        headers = refused.value.response.headers
        assert "retry-after" not in headers and "retry-after-ms" not in headers
        assert headers["x-should-retry"] == "false"
        nothing_charged(url)
        # A request that fits the untouched budget still goes through.
        sdk(url).chat.completions.create(model="small", messages=HI, max_tokens=10)


def test_rate_limited(valkey: LocalValkey, mock: Mock, sdk: Callable[..., openai.OpenAI]) -> None:
    with _gateway(valkey, mock, **{"tenants.1.rate_limits": {"requests_per_minute": 2}}) as url:
        c = sdk(url, KEYS["beta"])
        for _ in range(2):
            c.chat.completions.create(model="small", messages=HI, max_tokens=5)
        with pytest.raises(openai.RateLimitError) as limited:
            c.chat.completions.create(model="small", messages=HI, max_tokens=5)
        assert limited.value.code == "rate_limited"
        headers = limited.value.response.headers
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert 1 <= int(headers["retry-after"]) <= 60
        assert headers["x-should-retry"] == "true"  # a minute at most: the SDK may sleep it


def test_provider_errors_map_to_502_and_504_and_charge_nothing(
    valkey: LocalValkey, mock: Mock, sdk: Callable[..., openai.OpenAI]
) -> None:
    with _gateway(valkey, mock) as url:
        c = sdk(url)
        fail = [{"role": "user", "content": "x [mock:status=503]"}]
        for stream in (False, True):
            with pytest.raises(openai.InternalServerError) as e:
                c.chat.completions.create(model="small", messages=fail, stream=stream)
            assert e.value.status_code == 502
        slow = [{"role": "user", "content": "x [mock:tokens=3] [mock:pace_ms=8000]"}]
        with pytest.raises(openai.APIStatusError) as timeout:
            c.chat.completions.create(model="small", messages=slow, timeout=30)
        assert timeout.value.status_code == 504
        nothing_charged(url)


def test_provider_unreachable_is_502(
    valkey: LocalValkey, mock: Mock, sdk: Callable[..., openai.OpenAI]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with _gateway(valkey, mock, **{"upstreams.0.base_url": f"{dead}/v1"}) as url:
        with pytest.raises(openai.InternalServerError) as e:
            sdk(url).chat.completions.create(model="small", messages=HI, stream=True)
        assert e.value.status_code == 502
        nothing_charged(url)


def test_budget_server_down_fails_closed_or_open_per_tenant(
    mock: Mock, sdk: Callable[..., openai.OpenAI]
) -> None:
    server = LocalValkey().start()
    url = server.url
    server.stop()  # nothing listens there now
    with gateway_thread(config_data(mock.url, url)) as base:
        with pytest.raises(openai.InternalServerError) as e:
            sdk(base).chat.completions.create(model="small", messages=HI)
        assert e.value.status_code == 503
        assert e.value.code == "ledger_unavailable"
        done = sdk(base, KEYS["open"]).chat.completions.create(
            model="small", messages=HI, user="open"
        )
        assert done.choices[0].message.content
        # The p95 estimator cannot read its sample either: a fail-open tenant still goes
        # ahead (it got 503 "fails closed" when the estimator's read failed closed).
        streamed = sdk(base, KEYS["open"]).chat.completions.with_raw_response.create(
            model="p95", messages=HI, user="open", stream=True
        )
        assert streamed.headers["x-hardcap-budget"] == "unenforced"
        assert [c for c in streamed.parse() if c.choices and c.choices[0].delta.content]


def test_a_busy_request_waits_its_turn_then_is_served(
    valkey: LocalValkey, mock: Mock, sdk: Callable[..., openai.OpenAI]
) -> None:
    """Instead of budget_busy, a request that would fit once the stream in flight settles
    waits for it (the default queue) and is served; the wait is in a header."""
    budgets = [{"dimension": "total_tokens", "limit": 300, "window": "day"}]
    mock.reset()
    with _gateway(valkey, mock, **{"tenants.0.budgets": budgets}) as url:
        c = sdk(url)
        stream = _holding_stream(c, 4, 250)
        reader = threading.Thread(target=lambda: list(stream))
        reader.start()
        short = [{"role": "user", "content": "y [mock:tokens=5]"}]
        raw = c.chat.completions.with_raw_response.create(
            model="small", messages=short, max_tokens=100, user="alpha"
        )
        reader.join(timeout=30)
        reply = raw.parse()
        assert reply.choices[0].finish_reason == "stop"
        waited = int(raw.headers["x-hardcap-queue-wait-ms"])
        assert waited >= 300  # the stream took about a second to end and free its hold
        assert mock.truth("alpha")["total_tokens"] <= 300


def test_a_request_that_waited_too_long_is_busy_and_costs_nothing(
    valkey: LocalValkey, mock: Mock, sdk: Callable[..., openai.OpenAI]
) -> None:
    budgets = [{"dimension": "total_tokens", "limit": 300, "window": "day"}]
    overrides = {"tenants.0.budgets": budgets, "tenants.0.queue_wait_seconds": 0.4}
    mock.reset()
    with _gateway(valkey, mock, **overrides) as url:
        c = sdk(url)
        stream = _holding_stream(c, 4, 500)
        started = time.monotonic()
        with pytest.raises(openai.RateLimitError) as busy:
            c.chat.completions.create(model="small", messages=HI, max_tokens=100, user="alpha")
        assert time.monotonic() - started >= 0.4
        assert busy.value.code == "budget_busy"
        assert int(busy.value.response.headers["x-hardcap-queue-wait-ms"]) >= 400
        assert busy.value.response.headers["retry-after"] == "1"
        list(stream)
        # Only the stream reached the provider: the refused request was never sent.
        assert mock.truth("alpha")["requests"] == 1
