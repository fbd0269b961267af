"""The mock upstream, tested as the gateway will use it: a real uvicorn server on a free port,
with httpx and the official OpenAI SDK as clients."""

from __future__ import annotations

import argparse
import base64
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

from hardcap_core.local.mock_plan import (
    AUDIO_BYTES_PER_TOKEN,
    AUDIO_TOKENS_PER_WORD,
    BAD_UTF8,
    ERROR_OBJECT,
    JSON_ARRAY,
    MALFORMED_KINDS,
    NOT_JSON,
    NULL_CHOICE,
    USAGE_NOT_OBJECT,
    VOCABULARY,
    ChatRequest,
    estimate_prompt_tokens,
    make_plan,
)
from hardcap_core.local.mock_truth import GroundTruth
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
    # cl100k_base: each role 1 token, "x" * 10 and "y" * 6 2 each; 3 per message, 3 to prime.
    req = ChatRequest(model="mock-small", messages=messages)
    assert estimate_prompt_tokens(req) == 3 + (3 + 1 + 2) * 2 + (3 + 1)


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
    req = ChatRequest(model="mock-small", messages=ask("hello there"))
    assert completion.usage.prompt_tokens == estimate_prompt_tokens(req)
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
    # The timeline holds the same tokens, slot by slot, and its worst minute is all of them.
    line = mock.http.get("/mock/timeline", params={"tenant": "acme"}).json()
    assert sum(r[1] for r in line["rows"]) == prompt
    assert sum(r[2] for r in line["rows"]) == completion
    assert line["worst_60s"]["tokens"] == prompt + completion
    assert mock.http.get("/mock/timeline", params={"tenant": "nobody"}).json()["rows"] == []


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


def test_requests_with_an_id_are_recorded_one_by_one_until_reset(
    mock: MockServer, sdk: openai.OpenAI
) -> None:
    def tagged(bench_id: Any) -> dict[str, Any]:
        return {"user": "ids", "metadata": {"hardcap_bench_id": bench_id}}

    whole = sdk.chat.completions.create(
        model="mock-small", messages=ask("[mock:tokens=4] [mock:hidden=3]"), **tagged("whole")
    ).usage
    chunks = list(sdk.chat.completions.create(
        model="mock-small", messages=ask("[mock:tokens=5]"), stream=True,
        stream_options={"include_usage": True}, **tagged("streamed"),
    ))
    streamed = chunks[-1].usage
    raw_stream(mock, "[mock:tokens=9] [mock:die_after=2]", "ids", **tagged("cut"))
    sdk.chat.completions.create(model="mock-small", messages=ask("no id"), user="ids")
    sdk.chat.completions.create(model="mock-small", messages=ask("a number"), **tagged(7))
    assert whole is not None and streamed is not None
    assert whole.completion_tokens == 7  # the hidden reasoning is billed, and recorded
    assert mock.truth("ids")["in_flight"] == 0
    records = mock.http.get("/mock/requests").json()
    assert records == {
        "whole": {"tenant": "ids", "prompt_tokens": whole.prompt_tokens,
                  "completion_tokens": 7, "state": "finished"},
        "streamed": {"tenant": "ids", "prompt_tokens": streamed.prompt_tokens,
                     "completion_tokens": 5, "state": "finished"},
        "cut": {"tenant": "ids", "prompt_tokens": records["cut"]["prompt_tokens"],
                "completion_tokens": 2, "state": "aborted"},
    }
    assert records["cut"]["prompt_tokens"] > 0
    assert mock.http.post("/mock/reset").json() == {"ok": True}
    assert mock.http.get("/mock/requests").json() == {}
    # Memory is bounded: only the most recent records are kept.
    truth = GroundTruth(max_requests=2)
    for name in ("a", "b", "c"):
        truth.request(name, "t", 1)
    assert list(truth.requests_json()) == ["b", "c"]


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


# -- misbehaviours on command ----------------------------------------------------------------------


def raw_stream(mock: MockServer, text: str, tenant: str, **fields: Any) -> tuple[list[bytes], bool]:
    """The SSE blocks of a streamed reply as bytes (comments included), and whether the
    transfer ended cleanly (False: the connection was dropped mid-body)."""
    body = {"model": "mock-small", "messages": ask(text), "stream": True, "user": tenant, **fields}
    data, clean = b"", True
    with mock.http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        try:
            for piece in response.iter_raw():
                data += piece
        except httpx.RemoteProtocolError:
            clean = False
    return [block for block in data.split(b"\n\n") if block], clean


def payloads(blocks: list[bytes]) -> list[Any]:
    """Each data block decoded: a JSON value, "[DONE]", or the raw bytes if it is not JSON."""
    out: list[Any] = []
    for block in blocks:
        if block.startswith(b"data: "):
            data = block.removeprefix(b"data: ")
            if data == b"[DONE]":
                out.append("[DONE]")
                continue
            try:
                out.append(json.loads(data))
            except ValueError:
                out.append(data)
    return out


def deltas(decoded: list[Any]) -> list[dict[str, Any]]:
    return [
        c["choices"][0]["delta"]
        for c in decoded
        if isinstance(c, dict) and c.get("choices") and isinstance(c["choices"][0], dict)
    ]


def finishes(decoded: list[Any]) -> list[str]:
    return [
        c["choices"][0]["finish_reason"]
        for c in decoded
        if isinstance(c, dict) and c.get("choices") and isinstance(c["choices"][0], dict)
        and c["choices"][0]["finish_reason"]
    ]


def usage_of(decoded: list[Any]) -> Any:
    (usage,) = [c["usage"] for c in decoded if isinstance(c, dict) and c.get("usage")]
    return usage


def test_silent_phase_sends_only_keepalives_and_bills_its_hidden_reasoning(
    mock: MockServer,
) -> None:
    text = "[mock:silent_ms=600] [mock:keepalive_ms=50] [mock:hidden=40] [mock:tokens=5]"
    started = time.monotonic()
    blocks, clean = raw_stream(mock, text, "thinker", stream_options={"include_usage": True})
    assert clean
    assert time.monotonic() - started >= 0.6  # a lower bound: sleeps never end early
    first_data = next(i for i, b in enumerate(blocks) if b.startswith(b"data: "))
    # Only comments before the first chunk, at most one per keep-alive interval, none after.
    assert set(blocks[:first_data]) == {b": ping"}
    assert 1 <= first_data <= 600 // 50
    assert not any(b.startswith(b":") for b in blocks[first_data:])
    decoded = payloads(blocks)
    assert [d["content"] for d in deltas(decoded) if d.get("content")] != []
    assert not any("reasoning" in d for d in deltas(decoded))  # the thinking is never streamed
    usage = usage_of(decoded)
    assert usage["completion_tokens"] == 45
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 40
    assert mock.truth("thinker")["completion_tokens"] == 45


def test_silent_phase_without_keepalives_sends_nothing(mock: MockServer) -> None:
    blocks, _ = raw_stream(mock, "[mock:silent_ms=200] [mock:tokens=3]", "quiet")
    assert blocks[0].startswith(b"data: ")
    assert not any(b.startswith(b":") for b in blocks)
    assert mock.truth("quiet")["completion_tokens"] == 3


def test_hidden_reasoning_counts_against_max_tokens_first(sdk: openai.OpenAI) -> None:
    for stream in (False, True):
        kwargs: Any = {"stream_options": {"include_usage": True}} if stream else {}
        reply = sdk.chat.completions.create(
            model="mock-small", messages=ask("[mock:hidden=40] [mock:tokens=20]"),
            max_tokens=30, stream=stream, **kwargs,
        )
        if stream:
            chunks = list(reply)  # type: ignore[arg-type]
            usage = chunks[-1].usage
            content = [c for c in chunks if c.choices and c.choices[0].delta.content]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            assert content == []
        else:
            usage, finish = reply.usage, reply.choices[0].finish_reason  # type: ignore[union-attr]
        assert finish == "length"
        assert usage is not None and usage.completion_tokens == 30
        assert usage.completion_tokens_details is not None
        assert usage.completion_tokens_details.reasoning_tokens == 30


def test_a_client_that_leaves_during_the_silence_is_billed_the_share_thought_so_far(
    mock: MockServer,
) -> None:
    body = {"model": "mock-small", "stream": True, "user": "left-thinking",
            "messages": ask("[mock:silent_ms=3000] [mock:keepalive_ms=100] [mock:hidden=3000]")}
    with mock.http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert next(response.iter_lines()) == ": ping"  # about 100 ms of thinking
    truth = mock.truth("left-thinking")
    assert truth["aborted"] == 1 and truth["in_flight"] == 0
    # Billed what it thought until the client left (some), not the whole silence's worth.
    assert 0 < truth["completion_tokens"] < 3000


@pytest.mark.parametrize("stream", [False, True])
def test_ignore_cap_generates_past_max_tokens_and_bills_it(
    mock: MockServer, sdk: openai.OpenAI, stream: bool
) -> None:
    tenant = f"ignores-{stream}"
    reply: Any = sdk.chat.completions.create(
        model="mock-small", messages=ask("[mock:tokens=50] [mock:ignore_cap=1]"), max_tokens=7,
        stream=stream, user=tenant,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    )
    if stream:
        chunks = list(reply)
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 50
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        usage = chunks[-1].usage
    else:
        assert reply.choices[0].finish_reason == "stop"
        usage = reply.usage
    assert usage.completion_tokens == 50 == mock.truth(tenant)["completion_tokens"]


def test_die_after_drops_the_connection_without_finish_or_done(mock: MockServer) -> None:
    blocks, clean = raw_stream(mock, "[mock:die_after=4] [mock:tokens=20]", "dropped",
                               stream_options={"include_usage": True})
    decoded = payloads(blocks)
    assert not clean  # the transfer is left incomplete
    assert "[DONE]" not in decoded and finishes(decoded) == []
    assert not any(isinstance(c, dict) and c.get("usage") for c in decoded)
    assert len([d for d in deltas(decoded) if d.get("content")]) == 4
    truth = mock.truth("dropped")
    assert (truth["completion_tokens"], truth["aborted"], truth["completed"]) == (4, 1, 0)


def test_eof_after_ends_the_body_cleanly_without_finish_or_done(mock: MockServer) -> None:
    blocks, clean = raw_stream(mock, "[mock:eof_after=4] [mock:tokens=20]", "stopped",
                               stream_options={"include_usage": True})
    decoded = payloads(blocks)
    assert clean
    assert "[DONE]" not in decoded and finishes(decoded) == []
    assert not any(isinstance(c, dict) and c.get("usage") for c in decoded)
    assert len([d for d in deltas(decoded) if d.get("content")]) == 4
    truth = mock.truth("stopped")
    assert (truth["completion_tokens"], truth["aborted"], truth["completed"]) == (4, 1, 0)


def bad_payload(kind: int) -> Any:
    """How the bad event of ``kind`` decodes (see `payloads`)."""
    return {
        BAD_UTF8: lambda p: isinstance(p, bytes) and b'"\xff\xfe"' in p,
        NULL_CHOICE: lambda p: isinstance(p, dict) and p.get("choices") == [None],
        ERROR_OBJECT: lambda p: p == {"error": "boom"},
        USAGE_NOT_OBJECT: lambda p: isinstance(p, dict) and p.get("usage") == 5,
        NOT_JSON: lambda p: p == b"this is not json {",
        JSON_ARRAY: lambda p: (
            isinstance(p, list) and p[0]["choices"][0]["delta"] == {"content": " the"}
        ),
    }[kind]


@pytest.mark.parametrize("at", [0, 3])
@pytest.mark.parametrize("kind", sorted(MALFORMED_KINDS))
def test_malformed_event_goes_out_where_told_and_bills_what_it_carries(
    mock: MockServer, kind: int, at: int
) -> None:
    tenant = f"bad-{kind}-{at}"
    text = f"[mock:malformed={kind}] [mock:malformed_at={at}] [mock:tokens=6]"
    blocks, clean = raw_stream(mock, text, tenant, stream_options={"include_usage": True})
    assert clean
    decoded = payloads(blocks)
    is_bad = bad_payload(kind)
    where = next(i for i, p in enumerate(decoded) if is_bad(p))  # (usage 5 closes too)
    # Before step `at`: after the role chunk and `at` content chunks (first of all for 0).
    assert where == (0 if at == 0 else 1 + at)
    extra = 1 if kind in (BAD_UTF8, JSON_ARRAY) else 0
    truth = mock.truth(tenant)
    if kind == ERROR_OBJECT:
        # The provider failed there: it stops, billing what it generated, and ends the body.
        assert where == len(decoded) - 1
        assert truth["completion_tokens"] == at
        assert truth["aborted"] == 1
        return
    assert decoded[-1] == "[DONE]" and finishes(decoded) == ["stop"]
    assert len([d for d in deltas(decoded) if d.get("content")]) == 6
    assert truth["completion_tokens"] == 6 + extra
    if kind == USAGE_NOT_OBJECT:
        assert [c["usage"] for c in decoded if isinstance(c, dict) and "usage" in c][-1] == 5
    else:
        assert usage_of(decoded)["completion_tokens"] == 6 + extra


@pytest.mark.parametrize("kind", sorted(MALFORMED_KINDS))
def test_malformed_whole_reply_is_mangled_and_still_billed(mock: MockServer, kind: int) -> None:
    tenant = f"bad-reply-{kind}"
    body = {"model": "mock-small", "user": tenant,
            "messages": ask(f"[mock:malformed={kind}] [mock:tokens=6]")}
    response = mock.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    raw = response.content
    extra = 1 if kind in (BAD_UTF8, JSON_ARRAY) else 0
    assert mock.truth(tenant)["completion_tokens"] == 6 + extra
    if kind == BAD_UTF8:
        assert b'\xff\xfe"' in raw
        with pytest.raises(UnicodeDecodeError):
            raw.decode()
        return
    if kind == NOT_JSON:
        assert raw == b"this is not json {"
        return
    reply = json.loads(raw)
    expected = {
        NULL_CHOICE: lambda r: r["choices"] == [None] and r["usage"]["completion_tokens"] == 6,
        ERROR_OBJECT: lambda r: r == {"error": "boom"},
        USAGE_NOT_OBJECT: lambda r: r["usage"] == 5 and r["choices"][0]["message"]["content"],
        JSON_ARRAY: lambda r: isinstance(r, list) and r[0]["usage"]["completion_tokens"] == 7,
    }[kind]
    assert expected(reply)


def test_an_unknown_malformed_kind_is_a_400(mock: MockServer) -> None:
    body = {"model": "mock-small", "messages": ask("[mock:malformed=9]")}
    response = mock.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert "malformed" in response.json()["error"]["message"]


def test_function_call_streams_a_legacy_call(mock: MockServer, sdk: openai.OpenAI) -> None:
    lookup: Any = {"name": "find_city", "parameters": {"type": "object",
                                                     "properties": {"city": {}}}}
    stream = sdk.chat.completions.create(
        model="mock-small", messages=ask("[mock:function_call=1] [mock:tokens=12]"),
        functions=[lookup], stream=True, stream_options={"include_usage": True}, user="legacy",
    )
    name, arguments, fragments, finish, usage = None, "", 0, None, None
    for chunk in stream:
        usage = chunk.usage or usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert delta.content is None and delta.tool_calls is None
        finish = chunk.choices[0].finish_reason or finish
        if delta.function_call is not None:
            name = delta.function_call.name or name
            if delta.function_call.arguments:
                arguments += delta.function_call.arguments
                fragments += 1
    assert (name, finish, fragments) == ("find_city", "function_call", 12)
    assert set(json.loads(arguments)) == {"city"}
    assert usage is not None and usage.completion_tokens == 12
    assert mock.truth("legacy")["completion_tokens"] == 12
    reply = sdk.chat.completions.create(
        model="mock-small", messages=ask("[mock:function_call=1] [mock:tokens=12]"),
    )
    call = reply.choices[0].message.function_call
    assert call is not None and call.name == "lookup"  # no functions given
    assert reply.choices[0].finish_reason == "function_call"


def test_audio_streams_transcript_and_pcm_and_bills_both(mock: MockServer) -> None:
    blocks, clean = raw_stream(mock, "[mock:audio=1] [mock:tokens=10]", "speaker",
                               stream_options={"include_usage": True})
    assert clean
    decoded = payloads(blocks)
    audio = [d["audio"] for d in deltas(decoded) if "audio" in d]
    transcripts = [a["transcript"] for a in audio if "transcript" in a]
    data = [base64.b64decode(a["data"]) for a in audio if "data" in a]
    assert len(transcripts) == len(data) == 10
    assert {len(d) for d in data} == {AUDIO_TOKENS_PER_WORD * AUDIO_BYTES_PER_TOKEN}  # 400 ms
    assert audio[0]["id"].startswith("audio_") and "transcript" in audio[0]
    assert list(audio[-1]) == ["expires_at"]
    assert not any(d.get("content") for d in deltas(decoded))
    usage = usage_of(decoded)
    assert usage["completion_tokens"] == 10 * (1 + AUDIO_TOKENS_PER_WORD)
    assert usage["completion_tokens_details"]["audio_tokens"] == 80
    assert usage["completion_tokens_details"]["text_tokens"] == 10
    assert mock.truth("speaker")["completion_tokens"] == 90


def test_audio_is_capped_by_its_billed_tokens_and_whole_replies_carry_it(
    sdk: openai.OpenAI,
) -> None:
    reply = sdk.chat.completions.create(
        model="mock-small", messages=ask("[mock:audio=1] [mock:tokens=10]"), max_tokens=40,
    )
    audio = reply.choices[0].message.audio
    assert audio is not None and audio.transcript
    assert len(base64.b64decode(audio.data)) == 4 * AUDIO_TOKENS_PER_WORD * AUDIO_BYTES_PER_TOKEN
    assert reply.choices[0].finish_reason == "length"  # 4 words of 9 tokens fit in 40
    assert reply.usage is not None and reply.usage.completion_tokens == 36
