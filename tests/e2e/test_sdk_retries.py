"""The official SDKs at their default retries and timeouts against the gateway's refusals: a
wait longer than an SDK should sleep through inside one call comes with
``x-should-retry: false``, so the call returns at once instead of sleeping until the budget
resets (the anthropic SDK sleeps whatever Retry-After says, a day included, on each of its
retries); ``budget_busy`` stays retryable; and the Anthropic SDK reads the request id the
gateway gives (``request-id``, the same as ``x-request-id``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest

from hardcap_core.config.settings import SDK_RETRY_AFTER_MAX_SECONDS
from hardcap_core.gateway.answers import retry_headers
from hardcap_core.local.valkey import LocalValkey
from tests.e2e.test_anthropic_endpoint import ALPHA, HI, gateway
from tests.e2e.test_gateway_errors import _holding_stream
from tests.stack import KEYS, Mock

# An output budget spent by one 50-token reply, in a fixed window that resets once a decade:
# the refusal's wait is always far (a `day` window's is under a minute in the last minute of a
# UTC day, when the SDKs are rightly let sleep through it).
SPENT = {"tenants.0.budgets": [{"dimension": "output_tokens", "limit": 50, "window": "3650d"}]}
SPEND: Any = [{"role": "user", "content": "spend it [mock:tokens=50]"}]
# Well under one retry's sleep on a far Retry-After, well over a refusal's round trip.
RETURNS_WITHIN_S = 10.0
# How long a call may run before the test gives up on it (it would sleep for years otherwise).
GIVE_UP_S = 60.0


class Clients:
    """The official SDKs at their default max_retries and timeouts, closed after the test."""

    def __init__(self) -> None:
        self._made: list[anthropic.Anthropic | openai.OpenAI] = []

    def anthropic_client(self, base: str, key: str = KEYS["alpha"]) -> anthropic.Anthropic:
        """Pointed at the gateway's root: the SDK adds /v1 itself."""
        client = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=key)
        self._made.append(client)
        return client

    def openai_client(self, base: str, key: str = KEYS["alpha"]) -> openai.OpenAI:
        client = openai.OpenAI(base_url=base, api_key=key)
        self._made.append(client)
        return client

    def close(self) -> None:
        for c in self._made:
            c.close()


@pytest.fixture
def sdks() -> Iterator[Clients]:
    clients = Clients()
    yield clients
    clients.close()


def timed(call: Callable[[], object]) -> tuple[BaseException | None, float]:
    """What ``call`` raised (None if nothing) and how long it took, in seconds. It runs in a
    daemon thread so that an SDK sleeping on a far Retry-After fails the test, not hangs it."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except Exception as e:  # the SDK's error is the result under test
            raised.append(e)
        else:
            raised.append(None)

    started = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(GIVE_UP_S)
    assert not worker.is_alive(), f"still inside the SDK after {GIVE_UP_S} s: it sleeps"
    return raised[0], time.monotonic() - started


def assert_told_not_to_retry(response: Any) -> None:
    """A far wait: Retry-After for the caller, ``x-should-retry: false`` for the SDK, which sent
    the request once (its last attempt is the first)."""
    headers = response.headers
    assert headers["x-should-retry"] == "false"
    assert int(headers["retry-after"]) > SDK_RETRY_AFTER_MAX_SECONDS
    assert int(headers["retry-after-ms"]) > SDK_RETRY_AFTER_MAX_SECONDS * 1000
    assert response.request.headers["x-stainless-retry-count"] == "0"


def test_a_spent_budget_returns_at_once_from_the_anthropic_sdk(
    mock: Mock, flushed: LocalValkey, sdks: Clients
) -> None:
    with gateway(mock, flushed, **SPENT) as base:
        c = sdks.anthropic_client(base)
        c.messages.create(model="small", max_tokens=50, messages=SPEND, metadata=ALPHA)
        error, elapsed = timed(
            lambda: c.messages.create(model="small", max_tokens=20, messages=HI, metadata=ALPHA)
        )
        assert isinstance(error, anthropic.RateLimitError), error
        assert elapsed < RETURNS_WITHIN_S
        body: Any = error.body
        assert body["error"]["code"] == "budget_exceeded"
        assert "spent for this window" in body["error"]["message"]
        assert_told_not_to_retry(error.response)
        assert error.request_id == error.response.headers["x-request-id"]


def test_a_spent_budget_returns_at_once_from_the_openai_sdk(
    mock: Mock, flushed: LocalValkey, sdks: Clients
) -> None:
    with gateway(mock, flushed, **SPENT) as base:
        c = sdks.openai_client(base)
        c.chat.completions.create(model="small", max_tokens=50, messages=SPEND, user="alpha")
        error, elapsed = timed(
            lambda: c.chat.completions.create(model="small", max_tokens=20, messages=HI)
        )
        assert isinstance(error, openai.RateLimitError), error
        assert elapsed < RETURNS_WITHIN_S
        assert error.code == "budget_exceeded"
        assert_told_not_to_retry(error.response)
        assert error.request_id == error.response.headers["x-request-id"]


def test_budget_busy_is_retried_by_the_sdk(mock: Mock, flushed: LocalValkey, sdks: Clients) -> None:
    """Busy means "in about a second": the SDK retries it (twice by default, a second apart)
    while a stream holds the budget, then raises the last refusal."""
    budgets = [{"dimension": "total_tokens", "limit": 300, "window": "day"}]
    no_queue = {"tenants.0.budgets": budgets, "tenants.0.queue_wait_seconds": 0}
    with gateway(mock, flushed, **no_queue) as base:
        # Holds nearly all of the 300 for about 6 s: over the SDK's two 1-second sleeps.
        stream = _holding_stream(sdks.openai_client(base), 8, 800)
        c = sdks.anthropic_client(base)
        error, elapsed = timed(
            lambda: c.messages.create(model="small", max_tokens=100, messages=HI, metadata=ALPHA)
        )
        assert isinstance(error, anthropic.RateLimitError), error
        body: Any = error.body
        assert body["error"]["code"] == "budget_busy"
        headers = error.response.headers
        assert (headers["retry-after"], headers["retry-after-ms"]) == ("1", "1000")
        assert headers["x-should-retry"] == "true"
        assert error.response.request.headers["x-stainless-retry-count"] == "2"
        assert elapsed >= 2.0  # the SDK slept the second it was told, twice
        list(stream)


def test_the_anthropic_sdk_reads_the_gateways_request_id(
    mock: Mock, flushed: LocalValkey, sdks: Clients
) -> None:
    with gateway(mock, flushed) as base:
        c = sdks.anthropic_client(base)
        raw = c.messages.with_raw_response.create(
            model="small", max_tokens=20, messages=HI, metadata=ALPHA
        )
        message = raw.parse()
        assert message._request_id == raw.headers["x-request-id"]
        assert len(raw.headers["x-request-id"]) == 32  # the gateway's own, a uuid4 hex

        with c.messages.stream(model="small", max_tokens=20, messages=HI, metadata=ALPHA) as s:
            s.get_final_message()
        assert s.request_id == s.response.headers["x-request-id"]

        echoed = c.messages.create(
            model="small",
            max_tokens=20,
            messages=HI,
            metadata=ALPHA,
            extra_headers={"x-request-id": "client-7.b"},
        )
        assert echoed._request_id == "client-7.b"  # a client's own id, kept

        for key, model, status in (("sk-wrong", "small", 401), (KEYS["beta"], "reason", 403)):
            with pytest.raises(anthropic.APIStatusError) as refused:
                sdks.anthropic_client(base, key).messages.create(
                    model=model, max_tokens=20, messages=HI
                )
            assert refused.value.status_code == status
            assert refused.value.request_id == refused.value.response.headers["x-request-id"]


def test_retry_hints_at_the_threshold() -> None:
    """The rule every refusal with a wait follows: retryable up to the threshold, inclusive;
    Retry-After in whole seconds, rounded up."""
    limit_ms = SDK_RETRY_AFTER_MAX_SECONDS * 1000
    assert retry_headers(1000) == {
        "retry-after": "1",
        "retry-after-ms": "1000",
        "x-should-retry": "true",
    }
    assert retry_headers(1001)["retry-after"] == "2"
    assert retry_headers(limit_ms)["x-should-retry"] == "true"
    assert retry_headers(limit_ms + 1) == {
        "retry-after": str(SDK_RETRY_AFTER_MAX_SECONDS + 1),
        "retry-after-ms": str(limit_ms + 1),
        "x-should-retry": "false",
    }
    assert retry_headers(84_785_000)["retry-after"] == "84785"  # the day-long wait
