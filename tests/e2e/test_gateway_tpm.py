"""tokens_per_minute end to end: the official `openai` SDK, the gateway, the mock, real Valkey."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from tests.stack import KEYS, Mock, config_data, gateway_thread

TPM = 150


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=1.0, seed=14))
    yield m
    m.stop()


def test_a_stream_is_cut_where_the_minute_is_full_then_the_tenant_waits(
    mock: Mock, flushed: LocalValkey
) -> None:
    overrides = {
        # Reserve little, so the stream has to extend into the tenant's minute.
        "routes.0.estimator": {"kind": "fixed", "fixed_tokens": 16},
        "tenants.0.rate_limits": {"tokens_per_minute": TPM},
    }
    with gateway_thread(config_data(mock.url, flushed.url, **overrides)) as base:
        sdk = openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0)
        try:
            stream = sdk.chat.completions.create(
                model="small",
                messages=[{"role": "user", "content": "Talk at length. [mock:tokens=400]"}],
                max_tokens=400,
                stream=True,
                user="alpha",
                stream_options={"include_usage": True},
            )
            finishes = [c.choices[0].finish_reason for c in stream if c.choices]
            assert finishes[-1] == "length"  # cut, far below the 400 asked for
            truth = mock.truth("alpha")
            assert truth["aborted"] == 1
            # Prompt and completion, as the provider billed them, within the minute's limit.
            assert truth["total_tokens"] <= TPM
            assert truth["completion_tokens"] > 16  # it did extend into what was free
            with pytest.raises(openai.RateLimitError) as refused:
                sdk.chat.completions.create(
                    model="small", messages=[{"role": "user", "content": "hi"}], user="alpha"
                )
            assert refused.value.code == "rate_limited"
            headers = refused.value.response.headers
            # The minute's tokens leave the window a minute after they were used.
            assert 50 <= int(headers["retry-after"]) <= 61
            assert headers["x-ratelimit-limit-tokens"] == str(TPM)
        finally:
            sdk.close()
