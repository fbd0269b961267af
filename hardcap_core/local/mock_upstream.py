"""A fake OpenAI-compatible LLM server that records the ground truth of what it generated.

Tests and benchmarks point the gateway at it. It answers `POST /v1/chat/completions` (streamed
or not, with reasoning and tool calls) with log-normal output lengths drawn from a seeded
`random.Random`, and counts per tenant every token it actually handed to the server for
sending, so a test can compare the gateway's ledger with what really left the "model".

Tenant: the request's `user`, else `metadata.tenant`, else "anonymous".

Test directives in the last user message: `[mock:status=503]` answers with that status;
`[mock:die_after=N]` cuts a stream after N tokens, or at its end if shorter (no finish chunk,
no [DONE]; ignored without streaming); `[mock:tokens=N]` forces N output tokens (max_tokens
still caps); `[mock:pace_ms=X]` overrides the pace; `[mock:gzip=1]` gzips the stream even when
the client asked for no content encoding, as a misconfigured provider or proxy would.

Randomness is drawn when a request arrives, so a seeded run is reproducible as long as requests
arrive in the same order.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import time
import uuid
import zlib
from collections.abc import AsyncGenerator
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from hardcap_core.local.mock_plan import ChatRequest, Plan, make_plan
from hardcap_core.local.mock_truth import Account, GroundTruth

MODELS = ("mock-small", "mock-large", "mock-reason")


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


class _MockAbort(Exception):
    """Raised inside a stream's generator to cut the connection (`[mock:die_after=N]`)."""


class _CuttableStreamingResponse(StreamingResponse):
    """A StreamingResponse that can end without its final body message, like a crashed host.

    It also closes the body generator itself: if a disconnect cancels the response while the
    generator is parked at a `yield`, Starlette leaves it to the garbage collector, and the
    ground truth would become final only at some later time. If the disconnect comes before
    the generator ever ran, its `finally` never runs, so the account is closed here too.
    """

    def __init__(
        self,
        content: AsyncGenerator[str, None] | AsyncGenerator[bytes, None],
        account: Account,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
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


async def _gzipped(events: AsyncGenerator[str, None]) -> AsyncGenerator[bytes, None]:
    """The stream gzip-compressed, flushed after every event so it still streams."""
    packer = zlib.compressobj(wbits=31)  # 31: the gzip container
    try:
        async for event in events:
            yield packer.compress(event.encode()) + packer.flush(zlib.Z_SYNC_FLUSH)
        yield packer.flush()
    finally:
        await events.aclose()


def _error(status: int, message: str) -> JSONResponse:
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        429: "rate_limit_error",
    }.get(status, "server_error" if status >= 500 else "api_error")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": None}},
        status_code=status,
    )


def _usage(plan: Plan) -> dict[str, Any]:
    return {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": plan.completion_tokens,
        "total_tokens": plan.prompt_tokens + plan.completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": len(plan.reasoning)},
    }


async def _stream(
    req: ChatRequest, plan: Plan, account: Account, first_token_ms: float
) -> AsyncGenerator[str, None]:
    """SSE events, one token per chunk; counts each token into `account` as it is yielded."""
    chunk_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    include_usage = req.stream_options is not None and req.stream_options.include_usage

    def event(delta: dict[str, Any], finish: str | None = None) -> str:
        chunk: dict[str, Any] = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": created,
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
        tokens += [
            {"tool_calls": [{"index": 0, "function": {"arguments": t}}]} for t in plan.content
        ]
    started = time.monotonic() + first_token_ms / 1000
    finished = False
    try:
        await asyncio.sleep(first_token_ms / 1000)
        yield event({"role": "assistant", "content": None if plan.tool_name else ""})
        for i, delta in enumerate(tokens):
            if i == plan.die_after:
                raise _MockAbort
            if i == len(plan.reasoning) and plan.tool_name is not None:
                yield event(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": f"call_{uuid.uuid4().hex[:24]}",
                                "type": "function",
                                "function": {"name": plan.tool_name, "arguments": ""},
                            }
                        ]
                    }
                )
            # Sleep to an absolute schedule so per-sleep overhead does not slow the pace; a
            # zero sleep still yields to the loop, where Starlette notices a disconnect.
            await asyncio.sleep(max(0.0, started + i * plan.pace_ms / 1000 - time.monotonic()))
            account.add_tokens(1)
            yield event(delta)
        if plan.die_after is not None and plan.die_after >= len(tokens):
            raise _MockAbort
        yield event({}, plan.finish_reason)
        if include_usage:
            usage = {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": req.model,
                "choices": [],
                "usage": _usage(plan),
            }
            yield f"data: {json.dumps(usage)}\n\n"
        yield "data: [DONE]\n\n"
        finished = True
    finally:
        # Runs on normal end, on _MockAbort, and on cancellation or GeneratorExit when the client
        # goes away: no token is counted after this, so once in_flight drops the counts are final.
        account.close(finished)


async def _complete(
    req: ChatRequest, plan: Plan, account: Account, first_token_ms: float
) -> Response:
    finished = False
    try:
        # A real model takes as long to answer without streaming as with it.
        await asyncio.sleep((first_token_ms + plan.completion_tokens * plan.pace_ms) / 1000)
        account.add_tokens(plan.completion_tokens)
        finished = True
    finally:
        account.close(finished)
    message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
    if plan.reasoning:
        message["reasoning"] = "".join(plan.reasoning)
    if plan.tool_name is None:
        message["content"] = "".join(plan.content)
    else:
        message["tool_calls"] = [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": plan.tool_name, "arguments": "".join(plan.content)},
            }
        ]
    return JSONResponse(
        {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": plan.finish_reason,
                }
            ],
            "usage": _usage(plan),
        }
    )


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
        plan = make_plan(
            req,
            rng,
            median_tokens=settings.median_tokens,
            sigma=settings.sigma,
            reasoning_tokens=settings.reasoning_tokens,
            pace_ms=settings.pace_ms,
        )
        tenant = truth.tenant(req.tenant())
        tenant.requests += 1
        if plan.status >= 400:
            # Providers do not bill a failed request, so only `errors` records it.
            tenant.errors += 1
            return _error(plan.status, f"injected error ([mock:status={plan.status}])")
        tenant.prompt_tokens += plan.prompt_tokens
        tenant.in_flight += 1
        account = Account(tenant)
        if req.stream:
            body = _stream(req, plan, account, settings.first_token_ms)
            if plan.gzip:
                encoding = {"content-encoding": "gzip"}
                return _CuttableStreamingResponse(_gzipped(body), account, encoding)
            return _CuttableStreamingResponse(body, account)
        return await _complete(req, plan, account, settings.first_token_ms)

    async def ground_truth(_: Request) -> Response:
        return JSONResponse(truth.as_json())

    async def reset(_: Request) -> Response:
        truth.reset()
        return JSONResponse({"ok": True})

    async def models(_: Request) -> Response:
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "hardcap-mock"} for m in MODELS
        ]
        return JSONResponse({"object": "list", "data": data})

    async def healthz(_: Request) -> Response:
        return JSONResponse({"ok": True})

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/mock/ground-truth", ground_truth, methods=["GET"]),
            Route("/mock/reset", reset, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )
    app.state.ground_truth = truth
    return app


def run_mock(
    host: str = "127.0.0.1", port: int = 9001, settings: MockSettings | None = None
) -> None:
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
    parser.add_argument(
        "--pace-ms",
        type=float,
        default=defaults.pace_ms,
        help="delay between streamed tokens (0: as fast as possible)",
    )
    parser.add_argument(
        "--median",
        type=int,
        default=defaults.median_tokens,
        help="median output length in tokens (log-normal)",
    )
    parser.add_argument(
        "--sigma", type=float, default=defaults.sigma, help="log-normal sigma of the output length"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--reasoning-tokens",
        type=int,
        default=defaults.reasoning_tokens,
        help="reasoning-phase length for reasoning models (0: log-normal)",
    )
    parser.add_argument("--first-token-ms", type=float, default=defaults.first_token_ms)


def settings_from_args(ns: argparse.Namespace) -> MockSettings:
    """The `MockSettings` given by options added with `add_mock_arguments`."""
    return MockSettings(
        pace_ms=ns.pace_ms,
        median_tokens=ns.median,
        sigma=ns.sigma,
        seed=ns.seed,
        reasoning_tokens=ns.reasoning_tokens,
        first_token_ms=ns.first_token_ms,
    )
