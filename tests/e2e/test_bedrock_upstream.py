"""End to end through a Bedrock upstream: the official `openai` SDK -> the gateway -> botocore
(SigV4, the event-stream decoder) -> the local Bedrock fake, on real Valkey. No AWS."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis

from hardcap_core.local.bedrock_fake import CREDENTIALS_ENV, FakeSettings, create_bedrock_fake_app
from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.servers import ThreadServer
from hardcap_core.local.valkey import LocalValkey, free_port
from tests.stack import KEYS, Mock, config_data, gateway_thread

PRICE = {"input_per_million": 3.0, "output_per_million": 15.0}
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def fake() -> Iterator[Mock]:
    """The Bedrock fake, read through the mock's ground-truth helper (same paths)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CREDENTIALS_ENV.items():
            patch.setenv(name, value)
        app = create_bedrock_fake_app(FakeSettings(pace_ms=0.5, seed=7))
        server = ThreadServer(app, free_port()).start()
        truth = Mock(url=server.url)
        yield truth
        truth.stop()
        server.stop()


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0.5, seed=3))
    yield m
    m.stop()


@pytest.fixture
def flushed(valkey: LocalValkey, fake: Mock, mock: Mock) -> LocalValkey:
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    fake.reset()
    mock.reset()
    return valkey


def config(fake: Mock, mock: Mock, valkey: LocalValkey, **overrides: Any) -> dict[str, Any]:
    data = config_data(mock.url, valkey.url, **overrides)
    data["upstreams"].append(
        {"name": "bedrock", "kind": "bedrock", "base_url": fake.url, "timeout_seconds": 5}
    )
    data["routes"] += [
        {
            "name": "claude",
            "upstream": "bedrock",
            "model": "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.fake.model-v1:0",
            "price": PRICE,
            "max_output_tokens": 1024,
        },
        {
            "name": "claude-reason",
            "upstream": "bedrock",
            "model": "fake.reason-v1:0",
            "price": PRICE,
            "max_output_tokens": 1024,
        },
        {
            "name": "claude-or-mock",
            "upstream": "bedrock",
            "model": "fake.model-v1:0",
            "price": PRICE,
            "max_output_tokens": 1024,
            "fallbacks": ["small"],
        },
    ]
    return data


@pytest.fixture
def clients() -> Iterator[list[openai.OpenAI]]:
    made: list[openai.OpenAI] = []
    yield made
    for c in made:
        c.close()


def sdk(base: str, made: list[openai.OpenAI]) -> openai.OpenAI:
    made.append(openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0))
    return made[-1]


def ledger(base: str) -> dict[tuple[str, str], dict[str, Any]]:
    r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {KEYS['alpha']}"})
    r.raise_for_status()
    return {(b["level"], b["dimension"]): b for b in r.json()["budgets"]}


def test_non_stream_reply_is_charged_what_bedrock_billed(
    fake: Mock, mock: Mock, flushed: LocalValkey, clients: list[openai.OpenAI]
) -> None:
    ask = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say something. [mock:tokens=30] [mock:thinking=12]"},
    ]
    with gateway_thread(config(fake, mock, flushed)) as base:
        done = sdk(base, clients).chat.completions.create(
            model="claude-reason", messages=ask, max_tokens=200, user="alpha"
        )
        message: Any = done.choices[0].message
        assert message.content and getattr(message, "reasoning_content", None)
        assert done.choices[0].finish_reason == "stop"
        truth = fake.truth("alpha")
        assert truth["completed"] == 1 and truth["completion_tokens"] == 42
        assert done.usage is not None
        assert done.usage.prompt_tokens == truth["prompt_tokens"]
        assert done.usage.completion_tokens == truth["completion_tokens"]
        row = ledger(base)[("tenant", "total_tokens")]
        assert row["reserved"] == 0 and row["used"] == truth["total_tokens"]


def test_stream_reasoning_and_text_with_the_usage_bedrock_reported(
    fake: Mock, mock: Mock, flushed: LocalValkey, clients: list[openai.OpenAI]
) -> None:
    ask = [{"role": "user", "content": "Think, then say. [mock:tokens=40] [mock:thinking=25]"}]
    with gateway_thread(config(fake, mock, flushed)) as base:
        chunks = list(
            sdk(base, clients).chat.completions.create(
                model="claude-reason",
                messages=ask,
                max_tokens=300,
                stream=True,
                user="alpha",
                stream_options={"include_usage": True},
            )
        )
        deltas: list[Any] = [c.choices[0].delta for c in chunks if c.choices]
        reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        text = "".join(d.content or "" for d in deltas)
        assert reasoning and text
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        truth = fake.truth("alpha")
        assert truth["completion_tokens"] == 65
        last = chunks[-1].usage
        assert last is not None and last.completion_tokens == 65
        assert last.prompt_tokens == truth["prompt_tokens"]
        assert ledger(base)[("tenant", "total_tokens")]["used"] == truth["total_tokens"]


def test_reasoning_stream_truncated_on_a_60_token_output_budget(
    fake: Mock, mock: Mock, flushed: LocalValkey, clients: list[openai.OpenAI]
) -> None:
    """The seed's live bug, on Bedrock: reasoning deltas count, so the cut comes in them."""
    budget = [{"dimension": "output_tokens", "limit": 60, "window": "day"}]
    data = config(fake, mock, flushed, **{"tenants.0.budgets": budget})
    ask = [
        {
            "role": "user",
            "content": "think hard [mock:thinking=300] [mock:tokens=100] [mock:pace_ms=5]",
        }
    ]
    with gateway_thread(data) as base:
        chunks = list(
            sdk(base, clients).chat.completions.create(
                model="claude-reason", messages=ask, max_tokens=400, stream=True, user="alpha"
            )
        )
        deltas: list[Any] = [c.choices[0].delta for c in chunks if c.choices]
        assert any(getattr(d, "reasoning_content", None) for d in deltas)
        assert not any(d.content for d in deltas)  # cut while still reasoning
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        truth = fake.truth("alpha")
        assert truth["aborted"] == 1  # the event stream was closed, not drained
        assert 0 < truth["completion_tokens"] <= 60
        row = ledger(base)[("tenant", "output_tokens")]
        assert row["reserved"] == 0 and truth["completion_tokens"] <= row["used"] <= 60


def test_tool_call_streams_as_openai_tool_call_deltas(
    fake: Mock, mock: Mock, flushed: LocalValkey, clients: list[openai.OpenAI]
) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris? [mock:tokens=12]"}]
    with gateway_thread(config(fake, mock, flushed)) as base:
        name, args, finish = "", "", None
        for chunk in sdk(base, clients).chat.completions.create(
            model="claude", messages=ask, tools=TOOLS, stream=True, user="alpha"
        ):
            if not chunk.choices:
                continue
            finish = chunk.choices[0].finish_reason or finish
            for call in chunk.choices[0].delta.tool_calls or []:
                assert call.index == 0
                name += call.function.name or "" if call.function else ""
                args += call.function.arguments or "" if call.function else ""
        assert name == "get_weather" and finish == "tool_calls"
        assert list(json.loads(args)) == ["city"]
        truth = fake.truth("alpha")
        assert ledger(base)[("tenant", "total_tokens")]["used"] == truth["total_tokens"]


def test_a_tool_result_round_trip_is_accepted(
    fake: Mock, mock: Mock, flushed: LocalValkey, clients: list[openai.OpenAI]
) -> None:
    """An assistant's tool call and the tool's answer go back as toolUse / toolResult."""
    ask: Any = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "tooluse_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "tooluse_1", "content": "Sunny, 21 C"},
        {"role": "user", "content": "Thanks. [mock:tokens=9]"},
    ]
    with gateway_thread(config(fake, mock, flushed)) as base:
        done = sdk(base, clients).chat.completions.create(
            model="claude", messages=ask, tools=TOOLS, tool_choice="none", user="alpha"
        )
        assert done.choices[0].message.content
        assert fake.truth("alpha")["completion_tokens"] == 9


def test_throttling_is_a_429_for_the_client(
    fake: Mock, mock: Mock, flushed: LocalValkey, clients: list[openai.OpenAI]
) -> None:
    ask = [{"role": "user", "content": "hi [mock:status=429]"}]
    with gateway_thread(config(fake, mock, flushed)) as base:
        c = sdk(base, clients)
        for stream in (False, True):
            with pytest.raises(openai.RateLimitError) as raised:
                c.chat.completions.create(model="claude", messages=ask, stream=stream, user="alpha")
            assert "ThrottlingException" in str(raised.value)
        truth = fake.truth("alpha")
        assert truth["errors"] == 2 and truth["completion_tokens"] == 0
        row = ledger(base)[("tenant", "total_tokens")]
        assert row["used"] == 0 and row["reserved"] == 0


def test_throttled_bedrock_falls_back_to_the_next_route(
    fake: Mock, mock: Mock, flushed: LocalValkey, clients: list[openai.OpenAI]
) -> None:
    ask = [{"role": "user", "content": "hi [mock:bedrock_status=429] [mock:tokens=7]"}]
    with gateway_thread(config(fake, mock, flushed)) as base:
        done = sdk(base, clients).chat.completions.create(
            model="claude-or-mock", messages=ask, user="alpha"
        )
        assert fake.truth("alpha")["errors"] == 1
        served = mock.truth("alpha")
        assert served["completed"] == 1
        assert done.usage is not None and done.usage.completion_tokens == 7
        assert ledger(base)[("tenant", "total_tokens")]["used"] == served["total_tokens"]


def test_a_server_tool_is_refused_naming_it_and_costs_nothing_while_claude_codes_betas_run(
    fake: Mock, mock: Mock, flushed: LocalValkey
) -> None:
    """An Anthropic-format request on a Bedrock route: a server tool is a 400 naming it
    (Bedrock does not run one; sent without it, the request would not do what it asks) and
    nothing is billed. Claude Code's betas run: those Bedrock takes are sent, the others (the
    fake, like Bedrock, answers "invalid beta flag" to them) are not."""
    data = config(fake, mock, flushed)
    data["routes"][-3]["price"] = {**PRICE, "web_search_per_1000": 10.0}  # priced, still refused
    with (
        gateway_thread(data) as base,
        anthropic.Anthropic(
            base_url=base.removesuffix("/v1"), api_key=KEYS["alpha"], max_retries=0
        ) as client,
    ):
        ask: dict[str, Any] = {
            "model": "claude", "max_tokens": 50, "metadata": {"user_id": "alpha"},
            "messages": [{"role": "user", "content": "hi [mock:tokens=4]"}],
        }  # fmt: skip
        web_search = [{"type": "web_search_20250305", "name": "web_search"}]
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.beta.messages.create(**ask, tools=web_search)
        assert "tools[0].type" in caught.value.message
        used = ledger(base)[("tenant", "total_tokens")]
        assert used["used"] == used["reserved"] == 0
        claude_code = ["claude-code-20250219", "interleaved-thinking-2025-05-14",
                       "context-management-2025-06-27", "prompt-caching-scope-2026-01-05",
                       "effort-2025-11-24", "fine-grained-tool-streaming-2025-05-14"]  # fmt: skip
        message = client.beta.messages.create(**ask, betas=claude_code)
        assert message.usage.output_tokens == 4
