"""What the mock upstream (see `mock_upstream`) sends for a `Plan`: the SSE events of a stream
and the body of a whole reply, misbehaviours included, each token counted into the ground
truth as it is handed to the server.

A stream is: the silent phase (hidden reasoning, at most keep-alive comments), the opening
chunk (role), one step per reasoning token and per output piece (a content token, an argument
fragment, or a spoken word: its transcript chunk then its audio chunk), the finish chunk, the
usage chunk (if asked for) and [DONE]. A bad event (`Plan.malformed`) goes out before step
`malformed_at` (0: before everything). `die_after` / `eof_after` stop before a step.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from hardcap_core.local.mock_plan import (
    AUDIO_BYTES_PER_TOKEN,
    AUDIO_TOKENS_PER_WORD,
    BAD_UTF8,
    ERROR_OBJECT,
    JSON_ARRAY,
    NOT_JSON,
    NULL_CHOICE,
    USAGE_NOT_OBJECT,
    ChatRequest,
    Plan,
    lie_about,
)
from hardcap_core.local.mock_truth import Account

# One spoken word's audio: AUDIO_TOKENS_PER_WORD tokens of 24 kHz 16-bit mono PCM (not silence,
# so it does not compress to nothing; nobody listens to it).
WORD_AUDIO = base64.b64encode(
    bytes(i % 251 for i in range(AUDIO_TOKENS_PER_WORD * AUDIO_BYTES_PER_TOKEN))
).decode()
KEEPALIVE = b": ping\n\n"
SILENT_TICK_MS = 50.0  # hidden tokens are billed in steps this long when no keep-alive is set
_BAD = b"\xff\xfe"  # never valid UTF-8
_PLACEHOLDER = "@@bad@@"  # where the bad bytes go in a JSON text


class MockAbort(Exception):
    """Raised inside a stream's generator to drop the connection (`[mock:die_after=N]`)."""


class CuttableStreamingResponse(StreamingResponse):
    """A StreamingResponse that can end without its final body message, like a crashed host.

    It also closes the body generator itself: if a disconnect cancels the response while the
    generator is parked at a `yield`, Starlette leaves it to the garbage collector, and the
    ground truth would become final only at some later time. If the disconnect comes before
    the generator ever ran, its `finally` never runs, so the account is closed here too.
    """

    def __init__(
        self,
        content: AsyncGenerator[bytes, None],
        account: Account,
        headers: dict[str, str] | None = None,
        media_type: str = "text/event-stream",
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._generator = content
        self._account = account

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except MockAbort:
            # Returning with the response incomplete makes uvicorn drop the connection (it logs
            # one line), so the client sees a body cut mid-stream with no [DONE].
            pass
        finally:
            await self._generator.aclose()
            self._account.close(finished=False)


async def dropped(body: bytes, account: Account) -> AsyncGenerator[bytes, None]:
    """Half of a whole reply's body, then the connection drops (a "disconnect" fault): the
    provider failed, so nothing is billed."""
    try:
        yield body[: len(body) // 2]
        raise MockAbort
    finally:
        account.close(finished=False)


Step = list[tuple[dict[str, Any], int]]  # the deltas of one step, each with its billed tokens


def usage(plan: Plan) -> dict[str, Any]:
    """The usage object a provider reports for ``plan``: every billed token."""
    details: dict[str, int] = {"reasoning_tokens": plan.reasoning_tokens}
    if plan.shape == "audio":
        details["audio_tokens"] = plan.audio_tokens
        details["text_tokens"] = plan.completion_tokens - plan.audio_tokens - plan.reasoning_tokens
    out: dict[str, Any] = {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": plan.completion_tokens,
        "total_tokens": plan.prompt_tokens + plan.completion_tokens,
        "completion_tokens_details": details,
    }
    if plan.cache_read:
        # OpenAI counts cached tokens inside prompt_tokens: at most the whole prompt.
        out["prompt_tokens_details"] = {"cached_tokens": min(plan.cache_read, plan.prompt_tokens)}
    lie_about(plan, out, input_key="prompt_tokens", output_key="completion_tokens")
    return out


def served_tier(req: ChatRequest) -> str | None:
    """The service tier a reply says it was served at, as OpenAI says it when a request names
    one: the tier named (billed at that tier's price), "default" for "auto" (a project that
    defaults to the standard tier); None when the request names none."""
    tier = (req.model_extra or {}).get("service_tier")
    if not isinstance(tier, str) or not tier:
        return None
    return "default" if tier == "auto" else tier


def _steps(plan: Plan) -> list[Step]:
    """The streamed steps: reasoning tokens, then output pieces in the plan's shape."""
    steps: list[Step] = [[({"reasoning": t}, 1)] for t in plan.reasoning]
    for i, piece in enumerate(plan.content):
        if plan.shape == "content":
            steps.append([({"content": piece}, 1)])
        elif plan.shape == "tool_calls":
            step: Step = []
            if i == 0:
                call = {"index": 0, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function"}
                fn = {"name": plan.tool_name, "arguments": ""}
                step.append(({"tool_calls": [{**call, "function": fn}]}, 0))
            step.append(({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}, 1))
            steps.append(step)
        elif plan.shape == "function_call":
            step = []
            if i == 0:
                step.append(({"function_call": {"name": plan.tool_name, "arguments": ""}}, 0))
            steps.append([*step, ({"function_call": {"arguments": piece}}, 1)])
        else:
            transcript: dict[str, Any] = {"transcript": piece}
            if i == 0:  # OpenAI: the id rides with the first transcript piece
                transcript = {"id": f"audio_{uuid.uuid4().hex[:24]}", **transcript}
            words = [({"audio": transcript}, 1)]
            steps.append([*words, ({"audio": {"data": WORD_AUDIO}}, AUDIO_TOKENS_PER_WORD)])
    return steps


async def _think(plan: Plan, account: Account) -> AsyncGenerator[bytes, None]:
    """The silent phase: `hidden` reasoning tokens generated evenly over `silent_ms` and billed
    as they are generated, so a stream closed meanwhile bills its share; nothing is sent but a
    keep-alive comment every `keepalive_ms`."""
    if plan.silent_ms <= 0:
        account.add_tokens(plan.hidden)
        return
    start = time.monotonic()
    length = plan.silent_ms / 1000
    tick = (plan.keepalive_ms or SILENT_TICK_MS) / 1000
    billed = 0
    pinged = start
    while (elapsed := time.monotonic() - start) < length:
        await asyncio.sleep(min(tick, length - elapsed))
        now = time.monotonic()
        share = int(plan.hidden * min((now - start) / length, 1.0))
        account.add_tokens(share - billed)
        billed = share
        # At most one comment per interval: an event loop with millisecond timers (uvloop)
        # returns a sub-millisecond sleep at once, which would otherwise ping in a burst.
        if plan.keepalive_ms and now - start < length and now - pinged >= tick * 0.9:
            pinged = now
            yield KEEPALIVE
    account.add_tokens(plan.hidden - billed)


async def stream_events(
    req: ChatRequest, plan: Plan, account: Account, first_token_ms: float
) -> AsyncGenerator[bytes, None]:
    """SSE events; counts each billed token into `account` as its event is yielded."""
    chunk_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    tier = served_tier(req)

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": req.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if tier is not None:
            out["service_tier"] = tier
        if include_usage:
            out["usage"] = None
        return out

    def bad_event() -> tuple[bytes, int]:
        """The injected bad event, and the tokens it bills."""
        kind = plan.malformed
        if kind == BAD_UTF8:
            text = json.dumps(chunk({"content": _PLACEHOLDER}))
            return _data(text.encode().replace(_PLACEHOLDER.encode(), _BAD)), 1
        if kind == NULL_CHOICE:
            return _data(json.dumps({**chunk({}), "choices": [None]}).encode()), 0
        if kind == ERROR_OBJECT:
            return _data(b'{"error": "boom"}'), 0
        if kind == USAGE_NOT_OBJECT:
            return _data(json.dumps({**chunk({}), "choices": [], "usage": 5}).encode()), 0
        if kind == NOT_JSON:
            return _data(b"this is not json {"), 0
        assert kind == JSON_ARRAY
        return _data(json.dumps([chunk({"content": " the"})]).encode()), 1

    opening: dict[str, Any] = {
        "role": "assistant",
        "content": "" if plan.shape == "content" else None,
    }
    steps = _steps(plan)
    # A step past the end means the end: after the last step, before the finish chunk.
    bad_at, die, eof = (
        _clamp(n, len(steps)) for n in (plan.malformed_at, plan.die_after, plan.eof_after)
    )
    started = time.monotonic() + (first_token_ms + plan.silent_ms) / 1000
    finished = False
    try:
        await asyncio.sleep(first_token_ms / 1000)
        async for ping in _think(plan, account):
            yield ping
        for i in range(len(steps) + 1):
            if i == bad_at and plan.malformed is not None:
                data, tokens = bad_event()
                account.add_tokens(tokens)
                yield data
                if plan.malformed == ERROR_OBJECT:
                    return  # the provider failed: it stops, and ends the body
            if i == 0:
                yield _data(json.dumps(chunk(opening)).encode())
            if i == die:
                raise MockAbort
            if i == eof:
                return  # the body ends cleanly, but without finish, usage or [DONE]
            if i == len(steps):
                break
            # Sleep to an absolute schedule so per-sleep overhead does not slow the pace; a
            # zero sleep still yields to the loop, where Starlette notices a disconnect.
            await asyncio.sleep(max(0.0, started + i * plan.pace_ms / 1000 - time.monotonic()))
            for delta, tokens in steps[i]:
                account.add_tokens(tokens)
                yield _data(json.dumps(chunk(delta)).encode())
        if plan.shape == "audio" and plan.content:
            yield _data(json.dumps(chunk({"audio": {"expires_at": created + 3600}})).encode())
        yield _data(json.dumps(chunk({}, plan.finish_reason)).encode())
        if include_usage:
            reported: Any = 5 if plan.malformed == USAGE_NOT_OBJECT else usage(plan)
            closing = {**chunk({}), "choices": [], "usage": reported}
            yield _data(json.dumps(closing).encode())
        yield b"data: [DONE]\n\n"
        finished = True
    finally:
        # Runs on normal end, on MockAbort, and on cancellation or GeneratorExit when the client
        # goes away: no token is counted after this, so once in_flight drops the counts are final.
        account.close(finished)


def _clamp(step: int | None, steps: int) -> int | None:
    return None if step is None else min(step, steps)


def _data(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def reply_body(req: ChatRequest, plan: Plan) -> bytes:
    """The JSON body of a whole reply (or, for a malformed plan, what passes for one)."""
    message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
    if plan.reasoning:
        message["reasoning"] = "".join(plan.reasoning)
    text = "".join(plan.content)
    if plan.shape == "content":
        message["content"] = text
    elif plan.shape == "tool_calls":
        fn = {"name": plan.tool_name, "arguments": text}
        call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": fn}
        message["tool_calls"] = [call]
    elif plan.shape == "function_call":
        message["function_call"] = {"name": plan.tool_name, "arguments": text}
    else:
        message["audio"] = {
            "id": f"audio_{uuid.uuid4().hex[:24]}",
            "data": WORD_AUDIO * len(plan.content),  # whole 3-byte groups: they concatenate
            "expires_at": int(time.time()) + 3600,
            "transcript": text,
        }
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": plan.finish_reason}
    body: Any = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": [choice],
        "usage": usage(plan),
    }
    if (tier := served_tier(req)) is not None:
        body["service_tier"] = tier
    kind = plan.malformed
    if kind == BAD_UTF8:
        message["content"] = (message["content"] or "") + _PLACEHOLDER
        return json.dumps(body).encode().replace(_PLACEHOLDER.encode(), _BAD)
    if kind == NULL_CHOICE:
        body["choices"] = [None]
    elif kind == ERROR_OBJECT:
        body = {"error": "boom"}
    elif kind == USAGE_NOT_OBJECT:
        body["usage"] = 5
    elif kind == NOT_JSON:
        return b"this is not json {"
    elif kind == JSON_ARRAY:
        body = [body]
    return json.dumps(body).encode()
