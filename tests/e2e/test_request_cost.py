"""The cost of every request, as the client sees it: `x-hardcap-cost-usd` and
`x-hardcap-tokens-charged` on whole replies, `usage.hardcap` in the last usage of a stream
(OpenAI's usage chunk, Anthropic's `message_delta`), through the official SDKs to the mock on
real Valkey. Each equals the usage record the settle wrote for the same request: completed,
cut by the budget (finish `length` / `max_tokens`) and non-streamed."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import anthropic
import openai
import pytest
import redis

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from hardcap_core.rollup.records import UsageRecord, parse_entry
from tests.stack import KEYS, Mock, config_data, gateway_thread

ASK: Any = [{"role": "user", "content": "Say something about budgets. [mock:tokens=40]"}]
LONG: Any = [{"role": "user", "content": "think hard [mock:tokens=400]"}]
CUT_BUDGET = [{"dimension": "output_tokens", "limit": 60, "window": "day"}]


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0.5, seed=29))
    yield m
    m.stop()


def gateway(mock: Mock, valkey: LocalValkey, **overrides: Any) -> Any:
    return gateway_thread(config_data(mock.url, valkey.url, **overrides))


def the_record(valkey: LocalValkey) -> UsageRecord:
    """The one usage record the request's settle appended (alpha's hierarchy is org acme)."""
    with redis.Redis.from_url(valkey.url) as r:
        (record,) = [parse_entry(i, f) for i, f in r.xrange("hc:{o:acme}:usage")]
    return record


def assert_extension_is_the_record(hardcap: Any, record: UsageRecord, *, cut: bool) -> None:
    assert record.cost_nusd > 0
    assert Decimal(str(hardcap["cost_usd"])) == Decimal(record.cost_nusd) / 10**9
    assert hardcap["input_tokens"] == record.input_tokens
    assert hardcap["output_tokens"] == record.output_tokens
    assert hardcap["estimate"] is record.estimate
    if not cut:
        assert hardcap["estimate"] is False


def assert_headers_are_the_record(headers: Any, record: UsageRecord) -> None:
    assert record.cost_nusd > 0
    assert Decimal(headers["x-hardcap-cost-usd"]) == Decimal(record.cost_nusd) / 10**9
    charged = record.input_tokens + record.output_tokens
    assert int(headers["x-hardcap-tokens-charged"]) == charged


def openai_client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0)


def anthropic_client(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=KEYS["alpha"],
                               max_retries=0)  # fmt: skip


def test_openai_whole_reply_headers_are_what_the_ledger_charged(
    mock: Mock, flushed: LocalValkey
) -> None:
    with gateway(mock, flushed) as base, openai_client(base) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(
            model="small", messages=ASK, max_tokens=100, user="alpha"
        )
        reply = raw.parse()
        record = the_record(flushed)
        assert_headers_are_the_record(raw.headers, record)
        assert reply.usage is not None
        assert int(raw.headers["x-hardcap-tokens-charged"]) == reply.usage.total_tokens
        assert record.input_tokens + record.output_tokens == sum(
            mock.truth("alpha")[k] for k in ("prompt_tokens", "completion_tokens")
        )


@pytest.mark.parametrize("cut", [False, True], ids=["completed", "cut"])
def test_openai_stream_usage_carries_the_charge(
    mock: Mock, flushed: LocalValkey, cut: bool
) -> None:
    overrides = {"tenants.0.budgets": CUT_BUDGET} if cut else {}
    with gateway(mock, flushed, **overrides) as base, openai_client(base) as sdk:
        chunks = list(
            sdk.chat.completions.create(
                model="small", messages=LONG if cut else ASK, max_tokens=400, user="alpha",
                stream=True, stream_options={"include_usage": True},
            )
        )  # fmt: skip
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] == ("length" if cut else "stop")
        usage = chunks[-1].usage
        assert usage is not None and usage.model_extra is not None
        hardcap = usage.model_extra["hardcap"]  # the SDK keeps the extension field
        record = the_record(flushed)
        assert_extension_is_the_record(hardcap, record, cut=cut)
        assert record.outcome == ("truncated" if cut else "completed")
        assert hardcap["output_tokens"] == usage.completion_tokens


def test_anthropic_whole_reply_headers_are_what_the_ledger_charged(
    mock: Mock, flushed: LocalValkey
) -> None:
    with gateway(mock, flushed) as base, anthropic_client(base) as sdk:
        raw = sdk.messages.with_raw_response.create(
            model="small", max_tokens=100, messages=ASK, metadata={"user_id": "alpha"}
        )
        message = raw.parse()
        record = the_record(flushed)
        assert_headers_are_the_record(raw.headers, record)
        assert message.usage.output_tokens == record.output_tokens


@pytest.mark.parametrize("cut", [False, True], ids=["completed", "cut"])
def test_anthropic_stream_message_delta_carries_the_charge(
    mock: Mock, flushed: LocalValkey, cut: bool
) -> None:
    overrides = {"tenants.0.budgets": CUT_BUDGET} if cut else {}
    with gateway(mock, flushed, **overrides) as base, anthropic_client(base) as sdk:
        events = list(
            sdk.messages.create(
                model="small", max_tokens=400, messages=LONG if cut else ASK,
                metadata={"user_id": "alpha"}, stream=True,
            )
        )  # fmt: skip
        (delta,) = [e for e in events if e.type == "message_delta"]
        assert delta.delta.stop_reason == ("max_tokens" if cut else "end_turn")
        assert delta.usage.model_extra is not None
        hardcap = delta.usage.model_extra["hardcap"]
        record = the_record(flushed)
        assert_extension_is_the_record(hardcap, record, cut=cut)
        assert hardcap["output_tokens"] == delta.usage.output_tokens
