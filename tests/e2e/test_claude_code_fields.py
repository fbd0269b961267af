"""Claude Code's request, sent by the official `anthropic` SDK to `/v1/messages?beta=true`,
through the gateway to an Anthropic upstream (the mock's Anthropic mode), on real Valkey: the
upstream receives every field, block and cache mark as the client sent it, with its betas;
a refused field is a 400 naming it that reaches no upstream and costs nothing."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import anthropic
import httpx
import pytest

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from tests.stack import (
    ANTHROPIC_KEY_ENV,
    KEYS,
    Mock,
    anthropic_client,
    anthropic_config,
    gateway_thread,
    mock_fixture,
)
from tests.unit.test_field_policies import CLAUDE_CODE

PRICE = {"input_per_million": 3.0, "output_per_million": 15.0, "cached_input_per_million": 0.3,
         "cache_write_per_million": 3.75}  # fmt: skip
NUSD = {"input": 3_000, "read": 300, "written": 3_750, "output": 15_000}  # per token
LONG = "The repository's conventions, which every turn sends again. " * 200
BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27"]


mock = mock_fixture(MockSettings(pace_ms=0.2, seed=31))


@pytest.fixture
def stack(
    flushed: LocalValkey, mock: Mock, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, anthropic.Anthropic]]:
    monkeypatch.setenv(ANTHROPIC_KEY_ENV, "sk-ant-test")
    data = anthropic_config(mock, flushed)
    data["routes"].append(
        {"name": "claude", "upstream": "claude", "model": "mock-small", "price": PRICE,
         "max_output_tokens": 4096}
    )  # fmt: skip
    with gateway_thread(data) as base:
        yield base, anthropic_client(base)


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
    before = len(mock.received())
    stream = sdk.beta.messages.create(**body, betas=BETAS)
    events = list(stream)
    assert events[-1].type == "message_stop"
    text = "".join(
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert text
    sent = mock.received()[before:]
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
    sent = mock.received()[-1]
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
    before = len(mock.received())
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.beta.messages.create(**claude_code(**extra), betas=BETAS)
    assert caught.value.status_code == 400
    assert param in caught.value.message
    assert len(mock.received()) == before  # no upstream was asked
    used = tenant_usage(base)
    assert used["used"] == 0 and used["reserved"] == 0


def test_a_1m_context_beta_needs_long_context_prices(
    mock: Mock, stack: tuple[str, anthropic.Anthropic]
) -> None:
    base, sdk = stack
    before = len(mock.received())
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.beta.messages.create(**claude_code(), betas=["context-1m-2025-08-07"])
    assert "anthropic-beta" in caught.value.message and "long_context" in caught.value.message
    assert len(mock.received()) == before
    used = tenant_usage(base)
    assert used["used"] == 0 and used["reserved"] == 0


def test_a_multi_turn_conversation_reads_its_prefix_from_the_cache_at_the_cache_price(
    mock: Mock, stack: tuple[str, anthropic.Anthropic]
) -> None:
    """Two turns of one conversation: the first writes its prefix (a long system prompt and
    the first question, both marked), the second sends it again unchanged and reads it from the
    mock's cache, as Anthropic's. A byte of the prefix changed by the gateway on the way would
    make the second turn write it again. Each turn is charged at the route's cache prices."""
    _, sdk = stack
    system = [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}]
    mark = {"type": "ephemeral"}
    messages: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": "one [mock:tokens=6]",
                                      "cache_control": mark}]},
    ]  # fmt: skip
    costs = []
    usages = []
    for turn in (1, 2):
        raw = sdk.beta.messages.with_raw_response.create(
            model="claude", max_tokens=50, system=system, messages=messages,
            metadata={"user_id": "alpha"}, betas=BETAS[:1],
        )  # fmt: skip
        reply = raw.parse()
        usages.append(reply.usage)
        costs.append(Decimal(raw.headers["x-hardcap-cost-usd"]) * 10**9)
        text = "".join(b.text for b in reply.content if b.type == "text")
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": text}]},
            {"role": "user", "content": [{"type": "text", "text": f"turn {turn + 1} "
                                          "[mock:tokens=4]", "cache_control": mark}]},
        ]  # fmt: skip
    first, second = usages
    assert first.cache_read_input_tokens == 0 and (first.cache_creation_input_tokens or 0) > 1000
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    for usage, cost in zip(usages, costs, strict=True):
        read, written = usage.cache_read_input_tokens or 0, usage.cache_creation_input_tokens or 0
        expected = (
            usage.input_tokens * NUSD["input"] + read * NUSD["read"]
            + written * NUSD["written"] + usage.output_tokens * NUSD["output"]
        )  # fmt: skip
        assert cost == expected
