"""A fake OpenAI-compatible LLM server that records the ground truth of what it generated.

It speaks Anthropic's Messages API too, at `POST /v1/messages` (`mock_anthropic`), with the
same ground truth, directives and faults, and answers `POST /v1/embeddings` (`mock_embeddings`).

Tests and benchmarks point the gateway at it. It answers `POST /v1/chat/completions` (streamed
or not, with reasoning and tool calls) with log-normal output lengths drawn from a seeded
`random.Random`, and counts per tenant every token it actually handed to the server for
sending, so a test can compare the gateway's ledger with what really left the "model".

Tenant: the request's `user`, else `metadata.tenant`, else "anonymous".

A request whose `metadata.hardcap_bench_id` is a string also gets its own record, shown by
`GET /mock/requests` (id -> tenant, prompt and completion tokens billed, state "in_flight",
"finished" or "aborted"), so a benchmark can join each of its streams with what the mock really
generated for it. The most recent `mock_truth.MAX_REQUEST_RECORDS` are kept; `POST /mock/reset`
clears them with the counters. Injected error statuses bill nothing and get no record.
`GET /mock/traceparents`: the W3C `traceparent` headers of the most recent chat-completions requests
(the last :data:`MAX_TRACEPARENTS`, oldest first; none for a request without one), as a
provider's own tracing would see the gateway's trace context; `/mock/reset` clears them.
`GET /mock/timeline?tenant=X`: that tenant's tokens per 100 ms slot (prompt tokens when a request
is received, completion tokens as generated) and the worst 60 s window over them
(`mock_truth.worst_window`); the most recent hour is kept.

Test directives in the last user message, `[mock:name=value]`, each value a number:

- `status=N`: answer with that error status (not billed). `retry_after=S`: with a
  `Retry-After: S` header (alone: a 429). `hang=1`: never answer; wait until the client gives
  up (nothing billed). The same for a while for every request: `POST /mock/fault`
  (`mock_faults`: a status, hang or disconnect for N seconds; `{}` or `/mock/reset` clears).
- `tokens=N`: N output pieces (max_tokens still caps); `pace_ms=X`: X ms between steps.
- `die_after=N`: drop the connection after N steps (reasoning tokens and output pieces), or at
  the end if shorter: no finish chunk, no [DONE], the transfer is left incomplete.
  `eof_after=N`: the same, but the body ends cleanly (a provider that just stops).
- `gzip=1`: gzip the stream even though the client asked for no content encoding, as a
  misconfigured provider or proxy would.
- `silent_ms=X`: before the first chunk nothing is sent for X ms (the headers are out): a
  reasoning model thinking. `hidden=N`: it thinks N reasoning tokens meanwhile, never
  streamed but billed (generated evenly over the silence; its length defaults to N times the
  pace) and reported in `usage.completion_tokens_details.reasoning_tokens`; they count
  against max_tokens first. `keepalive_ms=Y`: an SSE comment `: ping` every Y ms of it.
- `ignore_cap=1`: generate the drawn or forced length whatever max_tokens says (streamed and
  not), finish reason "stop".
- `malformed=K`: one bad event before step `malformed_at=N` (default 1; 0: the stream's first
  event, before the role chunk; past the end: before the finish chunk). K, from
  `mock_plan.MALFORMED_KINDS`: 1 a content token whose chunk holds invalid UTF-8 bytes (billed),
  2 `choices: [null]`, 3 `{"error": "boom"}` (the provider stops there and ends the body: no
  finish, usage or [DONE]), 4 `usage: 5` (and 5 in the closing usage chunk), 5 data that is not
  JSON, 6 a JSON array holding a chunk with one content token (billed). A whole reply is
  mangled the same way (1: bad bytes in the content, 2: `choices: [null]`, 3: the body is
  `{"error": "boom"}`, 4: `usage: 5`, 5: a body that is not JSON, 6: the reply in an array),
  with status 200 and every token billed.
- `lie=K`: the usage report lies, what is generated and billed stays the truth (K, from
  `mock_plan.LIES`): 1 `completion_tokens` 9,007,199,254,740,993, 2 -1,000,000,000,
  3 2^63-1; 4 `prompt_tokens` 9,007,199,254,740,993, 5 -1,000,000,000 (Anthropic mode:
  `output_tokens` and `input_tokens`, in message_start and message_delta alike).
- `redirect=N` (301, 302, 303, 307, 308): a redirect instead of an answer, nothing generated
  or billed: a 302 (and 301, 303) whose body is a whole completion, a 307 (308) with none.
- `set_cookie=1`: the reply sets a cookie (`mock_session=<tenant>`). `GET /mock/cookies`: the
  Cookie header of each chat request received (null: none), oldest first.
- `thinking=N`: N reasoning tokens first, whatever the model (Anthropic mode: thinking
  blocks). `tool_use=1`: a tool call of the first tool (else one named "lookup") even with
  no cue in the prompt.
- `cache_read=N` / `cache_write=N`: that many of the prompt's tokens (at most all of them)
  are reported read from (OpenAI: `prompt_tokens_details.cached_tokens`) or written to the
  provider's prompt cache (Anthropic mode only: OpenAI reports no writes).
- `function_call=1`: the answer is a legacy `function_call` (name, then argument fragments;
  the first of `functions` or `tools`, else "lookup"), finish reason "function_call".
- `audio=1`: the answer is spoken: each of the N words streams as a `delta.audio.transcript`
  chunk (1 text token) then a `delta.audio.data` chunk of 19,200 bytes of 24 kHz 16-bit PCM
  (8 audio tokens at OpenAI's 1 token per 50 ms); the id comes with the first transcript,
  `expires_at` last. Usage reports `audio_tokens` and `text_tokens`; max_tokens caps the sum.

The ground truth counts every billed token when it is handed to the server: reasoning (hidden
too), output, audio, a billed bad event, and tokens past max_tokens under `ignore_cap`.

A request that names a `service_tier` is answered with the tier it was served at, beside the
usage as OpenAI reports it (every chunk, the whole reply): the one named, "default" for
"auto" (`mock_replies.served_tier`).

Randomness is drawn when a request arrives, so a seeded run is reproducible as long as requests
arrive in the same order.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import zlib
from collections import deque
from collections.abc import AsyncGenerator

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hardcap_core.local.mock_anthropic import anthropic_routes
from hardcap_core.local.mock_cache import PromptCache
from hardcap_core.local.mock_embeddings import embeddings_routes
from hardcap_core.local.mock_faults import Faults, apply_fault, hang, parse_fault, retry_headers
from hardcap_core.local.mock_plan import ChatRequest, Plan, make_plan
from hardcap_core.local.mock_replies import (
    CuttableStreamingResponse,
    dropped,
    reply_body,
    stream_events,
)
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


async def _gzipped(events: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """The stream gzip-compressed, flushed after every event so it still streams."""
    packer = zlib.compressobj(wbits=31)  # 31: the gzip container
    try:
        async for event in events:
            yield packer.compress(event) + packer.flush(zlib.Z_SYNC_FLUSH)
        yield packer.flush()
    finally:
        await events.aclose()


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        429: "rate_limit_error",
    }.get(status, "server_error" if status >= 500 else "api_error")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": None}},
        status_code=status,
        headers=headers,
    )


async def _complete(
    req: ChatRequest, plan: Plan, account: Account, first_token_ms: float
) -> Response:
    finished = False
    try:
        # A real model takes as long to answer without streaming as with it.
        steps = len(plan.reasoning) + len(plan.content)
        await asyncio.sleep((first_token_ms + plan.silent_ms + steps * plan.pace_ms) / 1000)
        if not plan.drop:
            account.add_tokens(plan.completion_tokens)
            finished = True
    finally:
        if not plan.drop:
            account.close(finished)
    body = reply_body(req, plan)
    if plan.drop:
        return CuttableStreamingResponse(dropped(body, account), account, None, "application/json")
    return Response(body, media_type="application/json")


def _redirect(req: ChatRequest, plan: Plan) -> Response:
    """A redirect instead of an answer (`[mock:redirect=N]`), nothing generated or billed: a
    302 (or any but 307 and 308) whose body is a whole completion, which a client that reads a
    3xx as a reply takes for one; a 307 or 308 with no body."""
    headers = {"location": "/v1/elsewhere/chat/completions"}
    status = plan.redirect or 302
    if status in (307, 308):
        return Response(b"", status_code=status, headers=headers)
    body = reply_body(req, plan)
    return Response(body, status_code=status, headers=headers, media_type="application/json")


MAX_TRACEPARENTS = 100  # the traceparent headers kept (GET /mock/traceparents)


def create_mock_app(settings: MockSettings) -> Starlette:
    """The mock upstream as an ASGI app. Its `GroundTruth` is at `app.state.ground_truth`."""
    truth = GroundTruth()
    # The Cookie header of each chat request, in order (None: none), for `GET /mock/cookies`.
    cookies: deque[str | None] = deque(maxlen=1000)
    faults = Faults()
    prompt_cache = PromptCache()
    traceparents: deque[str] = deque(maxlen=MAX_TRACEPARENTS)
    rng = random.Random(settings.seed)

    def planner(req: ChatRequest) -> Plan:
        return make_plan(
            req,
            rng,
            median_tokens=settings.median_tokens,
            sigma=settings.sigma,
            reasoning_tokens=settings.reasoning_tokens,
            pace_ms=settings.pace_ms,
        )

    async def chat_completions(request: Request) -> Response:
        if traceparent := request.headers.get("traceparent"):
            traceparents.append(traceparent)
        try:
            req = ChatRequest.model_validate(await request.json())
        except (ValueError, ValidationError) as exc:
            return _error(400, f"invalid request body: {exc}")
        if not req.messages:
            return _error(400, "messages must not be empty")
        if any(cap is not None and cap < 1 for cap in (req.max_tokens, req.max_completion_tokens)):
            return _error(400, "max_tokens must be at least 1")
        try:
            plan = planner(req)
        except ValueError as exc:
            return _error(400, str(exc))
        plan = apply_fault(plan, faults.active())
        cookies.append(request.headers.get("cookie"))
        if plan.redirect is not None:
            return _redirect(req, plan)
        request_id = (req.metadata or {}).get("hardcap_bench_id")
        refused = plan.hang or plan.status >= 400
        account = truth.receive(req.tenant(), plan.prompt_tokens, request_id, refused=refused)
        if account is None:
            if plan.hang:
                return await hang(request)
            message = f"injected error ([mock:status={plan.status}])"
            return _error(plan.status, message, retry_headers(plan.retry_after))
        response: Response
        if req.stream:
            body = stream_events(req, plan, account, settings.first_token_ms)
            if plan.gzip:
                encoding = {"content-encoding": "gzip"}
                response = CuttableStreamingResponse(_gzipped(body), account, encoding)
            else:
                response = CuttableStreamingResponse(body, account)
        else:
            response = await _complete(req, plan, account, settings.first_token_ms)
        if plan.set_cookie:
            # As a provider's load balancer pins a client: one session per tenant.
            response.set_cookie("mock_session", req.tenant(), max_age=3600)
        return response

    async def ground_truth(_: Request) -> Response:
        return JSONResponse(truth.as_json())

    async def requests(_: Request) -> Response:
        return JSONResponse(truth.requests_json())

    async def timeline(request: Request) -> Response:
        return JSONResponse(truth.timeline_json(request.query_params.get("tenant", "anonymous")))

    async def reset(_: Request) -> Response:
        truth.reset()
        faults.set(None)
        prompt_cache.clear()
        cookies.clear()
        traceparents.clear()
        return JSONResponse({"ok": True})

    async def shown_cookies(_: Request) -> Response:
        return JSONResponse(list(cookies))

    async def set_fault(request: Request) -> Response:
        try:
            faults.set(parse_fault(await request.json()))
        except ValueError as exc:
            return _error(400, f"invalid fault: {exc}")
        return JSONResponse({"ok": True, **faults.as_json()})

    async def show_traceparents(_: Request) -> Response:
        return JSONResponse(list(traceparents))

    async def show_fault(_: Request) -> Response:
        return JSONResponse(faults.as_json())

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
            *anthropic_routes(truth, faults, planner, settings.first_token_ms, prompt_cache),
            *embeddings_routes(truth, settings.seed),
            Route("/v1/models", models, methods=["GET"]),
            Route("/mock/ground-truth", ground_truth, methods=["GET"]),
            Route("/mock/requests", requests, methods=["GET"]),
            Route("/mock/timeline", timeline, methods=["GET"]),
            Route("/mock/traceparents", show_traceparents, methods=["GET"]),
            Route("/mock/reset", reset, methods=["POST"]),
            Route("/mock/fault", set_fault, methods=["POST"]),
            Route("/mock/fault", show_fault, methods=["GET"]),
            Route("/mock/cookies", shown_cookies, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )
    app.state.ground_truth = truth
    app.state.faults = faults
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
