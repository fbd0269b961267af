"""The OpenAI Responses API (``POST /v1/responses``), as a
:class:`~hardcap_core.wire.base.WireFormat`.

Served by translation: the body becomes a chat request
(:mod:`hardcap_core.wire.openai_responses_request`), and what any provider streams back, as
normalized events, becomes the Responses stream: ``response.created`` and
``response.in_progress``, then one output item per run of one kind of output — a ``reasoning``
item (its text as ``response.reasoning_summary_text.delta`` in one summary part; an Anthropic
upstream's signed thinking blocks sealed in its ``encrypted_content``), a ``message``
item (``response.content_part.added``, ``response.output_text.delta`` or
``response.refusal.delta``, their ``done`` events), a ``function_call`` item per tool call
(``response.function_call_arguments.delta``; the item is added once its name is whole) — each
closed by ``response.output_item.done``, and every event numbered by ``sequence_number``.

The stream ends with ``response.completed``, or ``response.incomplete`` with
``incomplete_details.reason`` "max_output_tokens" when the gateway cut it at the budget or the
provider stopped at the cap ("content_filter" when its filter stopped it); either carries the
usage the ledger charged, with ``usage.hardcap`` (the cost). A failure after the stream began
is an ``error`` event and ``response.failed``. Errors before it are OpenAI's error body, which
the openai SDK maps to its exception classes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from hardcap_core import json_codec
from hardcap_core.chat import ChatRequest
from hardcap_core.errors import GatewayError
from hardcap_core.events import Completion, Event, FinishReason, Output, OutputKind
from hardcap_core.ledger import BudgetState, RateState
from hardcap_core.wire.base import Charged
from hardcap_core.wire.headers import budget_headers
from hardcap_core.wire.openai_chat import error_body
from hardcap_core.wire.openai_responses_request import (
    CAP_FIELD,
    DIALECT,
    Keeper,
    ResponsesRequest,
    keeper_of,
    parse_responses_request,
    sealed_thinking,
)

TOOL_KINDS = (OutputKind.TOOL_NAME, OutputKind.TOOL_ARGUMENTS)
# Why a response is incomplete, by the finish reason that made it so.
INCOMPLETE = {
    FinishReason.LENGTH: "max_output_tokens",
    FinishReason.CONTENT_FILTER: "content_filter",
}


class OpenAIResponses:
    dialect = DIALECT

    def parse(self, raw: bytes) -> ChatRequest:
        return parse_responses_request(raw)

    def encoder(self, request: ChatRequest, *, model: str, same_dialect: bool) -> ResponseEncoder:
        return ResponseEncoder(model, _echo(request), keeper=keeper_of(request))

    def reply(
        self, completion: Completion, *, model: str, same_dialect: bool, charged: Charged
    ) -> dict[str, Any]:
        # The reply is not handed its request (WireFormat.reply), so it repeats none of it.
        return ResponseEncoder(model, {}, events=False).whole(completion, charged)

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        body = error_body(error)
        if error.param == CAP_FIELD:
            # The route's cap, checked on the chat request the body became: named as sent.
            body["error"]["param"] = "max_output_tokens"
            body["error"]["message"] = error.message.replace(
                f"'{CAP_FIELD}'", "'max_output_tokens'"
            )
        return body

    def budget_headers(
        self, budgets: Sequence[BudgetState], rates: Sequence[RateState], now_ms: int
    ) -> dict[str, str]:
        return budget_headers(budgets, rates, now_ms)


def _echo(request: ChatRequest) -> Mapping[str, Any]:
    return request.echo if isinstance(request, ResponsesRequest) else {}


class _Item:
    """The output item being streamed: its index, the item as it stands, and (a message) its
    open content part, or (a tool call) whether ``output_item.added`` went out."""

    def __init__(self, index: int, item: dict[str, Any], call: int | None = None) -> None:
        self.index = index
        self.item = item
        self.call = call  # the tool call's index in the provider's events
        self.part: dict[str, Any] | None = None  # a message's open content part
        self.added = False
        # A reasoning item's signed thinking blocks (an Anthropic upstream's), and how much of
        # its summary text the blocks so far hold.
        self.blocks: list[dict[str, Any]] = []
        self.signed = 0

    @property
    def kind(self) -> str:
        kind: str = self.item["type"]
        return kind

    @property
    def id(self) -> str:
        item_id: str = self.item["id"]
        return item_id


class ResponseEncoder:
    """The Responses stream events of one response (see the module docstring)."""

    def __init__(
        self,
        model: str,
        echo: Mapping[str, Any],
        *,
        events: bool = True,
        keeper: Keeper | None = None,
    ) -> None:
        self.model = model
        self.echo = echo
        self.keeper = keeper  # keeps the final response (store), if it is kept
        self.events = events  # False: a whole reply, which builds the items without events
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self._seq = 0
        self._started = False
        self._output: list[dict[str, Any]] = []  # the items done, in output order
        self._open: _Item | None = None
        self._finish: FinishReason | None = None
        self._reasoning_tokens = 0  # reasoning tokens that streamed, for a cut's usage

    # -- the StreamEncoder protocol -------------------------------------------------------------

    def event(self, event: Event) -> bytes | None:
        out = self._start()
        for piece in event.output:
            out += self._piece(piece, event.raw)
        if event.finish is not None:
            self._finish = event.finish
        return out or None

    def close(self, *, for_length: bool, charged: Charged) -> bytes:
        why = INCOMPLETE.get(self._finish or FinishReason.STOP)
        reason = "max_output_tokens" if for_length else why
        out = self._start()
        done, response = self._ended(reason, charged)
        kind = "response.incomplete" if reason else "response.completed"
        return out + done + self._emit({"type": kind, "response": response})

    def error(self, error: GatewayError) -> bytes:
        out = self._start() + self._close_item("incomplete")
        out += self._emit(
            {"type": "error", "code": error.code, "message": error.message, "param": error.param}
        )
        response = self._response("failed")
        response["error"] = {"code": "server_error", "message": error.message}
        return out + self._emit({"type": "response.failed", "response": response})

    # -- a whole reply --------------------------------------------------------------------------

    def whole(self, completion: Completion, charged: Charged) -> dict[str, Any]:
        """The response object of a non-streamed reply: the same items a stream would build."""
        for piece in completion.output:
            self._piece(piece, completion.raw)
        _, response = self._ended(INCOMPLETE.get(completion.finish or FinishReason.STOP), charged)
        blocks = _anthropic_thinking(completion.raw)
        reasoning = [item for item in response["output"] if item["type"] == "reasoning"]
        if blocks and reasoning:
            reasoning[0]["encrypted_content"] = sealed_thinking(blocks)
        return response

    def _ended(self, reason: str | None, charged: Charged) -> tuple[bytes, dict[str, Any]]:
        """Close the open item; the final response object, completed or (``reason``)
        incomplete, with the usage that was ``charged``."""
        out = self._close_item("incomplete" if reason else "completed")
        response = self._response("incomplete" if reason else "completed")
        response["usage"] = self._usage(charged)
        if reason:
            response["incomplete_details"] = {"reason": reason}
        else:
            response["completed_at"] = int(time.time())
        if self.keeper is not None:
            self.keeper.keep(response)  # sets `store`: false if it is too large to keep
        return out, response

    # -- output items ---------------------------------------------------------------------------

    def _piece(self, piece: Output, raw: Any) -> bytes:
        if piece.kind is OutputKind.REASONING:
            self._reasoning_tokens += piece.tokens
            if not piece.text:
                return self._signed(raw)  # encrypted or signed thinking: billed, not shown
            return self._reasoning(piece.text)
        if piece.kind in TOOL_KINDS:
            return self._tool(piece, raw)
        if not piece.text or (piece.kind is OutputKind.OTHER and piece.tool_call is not None):
            return b""  # billed but not text (audio), or a call's field the gateway does not model
        return self._text(
            "refusal" if piece.kind is OutputKind.REFUSAL else "output_text", piece.text
        )

    def _reasoning(self, text: str) -> bytes:
        out = b""
        item = self._open
        if item is None or item.kind != "reasoning":
            out += self._close_item("completed")
            item = self._add({"id": f"rs_{uuid.uuid4().hex}", "type": "reasoning", "summary": []})
            out += self._announce(item)
        if not item.item["summary"]:
            part = {"type": "summary_text", "text": ""}
            item.item["summary"].append(part)
            out += self._emit(
                {"type": "response.reasoning_summary_part.added", "item_id": item.id,
                 "output_index": item.index, "summary_index": 0, "part": dict(part)}
            )  # fmt: skip
        item.item["summary"][0]["text"] += text
        return out + self._emit(
            {"type": "response.reasoning_summary_text.delta", "item_id": item.id,
             "output_index": item.index, "summary_index": 0, "delta": text}
        )  # fmt: skip

    def _signed(self, raw: Any) -> bytes:
        """Keep an Anthropic thinking block's signature (or a redacted block), which Anthropic
        wants back with the thinking in a later turn: carried in the reasoning item's
        ``encrypted_content`` (:func:`~hardcap_core.wire.openai_responses_request.
        thinking_blocks` reads it back)."""
        if not isinstance(raw, dict):
            return b""
        delta, block = raw.get("delta"), raw.get("content_block")
        out = b""
        item = self._open
        if isinstance(delta, dict) and delta.get("type") == "signature_delta":
            signature = delta.get("signature")
            if item is None or item.kind != "reasoning" or not isinstance(signature, str):
                return b""  # a signature with no thinking before it: nothing to sign
            text = item.item["summary"][0]["text"] if item.item["summary"] else ""
            item.blocks.append(
                {"type": "thinking", "thinking": text[item.signed :], "signature": signature}
            )
            item.signed = len(text)
        elif isinstance(block, dict) and block.get("type") == "redacted_thinking":
            if item is None or item.kind != "reasoning":
                out += self._close_item("completed")
                item = self._add(
                    {"id": f"rs_{uuid.uuid4().hex}", "type": "reasoning", "summary": []}
                )
                out += self._announce(item)
            item.blocks.append({"type": "redacted_thinking", "data": block.get("data", "")})
        return out

    def _text(self, kind: str, text: str) -> bytes:
        out = b""
        item = self._open
        if item is None or item.kind != "message":
            out += self._close_item("completed")
            item = self._add(
                {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
                 "status": "in_progress", "content": []}
            )  # fmt: skip
            out += self._announce(item)
        field = "text" if kind == "output_text" else "refusal"
        if item.part is None or item.part["type"] != kind:
            out += self._close_part(item)
            item.part = {"type": kind, field: ""}
            if kind == "output_text":
                item.part.update(annotations=[], logprobs=[])
            out += self._emit(
                {"type": "response.content_part.added", "item_id": item.id,
                 "output_index": item.index, "content_index": len(item.item["content"]),
                 "part": dict(item.part)}
            )  # fmt: skip
        item.part[field] += text
        event: dict[str, Any] = {
            "type": f"response.{'output_text' if kind == 'output_text' else 'refusal'}.delta",
            "item_id": item.id, "output_index": item.index,
            "content_index": len(item.item["content"]), "delta": text,
        }  # fmt: skip
        if kind == "output_text":
            event["logprobs"] = []
        return out + self._emit(event)

    def _tool(self, piece: Output, raw: Any) -> bytes:
        out = b""
        index = piece.tool_call or 0
        item = self._open
        if item is None or item.kind != "function_call" or item.call != index:
            out += self._close_item("completed")
            call_id = _upstream_call_id(raw, index) or f"call_{uuid.uuid4().hex[:24]}"
            fields = {"id": f"fc_{uuid.uuid4().hex}", "type": "function_call",
                      "status": "in_progress", "call_id": call_id, "name": "",
                      "arguments": ""}  # fmt: skip
            item = self._add(fields, call=index)
        if piece.kind is OutputKind.TOOL_NAME:
            # The item is added once its name is whole (at the first argument, or its end); a
            # name coming after that has no place in the Responses events.
            if not item.added:
                item.item["name"] += piece.text
            return out
        if not piece.text:
            return out
        out += self._announce(item)
        item.item["arguments"] += piece.text
        return out + self._emit(
            {"type": "response.function_call_arguments.delta", "item_id": item.id,
             "output_index": item.index, "delta": piece.text}
        )  # fmt: skip

    def _add(self, fields: dict[str, Any], *, call: int | None = None) -> _Item:
        """Open a new output item (:meth:`_announce` sends its ``output_item.added``)."""
        item = _Item(len(self._output), fields, call)
        self._open = item
        return item

    def _announce(self, item: _Item) -> bytes:
        if item.added:
            return b""
        item.added = True
        added = dict(item.item)
        if item.kind == "reasoning":
            added["summary"] = []
        elif item.kind == "message":
            added["content"] = []
        return self._emit(
            {"type": "response.output_item.added", "output_index": item.index, "item": added}
        )

    def _close_part(self, item: _Item) -> bytes:
        part, item.part = item.part, None
        if part is None:
            return b""
        index = len(item.item["content"])
        item.item["content"].append(part)
        where = {"item_id": item.id, "output_index": item.index, "content_index": index}
        if part["type"] == "output_text":
            done = {
                "type": "response.output_text.done",
                **where,
                "text": part["text"],
                "logprobs": [],
            }
        else:
            done = {"type": "response.refusal.done", **where, "refusal": part["refusal"]}
        out = self._emit(done)
        return out + self._emit({"type": "response.content_part.done", **where, "part": dict(part)})

    def _close_item(self, status: str) -> bytes:
        """End the open item, if any, with ``status`` (completed or incomplete)."""
        item, self._open = self._open, None
        if item is None:
            return b""
        out = self._announce(item)  # a tool call cut before its arguments still gets its item
        if item.kind == "message":
            out += self._close_part(item)
        elif item.kind == "reasoning":
            if item.item["summary"]:
                text = item.item["summary"][0]["text"]
                where = {"item_id": item.id, "output_index": item.index, "summary_index": 0}
                out += self._emit(
                    {"type": "response.reasoning_summary_text.done", **where, "text": text}
                )
                part = {"type": "summary_text", "text": text}
                out += self._emit(
                    {"type": "response.reasoning_summary_part.done", **where, "part": part}
                )
            if item.blocks:
                item.item["encrypted_content"] = sealed_thinking(item.blocks)
        else:
            where = {"item_id": item.id, "output_index": item.index}
            args, name = item.item["arguments"], item.item["name"]
            out += self._emit(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "arguments": args,
                    "name": name,
                }
            )
        item.item["status"] = status
        self._output.append(item.item)
        return out + self._emit(
            {"type": "response.output_item.done", "output_index": item.index, "item": item.item}
        )

    # -- the response object --------------------------------------------------------------------

    def _start(self) -> bytes:
        """``response.created`` and ``response.in_progress``, once, before anything else."""
        if self._started:
            return b""
        self._started = True
        out = self._emit({"type": "response.created", "response": self._response("in_progress")})
        return out + self._emit(
            {"type": "response.in_progress", "response": self._response("in_progress")}
        )

    def _response(self, status: str) -> dict[str, Any]:
        echo = self.echo
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": echo.get("instructions"),
            "max_output_tokens": echo.get("max_output_tokens"),
            "metadata": echo.get("metadata") or {},
            "model": self.model,
            "output": [dict(item) for item in self._output],
            "parallel_tool_calls": echo.get("parallel_tool_calls", True),
            "previous_response_id": echo.get("previous_response_id"),
            "reasoning": echo.get("reasoning") or {"effort": None, "summary": None},
            "service_tier": echo.get("service_tier"),
            # Kept by the gateway (gateway/stored.py) when it has a keeper; the final response
            # says false if it was too large to keep.
            "store": self.keeper is not None,
            "temperature": echo.get("temperature"),
            "text": echo.get("text") or {"format": {"type": "text"}},
            "tool_choice": echo.get("tool_choice", "auto"),
            "tools": echo.get("tools") or [],
            "top_p": echo.get("top_p"),
            "truncation": echo.get("truncation", "disabled"),
            "usage": None,
            "user": echo.get("user"),
            "safety_identifier": echo.get("safety_identifier"),
            "prompt_cache_key": echo.get("prompt_cache_key"),
        }

    def _usage(self, charged: Charged) -> dict[str, Any]:
        """What the ledger charged, in the Responses API's usage terms, with ``hardcap``."""
        reported = charged.provider_usage
        cached = written = 0
        reasoning = min(self._reasoning_tokens, charged.output_tokens)  # what streamed, if cut
        if reported is not None:
            cached = reported.cached_input_tokens or 0
            written = reported.cache_write_input_tokens or 0
            if reported.reasoning_tokens is not None:
                reasoning = reported.reasoning_tokens
        return {
            "input_tokens": charged.input_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
            "output_tokens": charged.output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": charged.input_tokens + charged.output_tokens,
            "hardcap": charged.extension(),
        }

    def _emit(self, payload: dict[str, Any]) -> bytes:
        """One SSE event, named by its type as the API names them, numbered in order."""
        payload["sequence_number"] = self._seq
        self._seq += 1
        if not self.events:
            return b""
        kind = payload["type"]
        return f"event: {kind}\ndata: ".encode() + json_codec.dumps(payload) + b"\n\n"


def _upstream_call_id(raw: Any, index: int) -> str | None:
    """The id the provider gave tool call ``index``, so the client's ``function_call_output``
    names the id its upstream knows: an OpenAI chunk's or reply's ``tool_calls``, an Anthropic
    ``content_block_start`` or reply's ``tool_use`` block."""
    if not isinstance(raw, dict):
        return None
    try:
        if "choices" in raw:
            choice = raw["choices"][0]
            calls = (choice.get("delta") or choice.get("message") or {}).get("tool_calls") or []
            for position, call in enumerate(calls):
                if call.get("index", position) == index and isinstance(call.get("id"), str):
                    found: str = call["id"]
                    return found
        block = raw.get("content_block")
        if isinstance(block, dict) and isinstance(block.get("id"), str):
            found = block["id"]
            return found
        uses = [
            b
            for b in raw.get("content") or ()
            if isinstance(b, dict) and b.get("type") == "tool_use"
        ]
        if index < len(uses) and isinstance(uses[index].get("id"), str):
            found = uses[index]["id"]
            return found
    except (KeyError, IndexError, TypeError, AttributeError):
        pass  # not shaped as expected: the caller makes an id
    return None


def _anthropic_thinking(raw: Any) -> list[dict[str, Any]]:
    """The signed thinking blocks of an Anthropic reply (none from another provider)."""
    content = raw.get("content") if isinstance(raw, dict) else None
    return [
        b
        for b in content or ()
        if isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")
    ]
