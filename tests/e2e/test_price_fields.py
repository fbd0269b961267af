"""Request fields that change the price, through the gateway to the mock on real Valkey: an
Anthropic 1-hour cache write (the official `anthropic` SDK), OpenAI service tiers and a
long-context tier (the official `openai` SDK). Each is reserved at a price that covers its bill
and charged the bill, or refused naming the field."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from hardcap_core.rollup.records import parse_entry
from tests.stack import KEYS, Mock, config_data, gateway_thread

KEY_ENV = "HC_TEST_ANTHROPIC_KEY"
SONNET = {"input_per_million": 3.0, "output_per_million": 15.0}  # writes: 1.25x, 2x an hour


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0.5, seed=43))
    yield m
    m.stop()


@pytest.fixture
def fresh(valkey: LocalValkey, mock: Mock, monkeypatch: pytest.MonkeyPatch) -> LocalValkey:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    return valkey


def config(mock: Mock, valkey: LocalValkey, cost_usd: float, **price: Any) -> dict[str, Any]:
    data = config_data(mock.url, valkey.url, **{"gateway.max_body_bytes": 1_000_000})
    data["upstreams"].append(
        {"name": "claude", "kind": "anthropic", "base_url": f"{mock.url}/v1",
         "timeout_seconds": 5, "api_key_env": KEY_ENV}
    )  # fmt: skip
    data["routes"].append(
        {"name": "claude", "upstream": "claude", "model": "mock-small", "price": SONNET,
         "max_output_tokens": 1024}
    )  # fmt: skip
    data["routes"][0]["price"] = {"input_per_million": 1.0, "output_per_million": 2.0, **price}
    data["tenants"][0]["budgets"].append(
        {"dimension": "cost_usd", "limit": cost_usd, "window": "day"}
    )
    return data


def cost_used(base: str) -> int:
    r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {KEYS['alpha']}"})
    rows = {(b["level"], b["dimension"]): b for b in r.json()["budgets"]}
    used: int = rows[("tenant", "cost_usd")]["used"]
    return used


def recorded_cost(valkey: LocalValkey) -> int:
    with redis.Redis.from_url(valkey.url) as r:
        (record,) = [parse_entry(i, f) for i, f in r.xrange("hc:{o:acme}:usage")]
    return record.cost_nusd


def png(width: int, height: int) -> dict[str, Any]:
    """An image block whose header says its size (what both sides bill it by)."""
    header = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", width, height)
    data = base64.b64encode(header + b"\x08\x02\x00\x00\x00").decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


# The request: 19,250 prompt tokens (images, whose estimate is close to their bill, and
# a line of text), all written to the prompt cache for an hour, one output token. Anthropic
# bills $0.1155 (2x input for the write); the 5-minute write price recorded $0.0722.
HOUR_LONG_WRITE: Any = [
    {
        "role": "user",
        "content": [
            png(830, 500),
            *[png(1000, 1000)] * 14,
            {"type": "text", "text": "[mock:cache_write=1000000] [mock:tokens=1]",
             "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        ],
    }
]  # fmt: skip
BILL_NUSD = 19_250 * 6_000 + 1 * 15_000  # $0.115515


def ask_claude(base: str, *, stream: bool = False) -> Any:
    root = base.removesuffix("/v1")
    with anthropic.Anthropic(base_url=root, api_key=KEYS["alpha"], max_retries=0) as sdk:
        args: Any = {"model": "claude", "max_tokens": 16, "messages": HOUR_LONG_WRITE,
                     "metadata": {"user_id": "alpha"}}  # fmt: skip
        if not stream:
            return sdk.messages.create(**args).usage
        with sdk.messages.stream(**args) as events:
            return events.get_final_message().usage


@pytest.mark.parametrize("stream", [False, True])
def test_an_hour_long_cache_write_is_charged_its_bill(
    mock: Mock, fresh: LocalValkey, stream: bool
) -> None:
    with gateway_thread(config(mock, fresh, 100.0)) as base:
        usage = ask_claude(base, stream=stream)
        assert usage.cache_creation_input_tokens == 19_250 == mock.truth("alpha")["prompt_tokens"]
        assert usage.cache_creation is not None
        assert usage.cache_creation.ephemeral_1h_input_tokens == 19_250
        assert usage.output_tokens == 1
        assert cost_used(base) == BILL_NUSD == recorded_cost(fresh)  # was 72,202,500


def test_an_hour_long_cache_write_cannot_pass_the_cost_budget(
    mock: Mock, fresh: LocalValkey
) -> None:
    # $0.08: the 5-minute price held $0.0726 and let the $0.1155 bill through; held at the
    # hour-long write price ($0.116) it is refused up front, and nothing reaches the provider.
    with gateway_thread(config(mock, fresh, 0.08)) as base:
        with pytest.raises(anthropic.RateLimitError):
            ask_claude(base)
        assert cost_used(base) == 0
    assert mock.truth("alpha").get("prompt_tokens", 0) == 0


def ask(base: str, text: str, *, stream: bool = False, **args: Any) -> Any:
    with openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0) as sdk:
        request: Any = {"model": "small", "max_tokens": 20, "user": "alpha",
                        "messages": [{"role": "user", "content": text}], **args}  # fmt: skip
        if not stream:
            reply = sdk.chat.completions.create(**request)
            return reply.service_tier, reply.usage
        chunks = list(sdk.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}))  # fmt: skip
        # Each chunk the provider sent says its tier (the closing usage chunk is the gateway's).
        return next(c.service_tier for c in chunks if c.service_tier), chunks[-1].usage


def test_a_service_tier_the_route_has_no_price_for_is_refused_naming_it(
    mock: Mock, fresh: LocalValkey
) -> None:
    with gateway_thread(config(mock, fresh, 100.0)) as base:
        with pytest.raises(openai.BadRequestError) as info:
            ask(base, "Hello [mock:tokens=5]", service_tier="priority")
        assert info.value.param == "service_tier"
        assert cost_used(base) == 0
    assert mock.truth("alpha").get("prompt_tokens", 0) == 0


@pytest.mark.parametrize(
    ("tier", "served", "multiplier", "stream"),
    [
        ("priority", "priority", 2.0, False),
        ("priority", "priority", 2.0, True),
        ("flex", "flex", 0.5, True),
        ("auto", "default", 1.0, False),  # held at priority's price, charged what it was
    ],
)
def test_a_service_tier_is_charged_at_its_price(
    mock: Mock, fresh: LocalValkey, tier: str, served: str, multiplier: float, stream: bool
) -> None:
    tiers = {"service_tiers": {"priority": 2.0, "flex": 0.5}}
    with gateway_thread(config(mock, fresh, 100.0, **tiers)) as base:
        answered, usage = ask(base, "Hello [mock:tokens=5]", stream=stream, service_tier=tier)
        assert answered == served
        truth = mock.truth("alpha")
        assert (usage.prompt_tokens, usage.completion_tokens) == (
            truth["prompt_tokens"], truth["completion_tokens"]
        )  # fmt: skip
        standard = truth["prompt_tokens"] * 1_000 + truth["completion_tokens"] * 2_000
        assert cost_used(base) == standard * multiplier == recorded_cost(fresh)


LONG_CONTEXT = {"long_context": {"above_input_tokens": 400, "input_multiplier": 2.0,
                                 "output_multiplier": 1.5}}  # fmt: skip


@pytest.mark.parametrize(("repeats", "billed", "long"), [(100, 514, True), (60, 314, False)])
def test_a_long_prompt_is_charged_at_the_long_context_tier(
    mock: Mock, fresh: LocalValkey, repeats: int, billed: int, long: bool
) -> None:
    # The short prompt's estimate (780) is past the threshold, its bill (314) is not: held at
    # the long-context tier, charged at the tier of the input the provider reports.
    with gateway_thread(config(mock, fresh, 100.0, **LONG_CONTEXT)) as base:
        _, usage = ask(base, "Budgets are hard. " * repeats + "[mock:tokens=10]")
        assert usage.prompt_tokens == billed == mock.truth("alpha")["prompt_tokens"]
        prices = (2_000, 3_000) if long else (1_000, 2_000)
        want = billed * prices[0] + usage.completion_tokens * prices[1]
        assert cost_used(base) == want == recorded_cost(fresh)


def test_a_long_prompt_is_held_at_the_long_context_tier(mock: Mock, fresh: LocalValkey) -> None:
    # Estimated 1,283 input tokens and 20 output: $0.001323 at the route's prices fits a
    # $0.002 budget, $0.002626 at the long-context tier does not.
    with gateway_thread(config(mock, fresh, 0.002, **LONG_CONTEXT)) as base:
        with pytest.raises(openai.RateLimitError):
            ask(base, "Budgets are hard. " * 100 + "[mock:tokens=10]")
        assert cost_used(base) == 0
