"""A local stand-in for Amazon Bedrock's runtime API: Converse and ConverseStream, with AWS's
binary event-stream framing, SigV4 checked, and the ground truth of what it billed.

Point a ``bedrock`` upstream's ``base_url`` at it; botocore signs the calls with whatever
credentials it finds (:data:`CREDENTIALS_ENV` are the ones this fake verifies signatures
with). It answers ``POST /model/{modelId}/converse`` and ``/model/{modelId}/converse-stream``
(``application/vnd.amazon.eventstream``: each frame a prelude of total length, headers length
and the prelude's CRC32, then headers, the JSON payload and the message's CRC32) with the same
plans as the OpenAI mock (:func:`~hardcap_core.local.mock_plan.make_plan`: a model id holding
"reason", or ``thinking`` / ``reasoning_effort`` / ``reasoningConfig`` in
``additionalModelRequestFields``, reasons first; ``inferenceConfig.maxTokens`` caps reasoning
and output together; tools from ``toolConfig``). Its prompt bill is its own: cl100k_base over
the Converse body's text, images by their tiles (:mod:`~hardcap_core.local.mock_billing`).

A stream: ``messageStart``; each reasoning token as a ``reasoningContent.text`` delta (then a
``signature`` delta, not billed) or, with ``[mock:redacted=1]``, as ``redactedContent``; the
text, or a tool call (``contentBlockStart`` with the name, then ``toolUse.input`` fragments);
``contentBlockStop`` after each block; ``messageStop`` (``end_turn``, ``max_tokens``,
``tool_use``, or ``stop_sequence`` with ``[mock:stop_sequence=1]``); ``metadata`` with usage
(``inputTokens`` without the cache reads and writes, reported apart) and metrics.

Directives in the last user message, as the OpenAI mock reads them: ``tokens``, ``thinking``,
``hidden``, ``pace_ms``, ``ignore_cap``, ``tool_use``, ``die_after``, ``eof_after``, ``hang``,
``cache_read`` / ``cache_write``, and ``status=N`` (answered as the Bedrock exception of that
status: 429 ThrottlingException, ...). Its own: ``stream_error=N`` (a modelStreamErrorException
frame after N steps, and the stream ends), ``bad_crc=N`` (step N's frame has a wrong CRC),
``redacted=1``, ``stop_sequence=1``, and ``bedrock_status=N`` (as ``status``, but the OpenAI
mock ignores it: a fallback from this fake to the mock can be tested).

Like Bedrock, it refuses (400 ``ValidationException``, "invalid beta flag") an
``additionalModelRequestFields.anthropic_beta`` value outside :data:`BETAS_BEDROCK_TAKES`.

Tenant: ``requestMetadata.user``, else ``requestMetadata.tenant``, else "anonymous"; a
``requestMetadata.hardcap_bench_id`` gets its own record. The ground truth is at the OpenAI
mock's paths (``GET /mock/ground-truth``, ``GET /mock/requests``, ``POST /mock/reset``), so
the tests' ``Mock(url=...)`` reads either.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import random
import re
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hardcap_core.local import mock_billing
from hardcap_core.local.bedrock_frames import (
    EVENT_STREAM,
    event_frame,
    exception_frame,
    signature_problem,
)
from hardcap_core.local.mock_faults import hang
from hardcap_core.local.mock_plan import ChatRequest, Plan, make_plan
from hardcap_core.local.mock_replies import CuttableStreamingResponse, MockAbort
from hardcap_core.local.mock_truth import Account, GroundTruth
from hardcap_core.wire.media import base64_bytes, image_size, image_tokens

FAKE_ACCESS_KEY = "AKIDHARDCAPFAKE00001"
FAKE_SECRET_KEY = "hardcap-bedrock-fake-secret"
# What a process needs for botocore to sign as the fake expects, without any AWS account.
CREDENTIALS_ENV = {
    "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY,
    "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_KEY,
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
EXCEPTIONS = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}
_DIRECTIVE = re.compile(r"\[mock:([a-z_]+)=([0-9]+(?:\.[0-9]+)?)\]")  # as mock_plan reads them


@dataclasses.dataclass(frozen=True)
class FakeSettings:
    """How the fake generates, as :class:`~hardcap_core.local.mock_upstream.MockSettings`;
    ``secret_key`` verifies signatures (None: only their form is checked)."""

    pace_ms: float = 5.0
    median_tokens: int = 150
    sigma: float = 1.0
    seed: int | None = None
    reasoning_tokens: int = 0
    secret_key: str | None = FAKE_SECRET_KEY


# -- what a request is billed and answered ------------------------------------------------------


def _text_of(blocks: Any) -> str:
    if not isinstance(blocks, list):
        return ""
    return "".join(
        b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)
    )


def _block_tokens(block: Any) -> int:
    if isinstance(block, dict) and isinstance(block.get("text"), str):
        return mock_billing.text_tokens(block["text"])
    image = block.get("image") if isinstance(block, dict) else None
    if isinstance(image, dict):
        data = base64_bytes(str((image.get("source") or {}).get("bytes", "")))
        return image_tokens(image_size(data), None)
    return mock_billing.value_tokens(block)


def prompt_tokens(body: dict[str, Any]) -> int:
    """The fake's bill for a Converse body's input: system blocks, every message's blocks
    (text by cl100k_base, images by their tiles, anything else by its JSON) and the tools."""
    total = mock_billing.REPLY_PRIMING + sum(_block_tokens(b) for b in body.get("system") or [])
    for message in body.get("messages") or []:
        blocks = message.get("content") or [] if isinstance(message, dict) else []
        total += mock_billing.TOKENS_PER_MESSAGE + sum(_block_tokens(b) for b in blocks)
    for tool in (body.get("toolConfig") or {}).get("tools") or []:
        total += mock_billing.FUNCTION_FRAME + mock_billing.value_tokens(tool)
    return total


# The anthropic_beta values Bedrock's Claude request parameters document (AWS's "Anthropic
# Claude Messages API" page); Bedrock answers any other with a ValidationException.
BETAS_BEDROCK_TAKES = frozenset(
    {"computer-use-2024-10-22", "computer-use-2025-01-24", "token-efficient-tools-2025-02-19",
     "interleaved-thinking-2025-05-14", "output-128k-2025-02-19", "dev-full-thinking-2025-05-14",
     "context-1m-2025-08-07", "context-management-2025-06-27", "effort-2025-11-24",
     "tool-search-tool-2025-10-19", "tool-examples-2025-10-29"}
)  # fmt: skip


def plan_request(model_id: str, body: dict[str, Any], stream: bool) -> ChatRequest:
    """The Converse request in the OpenAI mock's terms, for :func:`make_plan` (a ValueError
    for what Bedrock refuses)."""
    extra = body.get("additionalModelRequestFields") or {}
    for beta in extra.get("anthropic_beta") or []:
        if beta not in BETAS_BEDROCK_TAKES:
            raise ValueError(f"invalid beta flag: {beta}")
    messages = [
        {"role": m.get("role"), "content": _text_of(m.get("content"))}
        for m in body.get("messages") or []
        if isinstance(m, dict)
    ]
    config = body.get("toolConfig") or {}
    tools = [
        {
            "type": "function",
            "function": {
                "name": s.get("name"),
                "parameters": (s.get("inputSchema") or {}).get("json"),
            },
        }
        for t in config.get("tools") or []
        if isinstance(s := t.get("toolSpec"), dict)
    ]
    choice: Any = None
    wanted = config.get("toolChoice") or {}
    if "any" in wanted:
        choice = "required"
    elif isinstance(wanted.get("tool"), dict):
        choice = {"type": "function", "function": {"name": wanted["tool"].get("name")}}
    thinking = extra.get("thinking")
    reasons = (isinstance(thinking, dict) and thinking.get("type") != "disabled") or any(
        extra.get(k) for k in ("reasoning_effort", "reasoningConfig")
    )
    return ChatRequest(
        model=model_id,
        messages=messages,
        max_tokens=(body.get("inferenceConfig") or {}).get("maxTokens"),
        stream=stream,
        tools=tools or None,
        tool_choice=choice,
        reasoning_effort="high" if reasons else None,
    )


def usage(plan: Plan) -> dict[str, int]:
    """Converse's usage for ``plan``: ``inputTokens`` is the input not read from or written to
    the cache; the cache's share is reported apart (only when there is one)."""
    read = min(plan.cache_read, plan.prompt_tokens)
    written = min(plan.cache_write, plan.prompt_tokens - read)
    out = {
        "inputTokens": plan.prompt_tokens - read - written,
        "outputTokens": plan.completion_tokens,
        "totalTokens": plan.prompt_tokens + plan.completion_tokens,
    }
    if read:
        out["cacheReadInputTokens"] = read
    if written:
        out["cacheWriteInputTokens"] = written
    return out


STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def _stop_reason(plan: Plan, knobs: dict[str, float]) -> str:
    if plan.finish_reason == "stop" and knobs.get("stop_sequence"):
        return "stop_sequence"
    return STOP_REASONS.get(plan.finish_reason, "tool_use")


def _signature(plan: Plan) -> str:
    return base64.b64encode(hashlib.sha256("".join(plan.reasoning).encode()).digest()).decode()


Step = list[tuple[str, dict[str, Any], int]]  # frames of one step: event type, body, billed


def _steps(plan: Plan, knobs: dict[str, float]) -> list[Step]:
    """Reasoning deltas, then the text or the tool call's fragments, with their block ends."""
    steps: list[Step] = []
    index = 0
    if plan.reasoning:
        for token in plan.reasoning:
            piece: dict[str, Any] = {"text": token}
            if knobs.get("redacted"):
                piece = {"redactedContent": base64.b64encode(token.encode()).decode()}
            delta = {"contentBlockIndex": index, "delta": {"reasoningContent": piece}}
            steps.append([("contentBlockDelta", delta, 1)])
        if not knobs.get("redacted"):
            sign = {"reasoningContent": {"signature": _signature(plan)}}
            steps[-1].append(("contentBlockDelta", {"contentBlockIndex": index, "delta": sign}, 0))
        steps[-1].append(("contentBlockStop", {"contentBlockIndex": index}, 0))
        index += 1
    for i, piece_text in enumerate(plan.content):
        step: Step = []
        if plan.tool_name is not None:
            if i == 0:
                tool = {"toolUseId": f"tooluse_{uuid.uuid4().hex[:22]}", "name": plan.tool_name}
                start = {"contentBlockIndex": index, "start": {"toolUse": tool}}
                step.append(("contentBlockStart", start, 0))
            delta = {"toolUse": {"input": piece_text}}
        else:
            delta = {"text": piece_text}
        step.append(("contentBlockDelta", {"contentBlockIndex": index, "delta": delta}, 1))
        steps.append(step)
    if plan.content:
        steps[-1].append(("contentBlockStop", {"contentBlockIndex": index}, 0))
    return steps


async def _stream(
    plan: Plan, knobs: dict[str, float], account: Account
) -> AsyncGenerator[bytes, None]:
    """The event-stream frames; each billed token counts into ``account`` as it is yielded."""
    started = time.monotonic()
    await asyncio.sleep(plan.silent_ms / 1000)
    account.add_tokens(plan.hidden)
    yield event_frame("messageStart", {"role": "assistant"})
    steps = _steps(plan, knobs)
    error_at, bad_at = knobs.get("stream_error"), knobs.get("bad_crc")
    for n in range(len(steps) + 1):
        if n == plan.die_after:
            raise MockAbort
        if n == plan.eof_after:
            return
        if n == error_at:
            yield exception_frame("modelStreamErrorException", "injected ([mock:stream_error])")
            return
        if n == len(steps):
            break
        if plan.pace_ms:
            await asyncio.sleep(plan.pace_ms / 1000)
        data = b"".join(event_frame(kind, body) for kind, body, _ in steps[n])
        if n + 1 == bad_at:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        account.add_tokens(sum(billed for _, _, billed in steps[n]))
        yield data
    latency = int((time.monotonic() - started) * 1000)
    stop = event_frame("messageStop", {"stopReason": _stop_reason(plan, knobs)})
    yield stop + event_frame("metadata", {"usage": usage(plan), "metrics": {"latencyMs": latency}})
    account.close(finished=True)


def _reply(plan: Plan, knobs: dict[str, float], latency_ms: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if plan.reasoning and knobs.get("redacted"):
        secret = base64.b64encode("".join(plan.reasoning).encode()).decode()
        content.append({"reasoningContent": {"redactedContent": secret}})
    elif plan.reasoning:
        text = {"text": "".join(plan.reasoning), "signature": _signature(plan)}
        content.append({"reasoningContent": {"reasoningText": text}})
    joined = "".join(plan.content)
    if plan.tool_name is not None:
        try:
            arguments = json.loads(joined)
        except ValueError:
            arguments = {}  # cut by maxTokens: Bedrock has no half-made object to show
        tool = {"toolUseId": f"tooluse_{uuid.uuid4().hex[:22]}", "name": plan.tool_name}
        content.append({"toolUse": {**tool, "input": arguments}})
    elif joined:
        content.append({"text": joined})
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": _stop_reason(plan, knobs),
        "usage": usage(plan),
        "metrics": {"latencyMs": latency_ms},
    }


# -- the server ---------------------------------------------------------------------------------


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    name = code or EXCEPTIONS.get(status, "InternalServerException")
    headers = {"x-amzn-ErrorType": f"{name}:http://internal.amazon.com/coral/com.amazon.bedrock/"}
    return JSONResponse({"message": message}, status_code=status, headers=headers)


def create_bedrock_fake_app(settings: FakeSettings | None = None) -> Starlette:
    """The fake as an ASGI app. Its :class:`GroundTruth` is at ``app.state.ground_truth``."""
    settings = settings or FakeSettings()
    truth = GroundTruth()
    rng = random.Random(settings.seed)

    async def invoke(request: Request) -> Response:
        stream = request.url.path.endswith("/converse-stream")
        raw = await request.body()
        problem = signature_problem(request, raw, settings.secret_key)
        if problem is not None:
            return _error(403, problem, "InvalidSignatureException")
        try:
            body = json.loads(raw)
            req = plan_request(request.path_params["model_id"], body, stream)
            plan = make_plan(
                req,
                rng,
                median_tokens=settings.median_tokens,
                sigma=settings.sigma,
                reasoning_tokens=settings.reasoning_tokens,
                pace_ms=settings.pace_ms,
            )
        except ValueError as exc:  # pydantic's ValidationError is one
            return _error(400, f"invalid request: {exc}")
        plan = dataclasses.replace(plan, prompt_tokens=prompt_tokens(body))
        knobs = {k: float(v) for k, v in _DIRECTIVE.findall(req.last_user_text())}
        if "bedrock_status" in knobs:  # a failure of this fake only, not of a fallback mock
            plan = dataclasses.replace(plan, status=int(knobs["bedrock_status"]))
        metadata = body.get("requestMetadata") or {}
        tenant_name = metadata.get("user") or metadata.get("tenant") or "anonymous"
        refused = plan.hang or plan.status >= 400  # Bedrock bills no failed call
        bench_id = metadata.get("hardcap_bench_id")
        account = truth.receive(tenant_name, plan.prompt_tokens, bench_id, refused=refused)
        if account is None:
            if plan.hang:
                return await hang(request)
            return _error(plan.status, f"injected error ([mock:status={plan.status}])")
        headers = {"x-amzn-requestid": str(uuid.uuid4())}
        if stream:
            frames = _stream(plan, knobs, account)
            return CuttableStreamingResponse(frames, account, headers, media_type=EVENT_STREAM)
        return await _converse(plan, knobs, account, headers)

    async def _converse(
        plan: Plan, knobs: dict[str, float], account: Account, headers: dict[str, str]
    ) -> Response:
        finished = False
        try:
            steps = len(plan.reasoning) + len(plan.content)
            await asyncio.sleep((plan.silent_ms + steps * plan.pace_ms) / 1000)
            account.add_tokens(plan.completion_tokens)
            finished = True
        finally:
            account.close(finished)
        latency = int(plan.silent_ms + len(plan.content) * plan.pace_ms)
        return JSONResponse(_reply(plan, knobs, latency), headers=headers)

    async def ground_truth(_: Request) -> Response:
        return JSONResponse(truth.as_json())

    async def requests(_: Request) -> Response:
        return JSONResponse(truth.requests_json())

    async def reset(_: Request) -> Response:
        truth.reset()
        return JSONResponse({"ok": True})

    app = Starlette(
        routes=[
            Route("/model/{model_id:path}/converse", invoke, methods=["POST"]),
            Route("/model/{model_id:path}/converse-stream", invoke, methods=["POST"]),
            Route("/mock/ground-truth", ground_truth, methods=["GET"]),
            Route("/mock/requests", requests, methods=["GET"]),
            Route("/mock/reset", reset, methods=["POST"]),
        ]
    )
    app.state.ground_truth = truth
    return app
