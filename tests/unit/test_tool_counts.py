"""Tools counted as OpenAI renders them (hardcap_core/wire/openai_tools.py), never below the
bill and within 10% of it.

The mock upstream bills tools the way OpenAI documents them (the cookbook's num_tokens_for_tools,
or the TypeScript-like namespace OpenAI renders, whichever is more), tool calls by their id, name
and argument text. The exact count of a route with a public tokenizer is checked per group
(definitions, calls, results) on the agent requests of the input corpus, in both encodings,
and for the Responses API's function tools, which share the rule. Counted as JSON (the count
before this rule) the definitions were 1.6 times their bill and the calls 1.3 times.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hardcap_core.local import mock_billing
from hardcap_core.tokenize import vocabularies
from hardcap_core.tokenize.counters import BpeCounter, CalibratedCounter
from hardcap_core.wire.openai_responses_request import parse_responses_request
from hardcap_core.wire.openai_tools import render_functions
from tests.input_shapes import agent_tool, agent_turns, shape
from tests.unit.test_tokenizers import WEATHER_MESSAGES, WEATHER_TOOL

ENCODINGS = ("o200k_base", "cl100k_base")
TOLERANCE = 1.10
Bill = Callable[[dict[str, Any]], int]


@pytest.fixture(params=ENCODINGS)
def billed_in(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Bill]]:
    """An encoding, and the mock's bill in it (the mock's own is cl100k_base)."""
    name: str = request.param
    if name != "cl100k_base":
        monkeypatch.setattr(mock_billing, "_encoding", lambda: vocabularies.encoding(name))
    yield name, mock_billing.prompt_tokens


def group(body: dict[str, Any], without: dict[str, Any], name: str, bill: Bill) -> float:
    """counted / billed for what ``body`` has beyond ``without``: never below 1."""
    counter = BpeCounter(name)
    counted = counter.count(body) - counter.count(without)
    billed = bill(body) - bill(without)
    assert counted >= billed > 0
    return counted / billed


def test_the_cookbook_example_is_counted_within_10_percent_of_the_api() -> None:
    """The cookbook shows the API counting 101 prompt tokens (gpt-4o) and 105 (gpt-4) for its
    weather tool and two messages; the JSON count was 126 and 130."""
    body = {"model": "m", "messages": WEATHER_MESSAGES, "tools": [WEATHER_TOOL]}
    for name, api in (("o200k_base", 101), ("cl100k_base", 105)):
        assert api <= BpeCounter(name).count(body) <= api * TOLERANCE


def test_the_rendering_is_the_namespace_openai_shows() -> None:
    text = render_functions([WEATHER_TOOL["function"]])
    assert "type get_current_weather = (_: {\n" in text
    assert '// The unit of temperature to return\nunit?: "celsius" | "fahrenheit",' in text
    assert "location: string," in text  # required: no "?"
    nested = render_functions([agent_tool(1)["function"]])
    assert 'kind: "user" | "team" | "bot",' in nested and "labels?: string[]," in nested
    assert "// maximum: 500" in nested and "timeout_s?: number | null," in nested


def test_agent_tool_definitions_within_10_percent(billed_in: tuple[str, Bill]) -> None:
    name, bill = billed_in
    body = json.loads(shape("agent: 24 tools, nested schemas and enums"))
    without = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
    assert group(body, without, name, bill) <= TOLERANCE


def test_parallel_tool_calls_and_long_results_within_10_percent(
    billed_in: tuple[str, Bill],
) -> None:
    name, bill = billed_in
    for turns in (agent_turns(6, 4, 300), agent_turns(3, 1, 6_000)):
        calls = [{k: v for k, v in m.items() if k != "tool_calls"} for m in turns]
        results = [m for m in turns if m["role"] != "tool"]
        assert group({"messages": turns}, {"messages": calls}, name, bill) <= TOLERANCE
        assert group({"messages": turns}, {"messages": results}, name, bill) <= TOLERANCE


@pytest.mark.parametrize(
    "shape_name",
    ["agent: 24 tools, nested schemas and enums", "agent: parallel tool calls",
     "agent: long tool results", "tools + functions", "tool-call history"],
)  # fmt: skip
def test_whole_agent_requests_within_10_percent(
    shape_name: str, billed_in: tuple[str, Bill]
) -> None:
    name, bill = billed_in
    body = json.loads(shape(shape_name))
    assert bill(body) <= BpeCounter(name).count(body) <= bill(body) * TOLERANCE


def test_responses_function_tools_share_the_rule() -> None:
    tools = [agent_tool(i) for i in range(20)]
    responses = {
        "model": "m",
        "input": "Triage the open issues.",
        "tools": [{"type": "function", **t["function"]} for t in tools],
    }
    chat = parse_responses_request(json.dumps(responses).encode()).body
    counted = BpeCounter("cl100k_base").count(chat)
    billed = mock_billing.prompt_tokens(chat)
    assert billed <= counted <= billed * TOLERANCE


def test_a_claude_route_keeps_counting_tools_by_their_json() -> None:
    """Anthropic puts a tool's JSON schema in its prompt: its count is not the OpenAI rendering."""
    body = json.loads(shape("agent: 24 tools, nested schemas and enums"))
    json_tokens = sum(mock_billing.value_tokens(t) for t in body["tools"])
    assert CalibratedCounter().count(body) >= 2 * json_tokens
