"""Claude Code's request, sent by the official `anthropic` SDK to `/v1/messages?beta=true`,
through the gateway to an Anthropic upstream (the mock's Anthropic mode), on real Valkey: the
upstream receives every field, block and cache mark as the client sent it, with its betas;
a refused field is a 400 naming it that reaches no upstream and costs nothing."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
import redis

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from tests.stack import KEYS, Mock, config_data, gateway_thread
from tests.unit.test_field_policies import CLAUDE_CODE

KEY_ENV = "HC_TEST_ANTHROPIC_KEY"
PRICE = {"input_per_million": 3.0, "output_per_million": 15.0}
BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27"]


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0.2, seed=31))
    yield m
    m.stop()


@pytest.fixture
def stack(
    valkey: LocalValkey, mock: Mock, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, anthropic.Anthropic]]:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    data = config_data(mock.url, valkey.url)
    data["upstreams"].append(
        {"name": "claude", "kind": "anthropic", "base_url": f"{mock.url}/v1",
         "timeout_seconds": 5, "api_key_env": KEY_ENV}
    )  # fmt: skip
    data["routes"].append(
        {"name": "claude", "upstream": "claude", "model": "mock-small", "price": PRICE,
         "max_output_tokens": 4096}
    )  # fmt: skip
    with gateway_thread(data) as base:
        sdk = anthropic.Anthropic(
            base_url=base.removesuffix("/v1"), api_key=KEYS["alpha"], max_retries=0
        )
        with sdk:
            yield base, sdk


def received(mock: Mock) -> list[dict[str, Any]]:
    r = httpx.get(f"{mock.url}/mock/anthropic/received")
    r.raise_for_status()
    got: list[dict[str, Any]] = r.json()
    return got


def tenant_usage(base: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/hardcap/usage", headers={"x-api-key": KEYS["alpha"]})
    rows = {(b["level"], b["dimension"]): b for b in r.json()["budgets"]}
    return rows[("tenant", "total_tokens")]


def claude_code(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(CLAUDE_CODE)
    body["metadata"] = {"user_id": "alpha"}  # the mock's tenant: its ground truth
    body.update(changes)
    return body


def test_claude_codes_stream_reaches_anthropic_unchanged(
    mock: Mock, stack: tuple[str, anthropic.Anthropic]
) -> None:
    base, sdk = stack
    body = claude_code()
    body["messages"][-1]["content"].append({"type": "text", "text": "hi [mock:tokens=12]"})
    before = len(received(mock))
    stream = sdk.beta.messages.create(**body, betas=BETAS)
    events = list(stream)
    assert events[-1].type == "message_stop"
    text = "".join(
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert text
    sent = received(mock)[before:]
    assert len(sent) == 1 and sent[0]["path"] == "/v1/messages"
    assert sent[0]["anthropic_beta"] == ",".join(BETAS)
    # The gateway sets the upstream model and the cap; everything else is the client's own.
    assert sent[0]["body"] == {**body, "model": "mock-small", "max_tokens": body["max_tokens"]}
    truth = mock.truth("alpha")
    assert tenant_usage(base)["used"] == truth["total_tokens"] > 0


def test_a_whole_reply_keeps_the_fields_too(
    mock: Mock, stack: tuple[str, anthropic.Anthropic]
) -> None:
    _, sdk = stack
    body = claude_code(stream=False, thinking={"type": "disabled"})
    body["messages"][-1]["content"].append({"type": "text", "text": "hi [mock:tokens=5]"})
    message = sdk.beta.messages.create(**body, betas=BETAS[:1])
    assert message.content and message.usage.output_tokens == 5
    sent = received(mock)[-1]
    assert sent["body"] == {
        **{k: v for k, v in body.items() if k != "stream"},
        "model": "mock-small",
    }
    assert sent["anthropic_beta"] == BETAS[0]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"container": "cntr_01"}, "container"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"context_management": {"edits": [{"type": "compact_20260112"}]}},
         "context_management.edits[0].type"),
    ],
)  # fmt: skip
def test_a_refused_field_is_a_400_naming_it_and_costs_nothing(
    mock: Mock, stack: tuple[str, anthropic.Anthropic], extra: dict[str, Any], param: str
) -> None:
    base, sdk = stack
    before = len(received(mock))
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.beta.messages.create(**claude_code(**extra), betas=BETAS)
    assert caught.value.status_code == 400
    assert param in caught.value.message
    assert len(received(mock)) == before  # no upstream was asked
    used = tenant_usage(base)
    assert used["used"] == 0 and used["reserved"] == 0


def test_a_1m_context_beta_needs_long_context_prices(
    mock: Mock, stack: tuple[str, anthropic.Anthropic]
) -> None:
    base, sdk = stack
    before = len(received(mock))
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.beta.messages.create(**claude_code(), betas=["context-1m-2025-08-07"])
    assert "anthropic-beta" in caught.value.message and "long_context" in caught.value.message
    assert len(received(mock)) == before
    used = tenant_usage(base)
    assert used["used"] == 0 and used["reserved"] == 0
