"""Anthropic Messages, as a :class:`~hardcap_core.wire.base.WireFormat`: ``POST /v1/messages``.

A stream is Anthropic's SSE (each event named by an ``event:`` line, which the SDKs dispatch
on): ``message_start``, then per content block ``content_block_start`` / ``_delta`` /
``_stop`` (text, thinking, tool_use with ``input_json_delta``), then ``message_delta`` with
the stop reason and the usage, then ``message_stop``. From a provider of another dialect
the events are built from the normalized output; from an Anthropic upstream they pass through
(model renamed), but ``message_delta`` is held back and sent at the end with the usage that
was charged, and a stream the gateway cuts is closed here: its open blocks stopped, its stop
reason ``max_tokens``. Usage is what the ledger charged, in Anthropic's terms:
``input_tokens`` without the cache reads and writes, which are reported beside it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from hardcap_core import json_codec
from hardcap_core.chat import ChatRequest
from hardcap_core.errors import GatewayError
from hardcap_core.events import Completion, Event, FinishReason, OutputKind
from hardcap_core.ledger import BudgetState, RateState
from hardcap_core.wire.anthropic_request import DIALECT, parse_messages_request
from hardcap_core.wire.base import Charged
from hardcap_core.wire.headers import TOKEN_DIMENSIONS, budget_headers

STOP_REASONS = {
    FinishReason.STOP: "end_turn",
    FinishReason.LENGTH: "max_tokens",
    FinishReason.TOOL_CALLS: "tool_use",
    FinishReason.FUNCTION_CALL: "tool_use",
    FinishReason.CONTENT_FILTER: "refusal",
    FinishReason.OTHER: "end_turn",
}
# Anthropic's error types by status (its "Errors" page), which its SDKs map to exceptions.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}
# Which block each kind of output streams into; the rest of the kinds are a tool call's.
BLOCK_KINDS = {
    OutputKind.CONTENT: "text",
    OutputKind.REFUSAL: "text",
    OutputKind.OTHER: "text",
    OutputKind.REASONING: "thinking",
}


class AnthropicMessages:
    dialect = DIALECT

    def parse(self, raw: bytes) -> ChatRequest:
        return parse_messages_request(raw)

    def encoder(self, request: ChatRequest, *, model: str, same_dialect: bool) -> MessageEncoder:
        return MessageEncoder(model, input_estimate=request.input_tokens, passthrough=same_dialect)

    def reply(
        self, completion: Completion, *, model: str, same_dialect: bool, charged: Charged
    ) -> dict[str, Any]:
        if same_dialect:
            return dict(completion.raw, model=model, usage=usage_of(charged, passthrough=True))
        thinking, text = "", ""
        tools: dict[int, dict[str, Any]] = {}
        for out in completion.output:
            if out.kind is OutputKind.REASONING:
                thinking += out.text
            elif out.kind in BLOCK_KINDS:
                text += out.text
            else:
                index = out.tool_call or 0
                tool = tools.setdefault(index, {"name": "", "arguments": ""})
                tool["name" if out.kind is OutputKind.TOOL_NAME else "arguments"] += out.text
        content: list[dict[str, Any]] = []
        if thinking:
            content.append({"type": "thinking", "thinking": thinking, "signature": ""})
        if text:
            content.append({"type": "text", "text": text})
        for index, tool in sorted(tools.items()):
            tool_id = _openai_tool_id(completion.raw, index, "message") or _tool_id()
            content.append(
                {"type": "tool_use", "id": tool_id, "name": tool["name"], "input": _input(tool)}
            )
        finish = completion.finish
        return {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": STOP_REASONS[finish] if finish else "end_turn",
            "stop_sequence": None,
            "usage": usage_of(charged, passthrough=False),
        }

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return error_body(error)

    def budget_headers(
        self, budgets: Sequence[BudgetState], rates: Sequence[RateState], now_ms: int
    ) -> dict[str, str]:
        headers = budget_headers(budgets, rates, now_ms)
        headers.update(anthropic_ratelimit_headers(budgets, rates, now_ms))
        return headers


class MessageEncoder:
    """Anthropic SSE events for one stream (see the module docstring)."""

    def __init__(self, model: str, *, input_estimate: int, passthrough: bool) -> None:
        self.model = model
        self.input_estimate = input_estimate
        self.passthrough = passthrough
        self._started = False  # message_start went out
        self._next = 0  # the index of the next content block
        self._open: tuple[str, int | None] | None = None  # the open block: kind, tool call
        self._tool: dict[str, Any] | None = None  # a tool_use block whose start waits for its name
        self._stop_reason: str | None = None
        self._open_raw: set[int] = set()  # passthrough: blocks started and not stopped
        self._held: dict[str, Any] | None = None  # passthrough: the provider's message_delta

    def event(self, event: Event) -> bytes | None:
        out = b"" if self._started or self.passthrough else self._message_start()
        out += self._forward(event) if self.passthrough else self._build(event)
        return out or None

    def close(self, *, for_length: bool, charged: Charged) -> bytes:
        out = b"" if self._started else self._message_start()
        out += self._stop_block()
        for index in sorted(self._open_raw):
            out += _sse({"type": "content_block_stop", "index": index})
        self._open_raw.clear()
        delta: dict[str, Any] = dict(self._held.get("delta") or {}) if self._held else {}
        if for_length or not delta.get("stop_reason"):
            delta["stop_reason"] = "max_tokens" if for_length else self._stop_reason or "end_turn"
            delta["stop_sequence"] = None
        base = self._held.get("usage") if self._held else None
        usage = usage_of(charged, passthrough=self.passthrough, base=base)
        usage["hardcap"] = charged.extension()  # what the ledger charged, cost included
        out += _sse({"type": "message_delta", "delta": delta, "usage": usage})
        return out + _sse({"type": "message_stop"})

    def error(self, error: GatewayError) -> bytes:
        return _sse(error_body(error))

    # -- from an Anthropic upstream -------------------------------------------------------------

    def _forward(self, event: Event) -> bytes:
        raw = event.raw
        kind = raw.get("type") if isinstance(raw, dict) else None
        if raw is None or not isinstance(kind, str):
            return b""
        if kind == "message_start":
            message = raw.get("message")
            if isinstance(message, dict):
                message["model"] = self.model
            self._started = True
        elif not self._started:
            return self._message_start() + self._forward(event)
        if kind == "message_delta":
            self._held = raw  # sent by close(), with the usage that was charged
            return b""
        if kind in ("message_stop", "error"):
            return b""  # close() ends the message; an error ends the stream as error()
        index = raw.get("index")
        if kind == "content_block_start" and isinstance(index, int):
            self._open_raw.add(index)
        elif kind == "content_block_stop" and isinstance(index, int):
            self._open_raw.discard(index)
        return _sse(raw)

    # -- from a provider of another dialect ------------------------------------------------------

    def _build(self, event: Event) -> bytes:
        out = b""
        for piece in event.output:
            block = BLOCK_KINDS.get(piece.kind)
            if block is not None:
                if not piece.text:
                    continue  # billed but not text (audio): nothing to show
                if self._open != (block, None):
                    out += self._stop_block() + self._start(block)
                out += self._delta(block, piece.text)
                continue
            index = piece.tool_call or 0
            if self._open != ("tool_use", index):
                out += self._stop_block()
                self._open = ("tool_use", index)
                self._tool = {"name": "", "id": _openai_tool_id(event.raw, index, "delta")}
            if piece.kind is OutputKind.TOOL_NAME:
                # The block starts once the name is whole (at the first argument, or when the
                # block ends); a name coming after that has no place in Anthropic's events.
                if self._tool is not None:
                    self._tool["name"] += piece.text
            elif piece.text:
                out += self._start_tool() + self._delta("tool_use", piece.text)
        if event.finish is not None:
            self._stop_reason = STOP_REASONS[event.finish]
        return out

    def _message_start(self) -> bytes:
        self._started = True
        message: dict[str, Any] = {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # The estimate admission reserved; message_delta carries what was charged.
            "usage": {"input_tokens": self.input_estimate, "output_tokens": 0},
        }
        return _sse({"type": "message_start", "message": message})

    def _start(self, block: str) -> bytes:
        self._open = (block, None)
        body: dict[str, Any] = {"type": block, block: ""}
        if block == "thinking":
            body["signature"] = ""  # not an Anthropic upstream's: there is none to give
        return _sse({"type": "content_block_start", "index": self._next, "content_block": body})

    def _start_tool(self) -> bytes:
        tool, self._tool = self._tool, None
        if tool is None:
            return b""
        body = {"type": "tool_use", "id": tool["id"] or _tool_id(), "name": tool["name"]}
        body["input"] = {}
        return _sse({"type": "content_block_start", "index": self._next, "content_block": body})

    def _delta(self, block: str, text: str) -> bytes:
        if block == "text":
            delta = {"type": "text_delta", "text": text}
        elif block == "thinking":
            delta = {"type": "thinking_delta", "thinking": text}
        else:
            delta = {"type": "input_json_delta", "partial_json": text}
        return _sse({"type": "content_block_delta", "index": self._next, "delta": delta})

    def _stop_block(self) -> bytes:
        if self._open is None:
            return b""
        out = self._start_tool()  # a tool call cut before its arguments still gets its block
        out += _sse({"type": "content_block_stop", "index": self._next})
        self._open = None
        self._next += 1
        return out


def _sse(payload: dict[str, Any]) -> bytes:
    """One Anthropic SSE event: named by its type, which is how the SDKs read it."""
    kind = payload["type"]
    return f"event: {kind}\ndata: ".encode() + json_codec.dumps(payload) + b"\n\n"


def _tool_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def _openai_tool_id(raw: Any, index: int, field: str) -> str | None:
    """The id an OpenAI-shaped chunk (``field`` "delta") or reply ("message") gave a tool
    call, so a tool result the client sends back names the id its upstream knows."""
    try:
        calls = raw["choices"][0][field]["tool_calls"]
        for position, call in enumerate(calls):
            if call.get("index", position) == index and isinstance(call.get("id"), str):
                tool_id: str = call["id"]
                return tool_id
    except (KeyError, IndexError, TypeError, AttributeError):
        pass  # not OpenAI-shaped, or no id in this chunk: the caller makes one
    return None


def _input(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool call's arguments as the object Anthropic's ``input`` is; arguments cut short
    (max_tokens) or not an object give an empty one."""
    try:
        value = json.loads(tool["arguments"] or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def usage_of(charged: Charged, *, passthrough: bool, base: Any = None) -> dict[str, Any]:
    """The usage the client sees: what the ledger charged, in Anthropic's terms (input
    without the cache reads and writes, reported beside it); from an Anthropic upstream, its
    own usage object's other fields alongside."""
    provider = charged.provider_usage
    usage: dict[str, Any] = {}
    if passthrough:
        source = base if isinstance(base, dict) else provider.raw if provider else None
        usage = dict(source) if isinstance(source, dict) else {}
    read = (provider.cached_input_tokens or 0) if provider else 0
    written = (provider.cache_write_input_tokens or 0) if provider else 0
    usage["input_tokens"] = max(charged.input_tokens - read - written, 0)
    usage["cache_read_input_tokens"] = read
    usage["cache_creation_input_tokens"] = written
    usage["output_tokens"] = charged.output_tokens
    return usage


def error_body(error: GatewayError) -> dict[str, Any]:
    """Anthropic's error shape, which its SDKs map to their exception classes. ``code`` is
    Hardcap's own (``budget_exceeded``, ``rate_limited``, ...), beside Anthropic's fields."""
    kind = ERROR_TYPES.get(error.status, "api_error")
    body: dict[str, Any] = {"type": kind, "message": error.message}
    if error.code:
        body["code"] = error.code
    return {"type": "error", "error": body}


def anthropic_ratelimit_headers(
    budgets: Sequence[BudgetState], rates: Sequence[RateState], now_ms: int
) -> dict[str, str]:
    """Anthropic's ``anthropic-ratelimit-{tokens,requests}-{limit,remaining,reset}`` for the
    tightest token budget or bucket and request limit; resets as RFC 3339 times."""
    headers: dict[str, str] = {}
    tokens = [
        (max(b.remaining, 0), b.budget.limit, b.reset_ms)
        for b in budgets
        if b.budget.dimension in TOKEN_DIMENSIONS
    ]
    tokens += [
        (r.tokens_remaining, r.limit.tokens_per_minute, r.tokens_reset_ms or 0)
        for r in rates
        if r.limit.tokens_per_minute and r.tokens_remaining is not None
    ]
    if tokens:
        remaining, limit, reset_ms = min(tokens)
        headers["anthropic-ratelimit-tokens-limit"] = str(limit)
        headers["anthropic-ratelimit-tokens-remaining"] = str(remaining)
        headers["anthropic-ratelimit-tokens-reset"] = _time(now_ms + reset_ms)
    requests = [
        (r.requests_remaining, r.limit.requests_per_minute, r.requests_reset_ms or 0)
        for r in rates
        if r.limit.requests_per_minute and r.requests_remaining is not None
    ]
    if requests:
        remaining, limit, reset_ms = min(requests)
        headers["anthropic-ratelimit-requests-limit"] = str(limit)
        headers["anthropic-ratelimit-requests-remaining"] = str(remaining)
        headers["anthropic-ratelimit-requests-reset"] = _time(now_ms + reset_ms)
    return headers


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
