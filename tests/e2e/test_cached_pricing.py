"""Input read from the provider's prompt cache is charged at the route's cached-input price,
in the ledger and in the usage record (official `openai` SDK -> gateway -> mock, real Valkey)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
import redis

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from hardcap_core.rollup.records import parse_entry
from tests.stack import KEYS, Mock, config_data, gateway_thread

PRICE = {"input_per_million": 1.0, "output_per_million": 2.0, "cached_input_per_million": 0.25}


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0.5, seed=41))
    yield m
    m.stop()


@pytest.mark.parametrize("stream", [True, False])
def test_cached_input_is_charged_at_the_cached_price(
    valkey: LocalValkey, mock: Mock, stream: bool
) -> None:
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    data = config_data(mock.url, valkey.url, **{"routes.0.price": PRICE})
    data["tenants"][0]["budgets"].append({"dimension": "cost_usd", "limit": 100, "window": "day"})
    long_prompt = "Budgets are hard. " * 60 + "[mock:cache_read=128] [mock:tokens=20]"
    with gateway_thread(data) as base:
        with openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0) as sdk:
            args = {"model": "small", "max_tokens": 40, "user": "alpha",
                    "messages": [{"role": "user", "content": long_prompt}]}  # fmt: skip
            if stream:
                chunks = list(sdk.chat.completions.create(
                    **args, stream=True, stream_options={"include_usage": True}))  # fmt: skip
                usage = chunks[-1].usage
            else:
                usage = sdk.chat.completions.create(**args).usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens
        assert cached == 128
        truth = mock.truth("alpha")
        want_nusd = (
            (truth["prompt_tokens"] - 128) * 1000 + 128 * 250 + truth["completion_tokens"] * 2000
        )
        r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {KEYS['alpha']}"})
        rows = {(b["level"], b["dimension"]): b for b in r.json()["budgets"]}
        assert rows[("tenant", "cost_usd")]["used"] == want_nusd
        with redis.Redis.from_url(valkey.url) as r2:
            (record,) = [parse_entry(i, f) for i, f in r2.xrange("hc:{o:acme}:usage")]
        assert (record.cost_nusd, record.cached_input_tokens) == (want_nusd, 128)
