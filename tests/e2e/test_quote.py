"""`POST /v1/hardcap/quote` and `POST /v1/messages/quote` through the gateway on real Valkey:
each decision kind (admit, queue, refuse busy / exceeded / never) agrees with what the admit
then does for the same request, the costs follow the route's prices, and a quote calls no
upstream, reserves nothing and writes no usage record. Bad bodies are the chat endpoint's
400s."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import openai
import pytest
import redis

from hardcap_core.local.valkey import LocalValkey
from tests.stack import KEYS, Mock, config_data, gateway_thread

BUDGET = [{"dimension": "total_tokens", "limit": 300, "window": "day"}]
AUTH = {"authorization": f"Bearer {KEYS['alpha']}"}


def body(content: str = "y [mock:tokens=5]", **more: Any) -> dict[str, Any]:
    return {"model": "small", "messages": [{"role": "user", "content": content}],
            "max_tokens": 100, "user": "alpha", **more}  # fmt: skip


@pytest.fixture
def tight(flushed: LocalValkey, mock: Mock) -> Iterator[str]:
    """A gateway whose tenant alpha has 300 tokens a day and queues (the default wait)."""
    with gateway_thread(config_data(mock.url, flushed.url, **{"tenants.0.budgets": BUDGET})) as url:
        yield url


def quote(base: str, payload: dict[str, Any], path: str = "/hardcap/quote") -> httpx.Response:
    return httpx.post(f"{base}{path}", json=payload, headers=AUTH)


def usage(base: str) -> dict[str, Any]:
    got = httpx.get(f"{base}/hardcap/usage", headers=AUTH).json()
    return next(b for b in got["budgets"] if b["level"] == "tenant")


def records(valkey: LocalValkey) -> int:
    with redis.Redis.from_url(valkey.url) as r:
        return sum(int(r.xlen(k)) for k in r.keys("hc:*:usage"))


def chat(base: str, payload: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base}/chat/completions", json=payload, headers=AUTH, timeout=10)


def test_a_request_that_fits_is_quoted_admit_and_nothing_is_spent(
    mock: Mock, flushed: LocalValkey
) -> None:
    with gateway_thread(config_data(mock.url, flushed.url)) as base:
        got = quote(base, body(max_tokens=500))
        assert got.status_code == 200
        q = got.json()
        assert q["decision"]["action"] == "admit"
        assert q["decision"]["output_tokens_reserved"] == 500  # a whole reply holds its cap
        tokens = q["input_tokens"]
        assert tokens > 0 and q["max_tokens"] == 500
        # $1 / $2 per million tokens: worst case the input and all 500 output tokens.
        assert Decimal(q["worst_case_cost_usd"]) == Decimal(tokens * 1000 + 500 * 2000) / 10**9
        assert Decimal(q["expected_cost_usd"]) <= Decimal(q["worst_case_cost_usd"])
        tenant = next(b for b in q["budgets"] if b["level"] == "tenant")
        assert tenant["remaining"] == 1_000_000 and tenant["worst_case"] == tokens + 500
        # Nothing happened: no upstream call, no hold, no record.
        assert mock.truth("alpha").get("requests", 0) == 0
        assert usage(base)["used"] == usage(base)["reserved"] == 0
        assert records(flushed) == 0
        # And the admit agrees.
        assert chat(base, body(max_tokens=500)).status_code == 200


def test_the_anthropic_body_is_quoted_on_messages_quote(mock: Mock, flushed: LocalValkey) -> None:
    with gateway_thread(config_data(mock.url, flushed.url)) as base:
        payload = {"model": "small", "max_tokens": 64,
                   "messages": [{"role": "user", "content": "Hello there"}]}  # fmt: skip
        got = httpx.post(
            f"{base}/messages/quote", json=payload, headers={"x-api-key": KEYS["alpha"]}
        )
        assert got.status_code == 200
        assert got.json()["decision"]["action"] == "admit"
        assert got.json()["max_tokens"] == 64
        bad = httpx.post(f"{base}/messages/quote", json={"model": "small"},
                         headers={"x-api-key": KEYS["alpha"]})  # fmt: skip
        assert bad.status_code == 400
        assert bad.json()["type"] == "error"  # Anthropic's error shape, as on /v1/messages


def test_a_spent_budget_is_quoted_exceeded_as_the_admit_refuses_it(
    tight: str, flushed: LocalValkey
) -> None:
    assert chat(tight, body("x [mock:tokens=280]", max_tokens=285)).status_code == 200
    q = quote(tight, body()).json()
    assert q["decision"]["action"] == "refuse"
    assert q["decision"]["reason"] == "exceeded"
    assert q["decision"]["budget"].startswith("t:alpha:tot:")
    assert q["decision"]["retry_after_seconds"] > 0
    before = records(flushed)
    refused = chat(tight, body())
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "budget_exceeded"
    assert "retry-after" in refused.headers  # exceeded, not never: a retry after reset helps
    assert records(flushed) == before + 1  # the admit's refusal record; the quote wrote none


def test_a_request_larger_than_the_whole_budget_is_quoted_never(tight: str) -> None:
    huge = "budget " * 400  # about 400 tokens of input on a 300-token budget
    q = quote(tight, body(huge)).json()
    assert q["decision"]["action"] == "refuse"
    assert q["decision"]["reason"] == "never"
    assert q["decision"]["retry_after_seconds"] == 0
    refused = chat(tight, body(huge))
    assert refused.status_code == 429
    assert refused.headers["x-should-retry"] == "false"  # never fits: the admit says the same


def hold_the_budget(base: str) -> threading.Thread:
    """A stream holding 280 of the 300 tokens for about 2 s (4 tokens, one per 500 ms)."""
    client = openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0)
    stream = client.chat.completions.create(
        model="small", max_tokens=280, stream=True, user="alpha",
        messages=[{"role": "user", "content": "x [mock:tokens=4] [mock:pace_ms=500]"}],
    )  # fmt: skip

    def read() -> None:
        with client:
            list(stream)

    reader = threading.Thread(target=read)
    reader.start()
    return reader


def test_holds_in_flight_are_quoted_queue_where_the_tenant_waits(tight: str) -> None:
    reader = hold_the_budget(tight)
    try:
        assert usage(tight)["reserved"] > 0
        q = quote(tight, body()).json()
        assert q["decision"]["action"] == "queue"
        assert q["decision"]["reason"] == "busy"
    finally:
        reader.join()
    assert quote(tight, body()).json()["decision"]["action"] == "admit"  # the hold settled


def test_holds_in_flight_are_quoted_busy_where_the_tenant_does_not_wait(
    mock: Mock, flushed: LocalValkey
) -> None:
    data = config_data(mock.url, flushed.url, **{"tenants.0.budgets": BUDGET,
                                                 "gateway.queue_wait_seconds": 0})  # fmt: skip
    with gateway_thread(data) as base:
        reader = hold_the_budget(base)
        try:
            q = quote(base, body()).json()
            assert (q["decision"]["action"], q["decision"]["reason"]) == ("refuse", "busy")
            refused = chat(base, body())
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "budget_busy"
        finally:
            reader.join()


def test_a_bad_body_is_the_chat_endpoints_400_and_auth_is_required(
    mock: Mock, flushed: LocalValkey
) -> None:
    with gateway_thread(config_data(mock.url, flushed.url)) as base:
        bad = body(max_tokens=-3)
        assert quote(base, bad).status_code == chat(base, bad).status_code == 400
        assert quote(base, bad).json()["error"]["param"] == chat(base, bad).json()["error"]["param"]
        assert quote(base, body(max_tokens=5000)).json()["error"]["param"] == "max_tokens"
        unknown = quote(base, {**body(), "model": "nope"})
        assert unknown.status_code == 404
        anon = httpx.post(f"{base}/hardcap/quote", json=body())
        assert anon.status_code == 401
        assert mock.truth("alpha").get("requests", 0) == 0


def test_a_spent_rate_limit_is_quoted_refused_rate_as_the_admit_refuses_it(
    mock: Mock, flushed: LocalValkey
) -> None:
    """Two requests a minute: after two, the quote says the third is refused by the key's
    requests per minute, when it may come back, and the admit then says the same."""
    data = config_data(
        mock.url, flushed.url, **{"tenants.0.keys.0.rate_limits": {"requests_per_minute": 2}}
    )
    with gateway_thread(data) as base:
        first = quote(base, body()).json()
        assert first["rate_limits_checked"] is True
        assert first["decision"]["action"] == "admit"
        for _ in range(2):
            assert chat(base, body()).status_code == 200
        q = quote(base, body()).json()
        assert (q["decision"]["action"], q["decision"]["reason"]) == ("refuse", "rate")
        assert q["decision"]["budget"] == "k:alpha-k:rpm"
        assert 0 < q["decision"]["retry_after_seconds"] <= 60
        refused = chat(base, body())
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limited"
