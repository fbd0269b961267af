"""The official `openai` SDK against `/v1/responses`, through the gateway to the
OpenAI-compatible mock upstream (served by translation into chat completions), on real Valkey:
replies, streams (the SDK's stream helper parses every event), function tools, reasoning, a
turn cut by the budget, a refused turn, refused fields, and usage equal to the mock's ground
truth and the ledger's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from hardcap_core.local.bedrock_fake import CREDENTIALS_ENV, FakeSettings, create_bedrock_fake_app
from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.servers import ThreadServer
from hardcap_core.local.valkey import LocalValkey, free_port
from tests.stack import KEYS, Mock, config_data, gateway, gateway_thread, mock_fixture
from tests.stack import openai_client as client

HI = "Say something about budgets."
WEATHER: Any = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": False,
    }
]


mock = mock_fixture(MockSettings(pace_ms=0.5, seed=23))


def used(base: str, dimension: str = "total_tokens") -> dict[str, Any]:
    r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {KEYS['alpha']}"})
    r.raise_for_status()
    rows = {(b["level"], b["dimension"]): b for b in r.json()["budgets"]}
    row: dict[str, Any] = rows[("tenant", dimension)]
    return row


def numbered(events: list[Any]) -> None:
    """Every event carries its sequence_number, 0, 1, 2, ... in order."""
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_unary_response_usage_is_the_mocks_and_the_ledgers(
    mock: Mock, flushed: LocalValkey
) -> None:
    with gateway(mock, flushed) as base:
        raw = client(base).responses.with_raw_response.create(
            model="small",
            instructions="Be brief.",
            input=HI,
            max_output_tokens=50,
            user="alpha",
            metadata={"app": "test"},
        )
        response = raw.parse()
        assert response.object == "response" and response.model == "small"
        assert response.status in ("completed", "incomplete")
        assert response.output[0].type == "message" and response.output_text
        truth = mock.truth("alpha")
        usage = response.usage
        assert usage is not None
        assert usage.output_tokens == truth["completion_tokens"] <= 50
        assert usage.input_tokens == truth["prompt_tokens"]
        assert usage.total_tokens == truth["total_tokens"]
        row = used(base)
        assert row["used"] == truth["total_tokens"] and row["reserved"] == 0
        assert raw.headers["x-hardcap-tokens-charged"] == str(truth["total_tokens"])
        assert float(raw.headers["x-hardcap-cost-usd"]) > 0


def test_stream_with_the_helper_and_with_create(mock: Mock, flushed: LocalValkey) -> None:
    # A length of its own: the mock's random one depends on what the module ran before on this
    # worker, and one past the route's cap ends in response.incomplete, not completed.
    ask = f"{HI} [mock:tokens=40]"
    with gateway(mock, flushed) as base:
        c = client(base)
        with c.responses.stream(model="small", input=ask, user="alpha") as s:
            events = list(s)
            final = s.get_final_response()
        numbered(events)
        kinds = [e.type for e in events]
        assert kinds[:3] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
        ]
        assert kinds[-1] == "response.completed"
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert deltas and final.output_text == "".join(deltas)
        assert kinds.count("response.content_part.added") == 1
        assert kinds.count("response.output_item.done") == 1
        truth = mock.truth("alpha")
        assert final.usage is not None
        assert final.usage.output_tokens == truth["completion_tokens"]
        assert final.usage.input_tokens == truth["prompt_tokens"]
        assert final.usage.model_extra and final.usage.model_extra["hardcap"]["cost_usd"] > 0

        streamed = list(c.responses.create(model="small", input=ask, user="alpha", stream=True))
        numbered(streamed)
        last = streamed[-1]
        assert last.type == "response.completed"
        assert last.response.output[0].type == "message"
        assert used(base)["used"] == mock.truth("alpha")["total_tokens"]
        assert used(base)["reserved"] == 0


def test_function_tool_round_trip_stream_and_not(mock: Mock, flushed: LocalValkey) -> None:
    ask = "What is the weather in Paris? [mock:tokens=20]"
    with gateway(mock, flushed) as base:
        c = client(base)
        first = c.responses.create(model="small", input=ask, tools=WEATHER, user="alpha")
        calls = [item for item in first.output if item.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather"
        assert isinstance(json.loads(calls[0].arguments), dict) and calls[0].call_id
        # The call and its output go back as items: an assistant's tool call and a tool message.
        follow: Any = [
            {"role": "user", "content": ask},
            *[item.model_dump(exclude_none=True) for item in first.output],
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"},
            {"role": "user", "content": [{"type": "input_text", "text": "And tomorrow?"}]},
        ]
        second = c.responses.create(
            model="small", input=follow, tools=WEATHER, tool_choice="none", user="alpha"
        )
        assert second.output[0].type == "message" and second.output_text

        with c.responses.stream(
            model="small",
            input=ask,
            tools=WEATHER,
            tool_choice={"type": "function", "name": "get_weather"},
            parallel_tool_calls=False,
            user="alpha",
        ) as s:
            events = list(s)
            final = s.get_final_response()
        numbered(events)
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.delta" in kinds
        assert "response.function_call_arguments.done" in kinds
        call = next(item for item in final.output if item.type == "function_call")
        assert call.name == "get_weather" and isinstance(json.loads(call.arguments), dict)
        assert used(base)["used"] == mock.truth("alpha")["total_tokens"]


def test_reasoning_streams_as_a_reasoning_summary(mock: Mock, flushed: LocalValkey) -> None:
    with gateway(mock, flushed) as base:
        with client(base).responses.stream(
            model="reason",
            input="think [mock:thinking=12] [mock:tokens=5]",
            reasoning={"effort": "low", "summary": "auto"},
            user="alpha",
        ) as s:
            events = list(s)
            final = s.get_final_response()
        kinds = [e.type for e in events]
        assert "response.reasoning_summary_text.delta" in kinds
        assert [item.type for item in final.output] == ["reasoning", "message"]
        reasoning = final.output[0]
        assert reasoning.type == "reasoning" and reasoning.summary[0].text
        truth = mock.truth("alpha")
        assert final.usage is not None
        assert final.usage.output_tokens == truth["completion_tokens"]
        assert final.usage.output_tokens_details.reasoning_tokens >= 12
        assert used(base)["used"] == truth["total_tokens"]


def test_a_stream_cut_at_a_60_token_budget_ends_incomplete(
    mock: Mock, flushed: LocalValkey
) -> None:
    budget = [{"dimension": "output_tokens", "limit": 60, "window": "day"}]
    with gateway(mock, flushed, **{"tenants.0.budgets": budget}) as base:
        events = list(
            client(base).responses.create(
                model="small",
                input="Go on [mock:tokens=400] [mock:pace_ms=2]",
                max_output_tokens=400,
                user="alpha",
                stream=True,
            )
        )
        numbered(events)
        last = events[-1]
        assert last.type == "response.incomplete"
        response = last.response
        assert response.status == "incomplete"
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text and response.output_text == text  # the partial text is kept
        message = response.output[0]
        assert message.type == "message" and message.status == "incomplete"
        truth = mock.truth("alpha")
        # Closed by the gateway, or stopped by the provider at the cap the gateway asked for
        # (the room left: which comes first is a race), never drained past the budget.
        assert truth["aborted"] == 1 or truth["completion_tokens"] <= 60, truth
        row = used(base, "output_tokens")
        assert row["reserved"] == 0 and truth["completion_tokens"] <= row["used"] <= 60
        assert response.usage is not None and response.usage.output_tokens == row["used"]


def test_a_spent_budget_refuses_the_turn_with_a_clear_error(
    mock: Mock, flushed: LocalValkey
) -> None:
    budget = [{"dimension": "total_tokens", "limit": 30, "window": "day"}]
    with gateway(mock, flushed, **{"tenants.0.budgets": budget}) as base:
        with pytest.raises(openai.RateLimitError) as refused:
            client(base).responses.create(
                model="small", input=HI, max_output_tokens=500, user="alpha"
            )
        assert refused.value.status_code == 429
        assert refused.value.code == "budget_exceeded"
        assert refused.value.response.headers["x-should-retry"] == "false"
        with pytest.raises(openai.RateLimitError):
            list(client(base).responses.create(model="small", input=HI, stream=True))
        nothing = used(base)
        assert (nothing["used"], nothing["reserved"]) == (0, 0)
        assert mock.truth("alpha") == {}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"conversation": "conv_123"}, "conversation"),
        ({"background": True}, "background"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"tools": [{"type": "web_search"}]}, "web_search"),
        (
            {"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]},
            "code_interpreter",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"made_up_field": 1}, "made_up_field"),
    ],
)
def test_a_field_the_gateway_cannot_bound_is_refused_naming_it(
    base: str, mock: Mock, fields: dict[str, Any], named: str
) -> None:
    body = {"model": "small", "input": HI, "user": "alpha", **fields}
    with pytest.raises(openai.BadRequestError) as refused:
        client(base).post("/responses", body=body, cast_to=httpx.Response)
    error: Any = refused.value.body
    assert error["type"] == "invalid_request_error"
    assert named in error["message"]
    assert mock.truth("alpha") == {}  # refused before admission: nothing was sent or held
    assert used(base)["reserved"] == 0


def test_null_fields_and_background_false_are_not_given(base: str, mock: Mock) -> None:
    body = {
        "model": "small", "input": HI, "user": "alpha", "background": False,
        "previous_response_id": None, "conversation": None, "store": False,
        "include": ["reasoning.encrypted_content"], "truncation": "auto",
        "text": {"format": {"type": "text"}}, "prompt_cache_key": "k1",
    }  # fmt: skip
    response = client(base).responses.create(**body)
    assert response.output_text


def test_an_error_mid_stream_ends_as_response_failed(mock: Mock, flushed: LocalValkey) -> None:
    with gateway(mock, flushed) as base:
        events = list(
            client(base).responses.create(
                model="small",
                input="go [mock:tokens=50] [mock:die_after=5]",
                user="alpha",
                stream=True,
            )
        )
        numbered(events)
        assert [e.type for e in events[-2:]] == ["error", "response.failed"]
        assert events[-1].response.status == "failed"
        assert used(base)["reserved"] == 0


def test_the_quote_takes_a_responses_body(base: str, mock: Mock) -> None:
    body = {"model": "small", "input": HI, "max_output_tokens": 64}
    got = httpx.post(
        f"{base}/hardcap/quote", json=body, headers={"authorization": f"Bearer {KEYS['alpha']}"}
    )
    assert got.status_code == 200, got.text
    q = got.json()
    assert q["decision"]["action"] == "admit" and q["max_tokens"] == 64
    assert q["input_tokens"] > 0
    assert mock.truth("alpha") == {}


# -- in front of an Anthropic upstream (the mock's Anthropic mode), by translation both ways -------

KEY_ENV = "HARDCAP_TEST_ANTHROPIC_KEY"


def claude(mock: Mock, valkey: LocalValkey, **overrides: Any) -> Any:
    """A gateway whose routes `claude` and `claude-small` go to the mock's Anthropic mode."""
    data = config_data(mock.url, valkey.url, **overrides)
    data["upstreams"].append(
        {"name": "anthropic-mock", "kind": "anthropic", "base_url": f"{mock.url}/v1",
         "api_key_env": KEY_ENV, "timeout_seconds": 5}
    )  # fmt: skip
    price = {"input_per_million": 3.0, "output_per_million": 15.0}
    for name, model in (("claude", "mock-reason"), ("claude-small", "mock-small")):
        data["routes"].append(
            {"name": name, "upstream": "anthropic-mock", "model": model, "price": price,
             "max_output_tokens": 4096}
        )  # fmt: skip
    return gateway_thread(data)


@pytest.fixture
def anthropic_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-ant-mock")


@pytest.mark.usefixtures("anthropic_key")
def test_anthropic_upstream_stream_tools_and_cached_usage(mock: Mock, flushed: LocalValkey) -> None:
    ask = "Weather in Paris? [mock:tool_use=1] [mock:tokens=12] [mock:cache_read=10]"
    with claude(mock, flushed) as base:
        c = client(base)
        with c.responses.stream(model="claude-small", input=ask, tools=WEATHER, user="alpha") as s:
            events = list(s)
            first = s.get_final_response()
        numbered(events)
        call = next(item for item in first.output if item.type == "function_call")
        assert call.name == "get_weather" and json.loads(call.arguments)
        assert call.call_id.startswith("toolu_")  # the upstream's own id, so its result matches
        truth = mock.truth("alpha")
        assert first.usage is not None
        assert first.usage.input_tokens == truth["prompt_tokens"]
        assert first.usage.input_tokens_details.cached_tokens == 10
        assert first.usage.output_tokens == truth["completion_tokens"]
        follow: Any = [
            {"role": "user", "content": ask},
            *[item.model_dump(exclude_none=True) for item in first.output],
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"},
            {"role": "user", "content": "Thanks [mock:tokens=4]"},
        ]
        second = c.responses.create(
            model="claude-small", input=follow, tools=WEATHER, instructions="Be brief.",
            user="alpha",
        )  # fmt: skip
        assert second.output_text
        assert used(base)["used"] == mock.truth("alpha")["total_tokens"]


@pytest.mark.usefixtures("anthropic_key")
def test_anthropic_upstream_cut_at_a_60_token_budget(mock: Mock, flushed: LocalValkey) -> None:
    budget = [{"dimension": "output_tokens", "limit": 60, "window": "day"}]
    with claude(mock, flushed, **{"tenants.0.budgets": budget}) as base:
        events = list(
            client(base).responses.create(
                model="claude",
                input="Think [mock:thinking=400] [mock:pace_ms=2]",
                max_output_tokens=400,
                user="alpha",
                stream=True,
            )
        )
        numbered(events)
        last = events[-1]
        assert last.type == "response.incomplete"
        assert last.response.incomplete_details is not None
        assert last.response.incomplete_details.reason == "max_output_tokens"
        assert last.response.output[0].type == "reasoning"  # the thinking so far is kept
        truth = mock.truth("alpha")
        assert truth["aborted"] == 1 and truth["completion_tokens"] <= 60
        row = used(base, "output_tokens")
        assert row["reserved"] == 0 and truth["completion_tokens"] <= row["used"] <= 60
        assert last.response.usage is not None and last.response.usage.output_tokens == row["used"]


def test_input_tokens_is_the_reservation_and_costs_nothing(base: str, mock: Mock) -> None:
    c = client(base)
    counted = c.responses.input_tokens.count(
        model="small", input=HI, instructions="Be brief.", tools=WEATHER
    )
    plain = c.responses.input_tokens.count(model="small", input=HI)
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens > plain.input_tokens > 0
    assert mock.truth("alpha") == {}  # no upstream call
    assert (used(base)["used"], used(base)["reserved"]) == (0, 0)
    # An upper bound on what the provider bills for the same input.
    response = c.responses.create(model="small", input=HI, max_output_tokens=5, user="alpha")
    assert response.usage is not None and plain.input_tokens >= response.usage.input_tokens
    # An id the gateway never stored for this tenant (tests/e2e/test_stored_responses.py).
    with pytest.raises(openai.NotFoundError) as unknown:
        c.responses.input_tokens.count(model="small", input=HI, previous_response_id="resp_1")
    assert unknown.value.code == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        c.responses.input_tokens.count(model="nope", input=HI)
    with pytest.raises(openai.PermissionDeniedError):
        client(base, KEYS["beta"]).responses.input_tokens.count(model="reason", input=HI)


def test_a_cap_over_the_routes_is_refused_naming_max_output_tokens(base: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client(base).responses.create(model="small", input=HI, max_output_tokens=5000)
    assert refused.value.param == "max_output_tokens"
    assert "'max_output_tokens' is 5000" in refused.value.message
    assert "max_completion_tokens" not in refused.value.message


def test_concurrent_streams_never_take_the_tenant_past_its_budget(
    mock: Mock, flushed: LocalValkey
) -> None:
    budget = [{"dimension": "total_tokens", "limit": 2_000, "window": "day"}]

    async def one(c: openai.AsyncOpenAI, i: int) -> str:
        try:
            stream = await c.responses.create(
                model="small", input=f"Stream {i} [mock:tokens=300] [mock:pace_ms=2]",
                max_output_tokens=400, user="alpha", stream=True,
            )  # fmt: skip
            events = [event async for event in stream]
        except openai.RateLimitError:
            return "refused"
        numbered(events)
        return events[-1].type

    async def run(base: str) -> list[str]:
        async with openai.AsyncOpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0) as c:
            return list(await asyncio.gather(*(one(c, i) for i in range(16))))

    with gateway(mock, flushed, **{"tenants.0.budgets": budget}) as base:
        ends = asyncio.run(run(base))
        truth = mock.truth("alpha")
        row = used(base)
    assert set(ends) <= {"response.completed", "response.incomplete", "refused"}, ends
    assert "response.incomplete" in ends or "refused" in ends  # the budget really ran out
    assert row["reserved"] == 0 and truth["in_flight"] == 0
    assert truth["total_tokens"] <= row["used"] <= 2_000, (truth, row, ends)


@pytest.mark.usefixtures("anthropic_key")
def test_anthropic_upstream_reasoning_effort_becomes_thinking(
    mock: Mock, flushed: LocalValkey
) -> None:
    with claude(mock, flushed) as base:
        with client(base).responses.stream(
            model="claude",
            input="Think it through [mock:tokens=6]",
            reasoning={"effort": "medium"},
            max_output_tokens=3000,
            user="alpha",
        ) as s:
            final = s.get_final_response()
        assert [item.type for item in final.output] == ["reasoning", "message"]
        reasoning = final.output[0]
        assert reasoning.type == "reasoning" and reasoning.summary[0].text
        truth = mock.truth("alpha")
        assert final.usage is not None
        assert final.usage.output_tokens == truth["completion_tokens"]
        assert used(base)["used"] == truth["total_tokens"]
        # Without an effort, no thinking: Anthropic's default.
        plain = client(base).responses.create(
            model="claude-small", input="Hi [mock:tokens=3]", user="alpha"
        )
        assert [item.type for item in plain.output] == ["message"]


# -- in front of Bedrock Converse (the local fake: SigV4, event-stream frames) --------------------


@pytest.fixture(scope="module")
def bedrock() -> Iterator[Mock]:
    """The Bedrock fake, read through the mock's ground-truth helper (same paths)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CREDENTIALS_ENV.items():
            patch.setenv(name, value)
        server = ThreadServer(
            create_bedrock_fake_app(FakeSettings(pace_ms=0.5, seed=7)), free_port()
        )
        truth = Mock(url=server.start().url)
        yield truth
        truth.stop()
        server.stop()


def test_bedrock_upstream_stream_with_reasoning_and_a_tool_call(
    mock: Mock, bedrock: Mock, flushed: LocalValkey
) -> None:
    bedrock.reset()
    data = config_data(mock.url, flushed.url)
    data["upstreams"].append(
        {"name": "bedrock", "kind": "bedrock", "base_url": bedrock.url, "timeout_seconds": 5}
    )
    data["routes"].append(
        {"name": "claude-reason", "upstream": "bedrock", "model": "fake.reason-v1:0",
         "price": {"input_per_million": 3.0, "output_per_million": 15.0},
         "max_output_tokens": 1024}
    )  # fmt: skip
    with gateway_thread(data) as base:
        with client(base).responses.stream(
            model="claude-reason",
            input="Weather in Paris? [mock:thinking=8] [mock:tokens=10] [mock:tool_use=1]",
            tools=WEATHER,
            user="alpha",
        ) as s:
            events = list(s)
            final = s.get_final_response()
        numbered(events)
        kinds = [item.type for item in final.output]
        assert kinds[0] == "reasoning" and "function_call" in kinds
        truth = bedrock.truth("alpha")
        assert final.usage is not None
        assert final.usage.input_tokens == truth["prompt_tokens"]
        assert final.usage.output_tokens == truth["completion_tokens"]
        assert used(base)["used"] == truth["total_tokens"] and used(base)["reserved"] == 0


def test_a_stored_response_is_never_found_and_asks_for_the_key(base: str) -> None:
    c = client(base)
    for call in (
        lambda: c.responses.retrieve("resp_123"),
        lambda: c.responses.delete("resp_123"),
        lambda: c.responses.cancel("resp_123"),
        lambda: c.responses.input_items.list("resp_123"),
    ):
        with pytest.raises(openai.NotFoundError) as missing:
            call()
        assert "resp_123" in missing.value.message and missing.value.code == "not_found"
    with pytest.raises(openai.AuthenticationError):
        client(base, "sk-wrong").responses.retrieve("resp_123")


def test_a_service_tier_the_route_does_not_price_is_refused(base: str, mock: Mock) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client(base).responses.create(model="small", input=HI, service_tier="priority")
    assert refused.value.param == "service_tier"
    assert mock.truth("alpha") == {}


def test_a_lease_caps_a_responses_stream(base: str, mock: Mock) -> None:
    opened = httpx.post(
        f"{base}/hardcap/leases", json={"tokens": 150, "ttl_seconds": 60},
        headers={"authorization": f"Bearer {KEYS['alpha']}"},
    )  # fmt: skip
    assert opened.status_code == 201, opened.text
    lease = opened.json()["id"]
    events = list(
        client(base).responses.create(
            model="small", input="Go on [mock:tokens=400] [mock:pace_ms=1]",
            max_output_tokens=400, user="alpha", stream=True,
            extra_headers={"x-hardcap-lease": lease},
        )
    )  # fmt: skip
    assert events[-1].type == "response.incomplete"
    state = httpx.get(
        f"{base}/hardcap/leases/{lease}", headers={"authorization": f"Bearer {KEYS['alpha']}"}
    ).json()
    truth = mock.truth("alpha")
    assert truth["total_tokens"] <= state["spent"]["tokens"] <= 150
    assert state["held"]["tokens"] == 0


@pytest.mark.usefixtures("anthropic_key")
def test_anthropic_upstream_signed_thinking_goes_back_with_the_tool_result(
    mock: Mock, flushed: LocalValkey
) -> None:
    """With thinking on, Anthropic wants the last assistant turn's signed thinking back ahead
    of its tool call: the reasoning item carries it in encrypted_content, stream or not."""
    ask = "Weather in Paris? [mock:tool_use=1] [mock:thinking=6] [mock:tokens=8]"
    with claude(mock, flushed) as base:
        c = client(base)
        with c.responses.stream(
            model="claude",
            input=ask,
            tools=WEATHER,
            reasoning={"effort": "low"},
            max_output_tokens=3000,
            user="alpha",
        ) as s:
            first = s.get_final_response()
        whole = c.responses.create(
            model="claude", input=ask, tools=WEATHER, reasoning={"effort": "low"},
            max_output_tokens=3000, user="alpha",
        )  # fmt: skip
        for response in (first, whole):
            reasoning = response.output[0]
            assert reasoning.type == "reasoning" and reasoning.encrypted_content
            call = next(item for item in response.output if item.type == "function_call")
            follow: Any = [
                {"role": "user", "content": ask},
                *[item.model_dump(exclude_none=True) for item in response.output],
                {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"},
            ]
            again = c.responses.create(
                model="claude", input=follow, tools=WEATHER, reasoning={"effort": "low"},
                max_output_tokens=3000, user="alpha",
            )  # fmt: skip
            assert again.output
        assert used(base)["used"] == mock.truth("alpha")["total_tokens"]
