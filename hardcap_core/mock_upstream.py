"""A fake OpenAI-compatible LLM server that records the ground truth of what it generated.

Tests and benchmarks point the gateway at it. It answers `POST /v1/chat/completions` (streamed
or not, with reasoning and tool calls) with log-normal output lengths drawn from a seeded
`random.Random`, and counts per tenant every token it actually handed to the server for
sending, so a test can compare the gateway's ledger with what really left the "model".

Tenant: the request's `user`, else `metadata.tenant`, else "anonymous".

Test directives in the last user message: `[mock:status=503]` answers with that status,
`[mock:die_after=N]` cuts a stream after N tokens (no finish chunk, no [DONE]),
`[mock:tokens=N]` forces N output tokens (max_tokens still caps), `[mock:pace_ms=X]` overrides
the pace. Randomness is drawn when a request arrives, so a seeded run is reproducible as long
as requests arrive in the same order.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from hardcap_core.mock_text import (
    argument_tokens,
    directives,
    draw_length,
    draw_words,
    estimate_prompt_tokens,
    mentions_weather,
    text_of,
)

MODELS = ("mock-small", "mock-large", "mock-reason")
FinishReason = Literal["stop", "length", "tool_calls"]


@dataclasses.dataclass(frozen=True)
class MockSettings:
    """How the mock generates: pace, length distribution, seed, reasoning, time to first token."""

    pace_ms: float = 5.0
    median_tokens: int = 150
    sigma: float = 1.0
    seed: int | None = None
    reasoning_tokens: int = 0
    first_token_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.pace_ms < 0 or self.first_token_ms < 0:
            raise ValueError("pace_ms and first_token_ms must be >= 0")
        if self.median_tokens < 1 or self.sigma < 0 or self.reasoning_tokens < 0:
            raise ValueError("median_tokens must be >= 1, sigma and reasoning_tokens >= 0")


@dataclasses.dataclass
class TenantTruth:
    """What the mock really did for one tenant. Counters only ever grow (until a reset)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    completed: int = 0
    aborted: int = 0
    in_flight: int = 0
    errors: int = 0

    def as_json(self) -> dict[str, int]:
        """The counters plus `total_tokens`."""
        counters = dataclasses.asdict(self)
        counters["total_tokens"] = self.prompt_tokens + self.completion_tokens
        return counters


class GroundTruth:
    """Per-tenant counters, mutated only from the server's event loop (so no lock).

    A request holds on to its tenant's `TenantTruth`; after `reset()` requests still in flight
    update the discarded object, so they never leak into (or drive negative) the new counters.
    """

    def __init__(self) -> None:
        self._tenants: dict[str, TenantTruth] = {}

    def tenant(self, name: str) -> TenantTruth:
        """The live counters of `name`, created on first use."""
        return self._tenants.setdefault(name, TenantTruth())

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self._tenants = {}

    def as_json(self) -> dict[str, Any]:
        """The `GET /mock/ground-truth` body."""
        return {"tenants": {name: t.as_json() for name, t in self._tenants.items()}}


class _StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    """The fields of a Chat Completions request the mock looks at; others are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stream_options: _StreamOptions | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    reasoning_effort: str | None = None


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything one response will contain, drawn up front when the request arrives."""

    reasoning: list[str]
    content: list[str]
    tool_name: str | None
    finish_reason: FinishReason
    pace_ms: float
    die_after: int | None

    @property
    def completion_tokens(self) -> int:
        return len(self.reasoning) + len(self.content)


class _MockAbort(Exception):
    """Raised inside a stream's generator to cut the connection (`[mock:die_after=N]`)."""


@dataclasses.dataclass
class _Account:
    """One request's entry in the ground truth; `close` counts it as completed or aborted once."""

    truth: TenantTruth
    closed: bool = False

    def add_tokens(self, count: int) -> None:
        self.truth.completion_tokens += count

    def close(self, finished: bool) -> None:
        if self.closed:
            return
        self.closed = True
        self.truth.in_flight -= 1
        if finished:
            self.truth.completed += 1
        else:
            self.truth.aborted += 1


class _CuttableStreamingResponse(StreamingResponse):
    """A StreamingResponse that can end without its final body message, like a crashed host.

    It also closes the body generator itself: if a disconnect cancels the response while the
    generator is parked at a `yield`, Starlette leaves it to the garbage collector, and the
    ground truth would become final only at some later time. If the disconnect comes before
    the generator ever ran, its `finally` never runs, so the account is closed here too.
    """

    def __init__(self, content: AsyncGenerator[str, None], account: _Account) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._generator = content
        self._account = account

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except _MockAbort:
            # Returning with the response incomplete makes uvicorn drop the connection (it logs
            # one line), so the client sees a body cut mid-stream with no [DONE].
            pass
        finally:
            await self._generator.aclose()
            self._account.close(finished=False)


def _error(status: int, message: str) -> JSONResponse:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            429: "rate_limit_error"}.get(status, "server_error" if status >= 500 else "api_error")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": None}},
        status_code=status,
    )


def _tenant_of(req: ChatRequest) -> str:
    if req.user:
        return req.user
    tenant = (req.metadata or {}).get("tenant")
    return tenant if isinstance(tenant, str) and tenant else "anonymous"


def _last_user_text(req: ChatRequest) -> str:
    for message in reversed(req.messages):
        if message.get("role") == "user":
            return text_of(message.get("content"))
    return ""


def _tool_to_call(req: ChatRequest, last_user: str) -> dict[str, Any] | None:
    """The function definition the mock will call, or None for a plain text answer."""
    functions = [t["function"] for t in req.tools or [] if isinstance(t.get("function"), dict)]
    choice = req.tool_choice
    if not functions or choice == "none":
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        named = [f for f in functions if f.get("name") == name]
        return named[0] if named else {"name": str(name)}
    if choice == "required" or mentions_weather(last_user):
        return functions[0]
    return None


def _plan(req: ChatRequest, settings: MockSettings, rng: random.Random, knobs: dict[str, float]) -> _Plan:
    reasoning: list[str] = []
    if "reason" in req.model or req.reasoning_effort is not None:
        count = settings.reasoning_tokens or draw_length(rng, settings.median_tokens, settings.sigma)
        reasoning = draw_words(rng, count)
    forced = knobs.get("tokens")
    drawn = int(forced) if forced is not None else draw_length(
        rng, settings.median_tokens, settings.sigma
    )
    tool = _tool_to_call(req, _last_user_text(req))
    if tool is None:
        content, natural_end = draw_words(rng, drawn), "stop"
    else:
        properties = (tool.get("parameters") or {}).get("properties") or {}
        field = next(iter(properties), "text")
        content, natural_end = argument_tokens(rng, drawn, str(field)), "tool_calls"
        if forced is not None:
            content = content[: int(forced)]
    # Like real providers, the cap covers reasoning and output together.
    cap = req.max_completion_tokens or req.max_tokens
    finish: FinishReason = natural_end  # type: ignore[assignment]
    if cap is not None and len(reasoning) + len(content) > cap:
        finish = "length"
        reasoning = reasoning[:cap]
        content = content[: cap - len(reasoning)]
    die_after = knobs.get("die_after")
    return _Plan(
        reasoning=reasoning,
        content=content,
        tool_name=None if tool is None else str(tool.get("name", "")),
        finish_reason=finish,
        pace_ms=knobs.get("pace_ms", settings.pace_ms),
        die_after=None if die_after is None else int(die_after),
    )


def _usage(prompt_tokens: int, plan: _Plan) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": plan.completion_tokens,
        "total_tokens": prompt_tokens + plan.completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": len(plan.reasoning)},
    }


async def _stream(
    req: ChatRequest, plan: _Plan, prompt_tokens: int, truth: TenantTruth,
    settings: MockSettings,
) -> AsyncIterator[str]:
    """SSE events, one token per chunk; counts each token into `truth` as it is yielded."""
    chunk_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    include_usage = req.stream_options is not None and req.stream_options.include_usage

    def event(delta: dict[str, Any], finish: str | None = None) -> str:
        chunk: dict[str, Any] = {
            "id": chunk_id, "object": "chat.completion.chunk", "created": created,
            "model": req.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            chunk["usage"] = None
        return f"data: {json.dumps(chunk)}\n\n"

    tokens: list[dict[str, Any]] = [{"reasoning": t} for t in plan.reasoning]
    if plan.tool_name is None:
        tokens += [{"content": t} for t in plan.content]
    else:
        tokens += [{"tool_calls": [{"index": 0, "function": {"arguments": t}}]}
                   for t in plan.content]
    started = time.monotonic() + settings.first_token_ms / 1000
    finished = False
    try:
        await asyncio.sleep(settings.first_token_ms / 1000)
        yield event({"role": "assistant", "content": None if plan.tool_name else ""})
        for i, delta in enumerate(tokens):
            if i == plan.die_after:
                raise _MockAbort
            if i == len(plan.reasoning) and plan.tool_name is not None:
                yield event({"tool_calls": [{
                    "index": 0, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                    "function": {"name": plan.tool_name, "arguments": ""},
                }]})
            # Sleep to an absolute schedule so per-sleep overhead does not slow the pace; a
            # zero sleep still yields to the loop, where Starlette notices a disconnect.
            await asyncio.sleep(max(0.0, started + i * plan.pace_ms / 1000 - time.monotonic()))
            truth.completion_tokens += 1
            yield event(delta)
        if plan.die_after is not None and plan.die_after >= len(tokens):
            raise _MockAbort
        yield event({}, plan.finish_reason)
        if include_usage:
            usage = {"id": chunk_id, "object": "chat.completion.chunk", "created": created,
                     "model": req.model, "choices": [], "usage": _usage(prompt_tokens, plan)}
            yield f"data: {json.dumps(usage)}\n\n"
        yield "data: [DONE]\n\n"
        finished = True
    finally:
        # Runs on normal end, on _MockAbort, and on cancellation or GeneratorExit when the client
        # goes away, so by the time in_flight drops the counts are final.
        truth.in_flight -= 1
        if finished:
            truth.completed += 1
        else:
            truth.aborted += 1


async def _complete(
    req: ChatRequest, plan: _Plan, prompt_tokens: int, truth: TenantTruth,
    settings: MockSettings,
) -> Response:
    finished = False
    try:
        # A real model takes as long to answer without streaming as with it.
        await asyncio.sleep((settings.first_token_ms + plan.completion_tokens * plan.pace_ms) / 1000)
        truth.completion_tokens += plan.completion_tokens
        finished = True
    finally:
        truth.in_flight -= 1
        if finished:
            truth.completed += 1
        else:
            truth.aborted += 1
    message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
    if plan.reasoning:
        message["reasoning"] = "".join(plan.reasoning)
    if plan.tool_name is None:
        message["content"] = "".join(plan.content)
    else:
        message["tool_calls"] = [{
            "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": plan.tool_name, "arguments": "".join(plan.content)},
        }]
    return JSONResponse({
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
        "created": int(time.time()), "model": req.model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": plan.finish_reason}],
        "usage": _usage(prompt_tokens, plan),
    })


def create_mock_app(settings: MockSettings) -> Starlette:
    """The mock upstream as an ASGI app. Its `GroundTruth` is at `app.state.ground_truth`."""
    truth = GroundTruth()
    rng = random.Random(settings.seed)

    async def chat_completions(request: Request) -> Response:
        try:
            req = ChatRequest.model_validate(await request.json())
        except (ValueError, ValidationError) as exc:
            return _error(400, f"invalid request body: {exc}")
        if not req.messages:
            return _error(400, "messages must not be empty")
        if any(cap is not None and cap < 1 for cap in (req.max_tokens, req.max_completion_tokens)):
            return _error(400, "max_tokens must be at least 1")
        tenant = truth.tenant(_tenant_of(req))
        tenant.requests += 1
        knobs = directives(_last_user_text(req))
        status = int(knobs.get("status", 200))
        if status >= 400:
            tenant.errors += 1
            return _error(status, f"injected error {status} ([mock:status={status}])")
        plan = _plan(req, settings, rng, knobs)
        prompt_tokens = estimate_prompt_tokens(req.messages)
        tenant.prompt_tokens += prompt_tokens
        tenant.in_flight += 1
        if req.stream:
            return _CuttableStreamingResponse(_stream(req, plan, prompt_tokens, tenant, settings))
        return await _complete(req, plan, prompt_tokens, tenant, settings)

    async def ground_truth(_: Request) -> Response:
        return JSONResponse(truth.as_json())

    async def reset(_: Request) -> Response:
        truth.reset()
        return JSONResponse({"ok": True})

    async def models(_: Request) -> Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "hardcap-mock"}
                for m in MODELS]
        return JSONResponse({"object": "list", "data": data})

    async def healthz(_: Request) -> Response:
        return JSONResponse({"ok": True})

    app = Starlette(routes=[
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/mock/ground-truth", ground_truth, methods=["GET"]),
        Route("/mock/reset", reset, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
    ])
    app.state.ground_truth = truth
    return app


def run_mock(host: str = "127.0.0.1", port: int = 9001, settings: MockSettings | None = None) -> None:
    """Serve the mock under uvicorn until interrupted."""
    import uvicorn  # only the CLI path needs the server

    settings = settings or MockSettings()
    print(f"mock upstream on http://{host}:{port}/v1 ({settings})", flush=True)
    uvicorn.run(create_mock_app(settings), host=host, port=port, log_level="warning")


def add_mock_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `hardcap mock` options (host, port and every `MockSettings` field)."""
    defaults = MockSettings()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9001)
    parser.add_argument("--pace-ms", type=float, default=defaults.pace_ms,
                        help="delay between streamed tokens (0: as fast as possible)")
    parser.add_argument("--median", type=int, default=defaults.median_tokens,
                        help="median output length in tokens (log-normal)")
    parser.add_argument("--sigma", type=float, default=defaults.sigma,
                        help="log-normal sigma of the output length")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--reasoning-tokens", type=int, default=defaults.reasoning_tokens,
                        help="reasoning-phase length for reasoning models (0: log-normal)")
    parser.add_argument("--first-token-ms", type=float, default=defaults.first_token_ms)


def settings_from_args(ns: argparse.Namespace) -> MockSettings:
    """The `MockSettings` given by options added with `add_mock_arguments`."""
    return MockSettings(
        pace_ms=ns.pace_ms, median_tokens=ns.median, sigma=ns.sigma, seed=ns.seed,
        reasoning_tokens=ns.reasoning_tokens, first_token_ms=ns.first_token_ms,
    )
