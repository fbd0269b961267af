"""Output a provider bills without streaming it: which routes say so, what a request on one
reserves, and the least a stream that ended without its bill is charged."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hardcap_core.chat import ChatRequest
from hardcap_core.config import parse_config
from hardcap_core.config.schema import default_unseen_output
from hardcap_core.config.settings import UnseenOutput
from hardcap_core.gateway.unseen import SEEN, Unseen, unseen_output
from hardcap_core.wire.anthropic_request import parse_messages_request
from hardcap_core.wire.openai_request import parse_chat_request


@pytest.mark.parametrize(
    ("model", "kind"),
    [
        ("claude-sonnet-4-5", "summarized_thinking"),
        ("claude-opus-4-1-20250805", "summarized_thinking"),
        ("claude-haiku-4-5", "summarized_thinking"),
        ("anthropic.claude-sonnet-4-20250514-v1:0", "summarized_thinking"),  # Bedrock
        ("us.anthropic.claude-opus-4-1-20250805-v1:0", "summarized_thinking"),
        ("claude-sonnet-4@20250514", "summarized_thinking"),  # Vertex
        ("anthropic/claude-opus-4.1", "summarized_thinking"),  # OpenRouter
        ("claude-3-7-sonnet-20250219", "none"),  # streams its full thinking
        ("claude-3-5-haiku-latest", "none"),
        ("o1", "silent_reasoning"),
        ("o3-mini", "silent_reasoning"),
        ("o4-mini-2025-04-16", "silent_reasoning"),
        ("openai/o3", "silent_reasoning"),
        ("gpt-5", "silent_reasoning"),
        ("gpt-5-mini", "silent_reasoning"),
        ("gpt-5.1-codex", "silent_reasoning"),
        ("codex-mini-latest", "silent_reasoning"),
        ("gpt-5-chat-latest", "none"),  # does not reason
        ("gpt-4o", "none"),
        ("openai.gpt-oss-120b-1:0", "none"),  # streams its reasoning
        ("mock-small", "none"),
    ],
)
def test_the_default_is_the_model_familys(model: str, kind: UnseenOutput) -> None:
    assert default_unseen_output(model) == kind
    assert default_unseen_output(model.upper()) == kind


def config(route: dict[str, Any]) -> Any:
    return parse_config({
        "upstreams": [{"name": "a", "kind": "anthropic", "base_url": "https://a.example"}],
        "routes": [{"name": "r", "upstream": "a", **route}],
    })  # fmt: skip


def unseen(route: dict[str, Any]) -> UnseenOutput:
    kind: UnseenOutput = config(route).routes["r"].unseen_output
    return kind


def test_a_route_takes_its_models_default_unless_it_says() -> None:
    assert unseen({"model": "claude-sonnet-4-5"}) == "summarized_thinking"
    assert unseen({"model": "claude-sonnet-4-5", "unseen_output": "none"}) == "none"
    assert unseen({"model": "my-o3", "unseen_output": "silent_reasoning"}) == "silent_reasoning"
    # Thinking on is thinking billed: on an Anthropic or Bedrock upstream a model no family
    # names (an alias, an inference profile's ARN) takes thinking as Claude 4 bills it, and
    # only the route itself can say its model streams all of it.
    assert unseen({}) == "summarized_thinking"
    assert unseen({"model": "claude-3-7-sonnet-20250219"}) == "summarized_thinking"
    assert unseen({"model": "claude-3-7-sonnet-20250219", "unseen_output": "none"}) == "none"
    assert unseen({"model": "o3"}) == "silent_reasoning"  # a family may only make it stricter


@pytest.mark.parametrize(
    ("kind", "model", "expected"),
    [
        ("bedrock", "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc",
         "summarized_thinking"),
        ("bedrock", "openai.gpt-oss-120b-1:0", "summarized_thinking"),  # only if it thinks
        ("openai", "my-alias", "none"),  # OpenAI-compatible: thinking is not Anthropic's there
        ("openai", "claude-sonnet-4-5", "summarized_thinking"),
    ],
)  # fmt: skip
def test_the_default_by_upstream_kind(kind: str, model: str, expected: UnseenOutput) -> None:
    upstream: dict[str, Any] = {"name": "u", "kind": kind, "base_url": "https://u.example"}
    if kind == "bedrock":
        upstream = {"name": "u", "kind": kind, "region": "us-east-1"}
    cfg = parse_config({"upstreams": [upstream], "routes": [{"name": "r", "upstream": "u",
                                                             "model": model}]})  # fmt: skip
    assert cfg.routes["r"].unseen_output == expected


def openai(**body: Any) -> ChatRequest:
    raw = {"model": "r", "messages": [{"role": "user", "content": "hi"}], "stream": True, **body}
    return parse_chat_request(json.dumps(raw).encode())


def anthropic(**body: Any) -> ChatRequest:
    raw = {"model": "r", "max_tokens": 4000, "stream": True, **body}
    raw["messages"] = [{"role": "user", "content": "hi"}]
    return parse_messages_request(json.dumps(raw).encode())


@pytest.mark.parametrize(
    ("kind", "chat", "unseen"),
    [
        ("none", anthropic(thinking={"type": "enabled", "budget_tokens": 2048}), SEEN),
        ("summarized_thinking", anthropic(), SEEN),
        ("summarized_thinking", anthropic(thinking={"type": "disabled"}), SEEN),
        (
            "summarized_thinking",
            anthropic(thinking={"type": "enabled", "budget_tokens": 2048}),
            Unseen(tokens=2048),
        ),
        # No budget: the model decides how long to think, up to the cap.
        ("summarized_thinking", anthropic(thinking={"type": "adaptive"}), Unseen(whole=True)),
        # A budget at or past the cap (the OpenAI format does not check it): the cap bounds it.
        (
            "summarized_thinking",
            openai(thinking={"type": "enabled", "budget_tokens": 5000}),
            Unseen(whole=True),
        ),
        ("silent_reasoning", openai(), Unseen(whole=True)),
        ("silent_reasoning", openai(reasoning_effort="high"), Unseen(whole=True)),
        ("silent_reasoning", openai(reasoning_effort="none"), SEEN),
    ],
)
def test_what_a_request_may_have_billed_unseen(
    kind: UnseenOutput, chat: ChatRequest, unseen: Unseen
) -> None:
    route = config({"model": "m", "unseen_output": kind}).routes["r"]
    assert unseen_output(route, chat, 4000) == unseen


@pytest.mark.parametrize(
    ("unseen", "hold", "least"),
    [
        (SEEN, 150, 16),  # as ever: the estimate, shrunk to 16 at the tail of a budget
        # The thinking budget and the least output, whatever the estimate; never shrunk below.
        (Unseen(tokens=1024), 1040, 1040),
        (Unseen(tokens=4000), 4000, 4000),  # within the cap
        # Any of it may be unseen: the whole cap, shrunk at the tail (the provider is asked
        # for the hold, whatever it is).
        (Unseen(whole=True), 4000, 16),
    ],
)
def test_what_a_stream_reserves(unseen: Unseen, hold: int, least: int) -> None:
    assert unseen.hold(150, 4000, 16) == hold
    assert unseen.least(16, 4000) == least
    assert Unseen(tokens=100).hold(2000, 4000, 16) == 2000  # a larger estimate stands


@pytest.mark.parametrize(
    ("unseen", "held", "asked", "received_least", "least"),
    [
        (SEEN, 1040, 1700, 0, 0),  # a route that streams all it bills: no floor
        (Unseen(tokens=1024), 1040, 1700, 0, 1040),  # the hold
        (Unseen(tokens=1024), 1800, 1700, 0, 1700),  # no more than it was asked for
        (Unseen(tokens=1024), 1800, 1700, 1750, 1800),  # unless it proved it ignored that
        (Unseen(whole=True), None, 4000, 0, 4000),  # fails open: the cap it was sent
        (Unseen(whole=True), None, None, 0, 0),
    ],
)
def test_the_least_a_stream_that_ended_without_its_bill_is_charged(
    unseen: Unseen, held: int | None, asked: int | None, received_least: int, least: int
) -> None:
    assert unseen.least_billed(held, asked, received_least) == least


def test_a_request_says_how_it_thinks() -> None:
    assert anthropic(thinking={"type": "enabled", "budget_tokens": 1024}).thinking_budget == 1024
    assert anthropic(thinking={"type": "adaptive"}).thinking_budget is None
    assert anthropic(thinking={"type": "adaptive"}).thinks
    assert not anthropic(thinking={"type": "disabled"}).thinks
    assert not openai().thinks and openai().reasons
    assert openai(thinking={"type": "new-kind"}).thinks  # unknown: counted as thinking
    assert openai(thinking={"budget_tokens": True}).thinking_budget is None
    assert not openai(reasoning_effort="none").reasons
