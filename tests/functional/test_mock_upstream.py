"""The mock upstream, tested as the gateway will use it: a real uvicorn server on a free port,
with httpx and the official OpenAI SDK as clients."""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from hardcap_core.local.mock_plan import VOCABULARY, ChatRequest, estimate_prompt_tokens, make_plan
from hardcap_core.local.mock_upstream import (
    MockSettings,
    add_mock_arguments,
    create_mock_app,
    settings_from_args,
)

# Any: the SDK's TypedDict unions make literal tool definitions awkward to type.
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


class MockServer:
    """The mock under uvicorn in a background thread, on a socket bound before it starts."""

    def __init__(self, settings: MockSettings) -> None:
        self.settings = settings
        # proto must be IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY on accepted
        # connections only then, and without it Nagle plus delayed ACKs add 40 ms per request.
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.bind(("127.0.0.1", 0))
        port = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            create_mock_app(settings), log_level="warning", http="h11", ws="none",
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )
        # One client for the test's side requests: building an httpx.Client (its SSL context)
        # costs tens of milliseconds, which a fresh httpx.get pays every time.
        self.http = httpx.Client(base_url=self.url)

    def __enter__(self) -> MockServer:
        self._thread.start()
        deadline = time.monotonic() + 5
        while not self._server.started:
            assert time.monotonic() < deadline, "mock server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self.http.close()
        self._server.should_exit = True
        self._thread.join(timeout=5)
        self._socket.close()

    def truth(self, tenant: str, settle_s: float = 2.0) -> dict[str, int]:
        """The tenant's ground truth once nothing of it is in flight any more."""
        deadline = time.monotonic() + settle_s
        while True:
            tenants = self.http.get("/mock/ground-truth").json()["tenants"]
            record: dict[str, int] = tenants.get(tenant, {})
            if record.get("in_flight", 0) == 0 or time.monotonic() > deadline:
                return record
            time.sleep(0.01)


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServer]:
    with MockServer(MockSettings(pace_ms=0, seed=7)) as server:
        yield server


@pytest.fixture
def sdk(mock: MockServer) -> Iterator[openai.OpenAI]:
    # No retries: an injected 503 must surface once, not be retried behind the test's back.
    with openai.OpenAI(base_url=f"{mock.url}/v1", api_key="x", max_retries=0) as client:
        yield client


def ask(text: str) -> list[Any]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


def sse_chunks(response: httpx.Response) -> Iterator[dict[str, Any] | str]:
    """Decoded `data:` payloads of an SSE response; "[DONE]" as the string itself."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            yield data if data == "[DONE]" else json.loads(data)


def test_vocabulary_pieces_are_about_four_characters() -> None:
    mean = sum(map(len, VOCABULARY)) / len(VOCABULARY)
    assert 3.5 <= mean <= 4.6
    assert not any('"' in piece or "\\" in piece for piece in VOCABULARY)


def test_prompt_estimate_counts_text_parts_and_messages() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "x" * 10},
        {"role": "user", "content": [{"type": "text", "text": "y" * 6}, {"type": "image_url"}]},
        {"role": "assistant", "content": None},
    ]
    assert estimate_prompt_tokens(messages) == 4 + 3 * 4  # ceil(16 / 4) + 4 per message


def test_same_seed_same_answers() -> None:
    req = ChatRequest(model="mock-reason", messages=ask("hi"))
    plans = [
        [make_plan(req, rng, median_tokens=50, sigma=1.0, reasoning_tokens=0, pace_ms=0)
         for _ in range(3)]
        for rng in (random.Random(3), random.Random(3))
    ]
    assert plans[0] == plans[1]


def test_models_and_health(mock: MockServer, sdk: openai.OpenAI) -> None:
    assert {"mock-small", "mock-reason"} <= {m.id for m in sdk.models.list()}
    assert mock.http.get("/healthz").json() == {"ok": True}


def test_non_stream_completion_has_usage(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(model="mock-small", messages=ask("hello there"))
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == estimate_prompt_tokens(ask("hello there"))
    assert completion.usage.completion_tokens >= 1
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )


def test_stream_with_usage_ends_with_usage_chunk_then_done(mock: MockServer) -> None:
    body = {"model": "mock-small", "messages": ask("[mock:tokens=12]"), "stream": True,
            "stream_options": {"include_usage": True}, "some_future_field": 1}
    with mock.http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = list(sse_chunks(response))
    assert chunks[-1] == "[DONE]"
    usage_chunk, finish_chunk, first = chunks[-2], chunks[-3], chunks[0]
    assert isinstance(usage_chunk, dict)
    assert isinstance(finish_chunk, dict)
    assert isinstance(first, dict)
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert finish_chunk["choices"][0]["finish_reason"] == "stop"
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 12
    tokens = [c["choices"][0]["delta"]["content"] for c in chunks[1:-3] if isinstance(c, dict)]
    assert len(tokens) == 12
    assert all(tokens)


def test_sdk_stream_reassembles_text(sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="mock-small", messages=ask("[mock:tokens=30]"), stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        usage = chunk.usage or usage
    assert usage is not None
    assert usage.completion_tokens == 30
    assert 30 <= len(text) <= 30 * 10


def test_max_tokens_caps_with_finish_reason_length(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(
        model="mock-small", messages=ask("[mock:tokens=500]"), max_tokens=7
    )
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 7
    stream = sdk.chat.completions.create(
        model="mock-small", messages=ask("[mock:tokens=500]"), max_completion_tokens=5,
        stream=True,
    )
    chunks = list(stream)
    assert sum(1 for c in chunks if c.choices[0].delta.content) == 5
    assert chunks[-1].choices[0].finish_reason == "length"


def test_output_length_is_log_normal_around_the_median(sdk: openai.OpenAI) -> None:
    lengths = []
    for _ in range(300):
        completion = sdk.chat.completions.create(model="mock-small", messages=ask("go"))
        assert completion.usage is not None
        lengths.append(completion.usage.completion_tokens)
    assert 110 <= statistics.median(lengths) <= 200
    # sigma = 1: about 16% of draws fall below median / e and 16% above median * e.
    below = sum(n < 150 / 2.718 for n in lengths) / len(lengths)
    above = sum(n > 150 * 2.718 for n in lengths) / len(lengths)
    assert 0.07 <= below <= 0.27
    assert 0.07 <= above <= 0.27


def test_reasoning_comes_first_and_is_billed(sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="mock-reason", messages=ask("[mock:tokens=10]"), stream=True,
        stream_options={"include_usage": True},
    )
    kinds, usage = [], None
    for chunk in stream:
        usage = chunk.usage or usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if getattr(delta, "reasoning", None):
            kinds.append("reasoning")
        elif delta.content:
            kinds.append("content")
    reasoning = kinds.count("reasoning")
    assert reasoning >= 1
    assert kinds == ["reasoning"] * reasoning + ["content"] * 10
    assert usage is not None
    assert usage.completion_tokens == reasoning + 10
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == reasoning


def test_reasoning_effort_and_fixed_reasoning_length() -> None:
    with MockServer(MockSettings(pace_ms=0, reasoning_tokens=25)) as server, openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="x", max_retries=0
    ) as client:
        completion = client.chat.completions.create(
            model="mock-small", messages=ask("[mock:tokens=4]"), reasoning_effort="low"
        )
    assert completion.usage is not None
    assert completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == 25
    assert completion.usage.completion_tokens == 29
    assert completion.choices[0].message.content is not None


def test_tool_call_non_stream(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(
        model="mock-small", messages=ask("What is the weather in Paris?"),
        tools=[WEATHER_TOOL],
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}


def test_tool_call_stream_and_tool_choice(sdk: openai.OpenAI) -> None:
    other: Any = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
    stream = sdk.chat.completions.create(
        model="mock-small", messages=ask("no cue word here [mock:tokens=20]"), stream=True,
        tools=[WEATHER_TOOL, other],
        tool_choice={"type": "function", "function": {"name": "lookup"}},
        stream_options={"include_usage": True},
    )
    name, arguments, finish, fragments, usage = None, "", None, 0, None
    for chunk in stream:
        usage = chunk.usage or usage
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for call in chunk.choices[0].delta.tool_calls or []:
            assert call.index == 0
            assert call.function is not None
            name = call.function.name or name
            if call.function.arguments:
                arguments += call.function.arguments
                fragments += 1
    assert name == "lookup"
    assert finish == "tool_calls"
    assert fragments == 20
    assert usage is not None
    assert usage.completion_tokens == 20
    assert isinstance(json.loads(arguments)["text"], str)


def test_no_tool_call_without_cue_or_with_tool_choice_none(sdk: openai.OpenAI) -> None:
    cases: list[tuple[str, Any]] = [("hello", "auto"), ("the weather?", "none")]
    for text, choice in cases:
        completion = sdk.chat.completions.create(
            model="mock-small", messages=ask(text), tools=[WEATHER_TOOL], tool_choice=choice
        )
        assert completion.choices[0].message.tool_calls is None
        assert completion.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (503, openai.InternalServerError),
        (429, openai.RateLimitError),
        (400, openai.BadRequestError),
    ],
)
def test_injected_status(
    sdk: openai.OpenAI, status: int, error: type[openai.APIStatusError]
) -> None:
    with pytest.raises(error) as caught:
        sdk.chat.completions.create(model="mock-small", messages=ask(f"[mock:status={status}]"))
    assert caught.value.status_code == status
    assert isinstance(caught.value.body, dict)
    assert "message" in caught.value.body


def test_die_after_cuts_the_stream(mock: MockServer, sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="mock-small", messages=ask("[mock:die_after=5] [mock:tokens=50]"), stream=True,
        user="dies",
    )
    chunks: list[openai.types.chat.ChatCompletionChunk] = []
    # The SDK turns the transport's "incomplete chunked read" into a connection error.
    with pytest.raises(openai.APIConnectionError):
        chunks.extend(stream)
    assert sum(1 for c in chunks if c.choices[0].delta.content) == 5
    assert all(c.choices[0].finish_reason is None for c in chunks)
    truth = mock.truth("dies")
    assert truth["completion_tokens"] == 5
    assert truth["aborted"] == 1
    assert truth["completed"] == 0


def test_ground_truth_equals_billed_usage_per_tenant(
    mock: MockServer, sdk: openai.OpenAI
) -> None:
    # Every shape of answer: plain, reasoning, tool call; each streamed and not.
    shapes: list[dict[str, Any]] = [
        {"model": "mock-small", "messages": ask("hello")},
        {"model": "mock-reason", "messages": ask("think")},
        {"model": "mock-small", "messages": ask("the weather?"), "tools": [WEATHER_TOOL]},
    ]
    prompt = completion = 0
    for shape in shapes:
        usage = sdk.chat.completions.create(**shape, user="acme").usage
        chunks = list(sdk.chat.completions.create(
            **shape, user="acme", stream=True, stream_options={"include_usage": True}
        ))
        for billed in (usage, chunks[-1].usage):
            assert billed is not None
            prompt += billed.prompt_tokens
            completion += billed.completion_tokens
    # metadata.tenant names the tenant when `user` is absent.
    other = sdk.chat.completions.create(
        model="mock-small", messages=ask("[mock:tokens=3]"), metadata={"tenant": "globex"}
    )
    assert other.usage is not None
    assert other.usage.completion_tokens == 3
    acme = mock.truth("acme")
    assert acme == {
        "requests": 6, "prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion, "completed": 6, "aborted": 0, "in_flight": 0,
        "errors": 0,
    }
    assert mock.truth("globex")["completion_tokens"] == 3


def test_client_disconnect_counts_only_what_was_sent(mock: MockServer) -> None:
    body = {"model": "mock-small", "user": "leaver", "stream": True,
            "messages": ask("[mock:pace_ms=5] [mock:tokens=1000]")}
    received = 0
    with mock.http.stream("POST", "/v1/chat/completions", json=body) as response:
        for chunk in sse_chunks(response):
            if isinstance(chunk, dict) and chunk["choices"][0]["delta"].get("content"):
                received += 1
            if received == 20:
                break
    truth = mock.truth("leaver")
    assert truth["in_flight"] == 0
    assert truth["aborted"] == 1
    assert truth["completed"] == 0
    assert received <= truth["completion_tokens"] <= received + 3


def test_reset_clears_ground_truth(mock: MockServer, sdk: openai.OpenAI) -> None:
    sdk.chat.completions.create(model="mock-small", messages=ask("[mock:tokens=2]"), user="r")
    assert mock.truth("r")["requests"] == 1
    assert mock.http.post("/mock/reset").json() == {"ok": True}
    assert mock.http.get("/mock/ground-truth").json() == {"tenants": {}}
    sdk.chat.completions.create(model="mock-small", messages=ask("[mock:tokens=2]"), user="r")
    assert mock.truth("r")["requests"] == 1


def test_bad_request_body_is_an_openai_error(mock: MockServer) -> None:
    response = mock.http.post("/v1/chat/completions", content=b"{not json")
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_pace_and_first_token_delay_are_lower_bounds_on_duration() -> None:
    # Lower bounds only: sleeps never end early, so this cannot flake on a slow machine.
    with MockServer(MockSettings(pace_ms=10, first_token_ms=100)) as server:
        body = {"model": "mock-small", "stream": True, "messages": ask("[mock:tokens=20]")}
        started = time.monotonic()
        with server.http.stream("POST", "/v1/chat/completions", json=body) as response:
            chunks = sse_chunks(response)
            next(chunks)
            first_chunk_s = time.monotonic() - started
            assert list(chunks)[-1] == "[DONE]"
        assert first_chunk_s >= 0.1
        assert time.monotonic() - started >= 0.1 + 19 * 0.01


def test_disconnect_before_the_first_token_counts_no_tokens() -> None:
    with MockServer(MockSettings(first_token_ms=300)) as server:
        body = {"model": "mock-small", "stream": True, "user": "early", "messages": ask("hi")}
        with server.http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200  # headers are out; the first token is not
        truth = server.truth("early")
    assert truth["in_flight"] == 0
    assert truth["aborted"] == 1
    assert truth["completion_tokens"] == 0
    assert truth["prompt_tokens"] > 0


def test_cli_arguments_build_settings() -> None:
    parser = argparse.ArgumentParser()
    add_mock_arguments(parser)
    ns = parser.parse_args(
        ["--port", "9009", "--pace-ms", "2", "--median", "80", "--sigma", "0.5", "--seed", "1",
         "--reasoning-tokens", "30"]
    )
    assert ns.port == 9009
    assert settings_from_args(ns) == MockSettings(
        pace_ms=2, median_tokens=80, sigma=0.5, seed=1, reasoning_tokens=30
    )
    assert settings_from_args(parser.parse_args([])) == MockSettings()
    with pytest.raises(ValueError, match="pace_ms"):
        MockSettings(pace_ms=-1)
