"""OpenAI chat completions, as a :class:`~hardcap_core.wire.base.WireFormat`.

From an OpenAI-compatible provider, chunks pass through with only the model renamed to the
public route name (and the usage chunk held back until the stream is settled), so fields the
gateway does not know reach the client unchanged. From a provider of another dialect, chunks
are built from the normalized events: content, reasoning (as ``reasoning_content``), refusals,
and tool calls, each call's first chunk with an id and type as the SDKs require (the other
dialect's call id is not in the events, so one is made per call). Billed pieces with no text
(encrypted thinking, a provider's fields the gateway does not model) were counted and are not
shown.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from hardcap_core import sse
from hardcap_core.chat import ChatRequest
from hardcap_core.errors import GatewayError
from hardcap_core.events import Completion, Event, FinishReason, Output, OutputKind
from hardcap_core.ledger import BudgetState, RateState
from hardcap_core.wire.base import Charged
from hardcap_core.wire.headers import budget_headers
from hardcap_core.wire.openai_request import DIALECT, parse_chat_request

# Where each kind of output goes in a delta built from normalized events.
DELTA_FIELD = {
    OutputKind.CONTENT: "content",
    OutputKind.REASONING: "reasoning_content",
    OutputKind.REFUSAL: "refusal",
    OutputKind.OTHER: "content",
}
TOOL_KINDS = (OutputKind.TOOL_NAME, OutputKind.TOOL_ARGUMENTS)


class OpenAIChat:
    dialect = DIALECT

    def parse(self, raw: bytes) -> ChatRequest:
        return parse_chat_request(raw)

    def encoder(self, request: ChatRequest, *, model: str, same_dialect: bool) -> ChunkEncoder:
        return ChunkEncoder(model, include_usage=request.include_usage, passthrough=same_dialect)

    def reply(
        self, completion: Completion, *, model: str, same_dialect: bool, charged: Charged
    ) -> dict[str, Any]:
        if same_dialect:
            body = dict(completion.raw, model=model)
            choices = body.get("choices")
            # A provider's `choices: [null]` or `usage: 5` would fail the SDKs' types.
            body["choices"] = (
                [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []
            )
            body["usage"] = charged_usage(charged)
            return body
        message: dict[str, Any] = {"role": "assistant", "content": None}
        calls: dict[int, dict[str, Any]] = {}
        for out in completion.output:
            if out.kind in TOOL_KINDS:
                _add_call(calls, out, lambda: call_id())
            elif out.kind in DELTA_FIELD and out.text:
                field = DELTA_FIELD[out.kind]
                message[field] = (message.get(field) or "") + out.text
        if calls:
            message["tool_calls"] = [
                {k: v for k, v in call.items() if k != "index"} for call in calls.values()
            ]
        finish = completion.finish or FinishReason.STOP
        if finish is FinishReason.OTHER:
            finish = FinishReason.STOP
        return {
            "id": f"chatcmpl-{int(time.time() * 1000)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish.value,
                }
            ],
            "usage": charged_usage(charged, provider_fields=False),
        }

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return error_body(error)

    def budget_headers(
        self, budgets: Sequence[BudgetState], rates: Sequence[RateState], now_ms: int
    ) -> dict[str, str]:
        return budget_headers(budgets, rates, now_ms)


class ChunkEncoder:
    """``chat.completion.chunk`` events for one stream, then the closing chunks and [DONE]."""

    def __init__(self, model: str, *, include_usage: bool, passthrough: bool) -> None:
        self.model = model
        self.include_usage = include_usage
        self.passthrough = passthrough
        self.id = "chatcmpl-hardcap"
        self.created = int(time.time())
        self._seen_ids = False  # id and created come from the provider's first chunk
        self._call_ids: dict[int, str] = {}  # tool-call index -> the id made for it

    def event(self, event: Event) -> bytes | None:
        chunk = event.raw if self.passthrough else self._build(event)
        if chunk is None:
            return None
        # Usage goes out once, settled, in the closing usage chunk (if the client asked).
        chunk.pop("usage", None)
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return None
        if not all(isinstance(c, dict) for c in choices):
            # A provider's `choices: [null]`: the SDKs would fail on it; what it held is gone.
            choices = chunk["choices"] = [c for c in choices if isinstance(c, dict)]
        if not choices:
            return None  # a usage-only chunk: the client gets the settled usage at the end
        chunk["model"] = self.model
        if not self._seen_ids:
            self._seen_ids = True
            if isinstance(chunk.get("id"), str):
                self.id = chunk["id"]
            if isinstance(chunk.get("created"), int):
                self.created = chunk["created"]
        return sse.encode(chunk)

    def close(self, *, for_length: bool, charged: Charged) -> bytes:
        out = b""
        if for_length:
            out += sse.encode(self._chunk([{"index": 0, "delta": {}, "finish_reason": "length"}]))
        if self.include_usage:
            usage = charged_usage(charged, provider_fields=self.passthrough)
            usage["hardcap"] = charged.extension()  # what the ledger charged, cost included
            out += sse.encode({**self._chunk([]), "usage": usage})
        return out + sse.encode(sse.DONE)

    def error(self, error: GatewayError) -> bytes:
        return sse.encode(error_body(error))

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _build(self, event: Event) -> dict[str, Any] | None:
        """A chunk from a normalized event (a provider of another dialect)."""
        delta: dict[str, Any] = {}
        calls: dict[int, dict[str, Any]] = {}
        for out in event.output:
            if out.kind in TOOL_KINDS:
                index = out.tool_call or 0
                if index in self._call_ids:
                    _add_call(calls, out, lambda: "")
                else:
                    self._call_ids[index] = _add_call(calls, out, call_id)
            elif out.kind in DELTA_FIELD and out.text:
                field = DELTA_FIELD[out.kind]
                delta[field] = delta.get(field, "") + out.text
        if calls:
            delta["tool_calls"] = [
                {k: v for k, v in call.items() if v != ""} for call in calls.values()
            ]
        if not delta and event.finish is None:
            return None
        finish = event.finish
        if finish is FinishReason.OTHER:
            finish = FinishReason.STOP  # OpenAI's SDKs accept only their own reasons
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return self._chunk([choice])


def call_id() -> str:
    """An id for a tool call whose provider's id is not in the events, unique across turns
    (a client sends it back with the call's result)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def _add_call(calls: dict[int, dict[str, Any]], out: Output, new_id: Any) -> str:
    """Add a tool call's name or arguments piece to ``calls`` (by its index); a call seen for
    the first time gets ``new_id()`` as its id, and its type. Returns the call's id."""
    index = out.tool_call or 0
    if index not in calls:
        made = new_id()
        calls[index] = {"index": index, "id": made, "type": "function", "function": {}}
    fn = calls[index]["function"]
    key = "name" if out.kind is OutputKind.TOOL_NAME else "arguments"
    fn[key] = fn.get(key, "") + out.text
    if "arguments" not in fn and calls[index]["id"]:
        fn["arguments"] = ""  # the SDKs build a call's arguments by appending to a string
    return str(calls[index]["id"])


def error_body(error: GatewayError) -> dict[str, Any]:
    """OpenAI's error shape, which the official SDKs map to their exception classes."""
    return {
        "error": {
            "message": error.message,
            "type": error.type,
            "code": error.code,
            "param": error.param,
        }
    }


def charged_usage(charged: Charged, *, provider_fields: bool = True) -> dict[str, Any]:
    """The usage object the client sees: the counts the ledger charged (the provider's report
    when it made one the gateway believes), with the provider's details alongside; from a
    provider of another dialect (``provider_fields`` false), OpenAI's own details instead."""
    usage: dict[str, Any] = {}
    reported = charged.provider_usage
    if reported is not None and reported.raw is not None and provider_fields:
        usage = dict(reported.raw)
    elif reported is not None:
        if reported.cached_input_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": reported.cached_input_tokens}
        if reported.reasoning_tokens is not None:
            details = {"reasoning_tokens": reported.reasoning_tokens}
            usage["completion_tokens_details"] = details
    usage["prompt_tokens"] = charged.input_tokens
    usage["completion_tokens"] = charged.output_tokens
    usage["total_tokens"] = charged.input_tokens + charged.output_tokens
    return usage
