"""What the mock upstream's Anthropic mode (`mock_anthropic`) sends for a `Plan`: Messages API
SSE events and whole `message` bodies, each billed token counted into the ground truth as it
is handed to the server.

A stream is `message_start` (input usage and, as Anthropic sends it, `output_tokens: 1`),
then per content block `content_block_start`, its deltas and `content_block_stop` (a `ping`
after the first block starts, as Anthropic sends one), then `message_delta` (stop_reason,
cumulative output_tokens) and `message_stop`. A thinking block streams `thinking_delta` per
billed thinking token (with `Plan.summarize`, a summary: one per that many billed, the last
always, as Claude 4 models stream it) and ends with an unbilled `signature_delta`; `stall_after`
steps in, the stream stalls until the client leaves; a tool_use block brings
its name at `content_block_start` (unbilled, as Anthropic counts a call's input) and its
input as `input_json_delta` fragments.

Web search (a `web_search_*` server tool in the request, `Searches`): before the reply, per
search a `server_tool_use` block (its query one billed output token, as `input_json_delta`)
and a `web_search_tool_result` block; each search's results are billed as input
(`Searches.result_tokens`), reported with the final usage (`message_delta`, where Anthropic
reports the input of every sampling turn) beside `server_tool_use.web_search_requests`.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from hardcap_core.local.mock_faults import HANG_LIMIT_S
from hardcap_core.local.mock_plan import ERROR_OBJECT, NOT_JSON, Plan, lie_about
from hardcap_core.local.mock_replies import MockAbort
from hardcap_core.local.mock_truth import Account

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
}
# Anthropic-mode malformed kinds: an `error` event mid-stream, or data that is not JSON.
ANTHROPIC_MALFORMED = frozenset({ERROR_OBJECT, NOT_JSON})


@dataclass(frozen=True, slots=True)
class Searches:
    """The web searches one reply makes: ``count`` run (no more than the request's
    ``max_uses``), ``reported`` in ``usage.server_tool_use.web_search_requests`` (more than
    run: a misbehaving upstream), each adding ``result_tokens`` of input. ``offered``: the
    request had a web search tool (usage then reports the count, 0 too)."""

    offered: bool = False
    count: int = 0
    reported: int = 0
    result_tokens: int = 0


NO_SEARCHES = Searches()


def signature(text: str) -> str:
    """A stand-in for the signature that authenticates a thinking block (base64, as real)."""
    return base64.b64encode(hashlib.sha256(text.encode()).digest() * 4).decode()


def usage(
    plan: Plan, output_tokens: int, hour_prefix: int = 0, searches: Searches = NO_SEARCHES
) -> dict[str, Any]:
    """Anthropic's usage: `input_tokens` are the prompt tokens neither read from nor written
    to the cache; the three add up to the whole prompt. The cache holds a prefix: the first
    `cache_read` tokens are read, the next `cache_write` written; of those written, the ones
    within the first `hour_prefix` tokens (through the last block marked `ttl: "1h"`) are
    kept an hour, billed 2x input against 1.25x, and `cache_creation` says how many."""
    read = min(plan.cache_read, plan.prompt_tokens)
    written = min(plan.cache_write, plan.prompt_tokens - read)
    out: dict[str, Any] = {
        "input_tokens": plan.prompt_tokens - read - written,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
        "output_tokens": output_tokens,
    }
    if written:
        hour = max(0, min(read + written, hour_prefix) - read)
        out["cache_creation"] = {
            "ephemeral_5m_input_tokens": written - hour,
            "ephemeral_1h_input_tokens": hour,
        }
    if searches.offered:
        out["server_tool_use"] = {"web_search_requests": searches.reported}
    lie_about(plan, out, input_key="input_tokens", output_key="output_tokens")
    return out


def _blocks(plan: Plan) -> list[tuple[str, list[str]]]:
    blocks: list[tuple[str, list[str]]] = []
    if plan.reasoning:
        blocks.append(("thinking", plan.reasoning))
    if plan.content or not blocks:
        blocks.append(("text" if plan.tool_name is None else "tool_use", plan.content))
    return blocks


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()


def _search_blocks(searches: Searches, start: int) -> list[tuple[dict[str, Any], str]]:
    """Per search, a server_tool_use block (with its query) and its result block."""
    out: list[tuple[dict[str, Any], str]] = []
    for n in range(searches.count):
        call_id = f"srvtoolu_{uuid.uuid4().hex[:24]}"
        use = {"type": "server_tool_use", "id": call_id, "name": "web_search", "input": {}}
        result = {
            "type": "web_search_tool_result",
            "tool_use_id": call_id,
            "content": [
                {"type": "web_search_result", "url": f"https://example.com/{start + n}",
                 "title": "Example", "encrypted_content": _sealed(searches.result_tokens),
                 "page_age": None}
            ],
        }  # fmt: skip
        out += [(use, json.dumps({"query": f"q{n}"})), (result, "")]
    return out


def _sealed(tokens: int) -> str:
    """Encrypted result content about as long as Anthropic's for ``tokens`` of input: opaque
    base64, some 4 characters a token."""
    return base64.b64encode(hashlib.sha256(str(tokens).encode()).digest() * (tokens // 10 + 1))[
        : tokens * 4
    ].decode()


async def stream_messages(
    model: str,
    plan: Plan,
    account: Account,
    first_token_ms: float,
    hour_prefix: int = 0,
    searches: Searches = NO_SEARCHES,
) -> AsyncGenerator[bytes, None]:
    """The SSE events of one streamed message; counts each billed token into `account`
    (`hour_prefix`: see `usage`; `searches`: the web searches it makes first)."""
    message: dict[str, Any] = {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        # Anthropic's message_start counts one output token before any is streamed (its
        # streaming guide's example says `"output_tokens": 1`); message_delta's cumulative
        # count replaces it, so the ground truth, counted per streamed token, does not.
        # The first sampling turn's input: the results of its searches come in later ones.
        "usage": usage(
            dataclasses.replace(
                plan, prompt_tokens=plan.prompt_tokens - searches.count * searches.result_tokens
            ),
            1,
            hour_prefix,
        ),
    }
    total = sum(len(pieces) for _, pieces in _blocks(plan))
    server = _search_blocks(searches, 0)
    die, eof = (None if n is None else min(n, total) for n in (plan.die_after, plan.eof_after))
    bad_at = min(plan.malformed_at, total) if plan.malformed is not None else None
    started = time.monotonic() + first_token_ms / 1000
    finished = False
    step = 0
    try:
        await asyncio.sleep(first_token_ms / 1000)
        yield _event("message_start", {"type": "message_start", "message": message})
        for index, (block, query) in enumerate(server):
            start = {"type": "content_block_start", "index": index, "content_block": block}
            yield _event("content_block_start", start)
            if query:  # the query is output the model wrote: billed
                account.add_tokens(1)
                step += 1
                written = {"type": "input_json_delta", "partial_json": query}
                yield _event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": written},
                )
            yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
        searched = step
        for index, (kind, pieces) in enumerate(_blocks(plan), start=len(server)):
            yield _event("content_block_start", _block_start(index, kind, plan))
            if index == 0:
                yield _event("ping", {"type": "ping"})
            for n, piece in enumerate([*pieces, None]):
                at = step - searched  # the directives count the reply's own steps
                if at == bad_at:
                    bad_at = None
                    yield _bad_event(plan)
                    if plan.malformed == ERROR_OBJECT:
                        return  # the provider failed: it stops, and ends the body
                if at == die:
                    raise MockAbort
                if at == eof:
                    return
                if at == plan.stall_after:
                    await asyncio.sleep(HANG_LIMIT_S)  # stalled: nothing until the client leaves
                    return
                if piece is None:
                    break
                await asyncio.sleep(max(0.0, started + at * plan.pace_ms / 1000 - time.monotonic()))
                account.add_tokens(1)
                step += 1
                if kind != "thinking" or _shown(n, len(pieces), plan.summarize):
                    yield _event("content_block_delta", _delta(index, kind, piece))
            if kind == "thinking":
                sig = {"type": "signature_delta", "signature": signature("".join(pieces))}
                yield _event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": sig},
                )
            yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
        delta = {"stop_reason": STOP_REASONS[plan.finish_reason], "stop_sequence": None}
        final: dict[str, Any] = {"output_tokens": step}
        if searches.offered:  # every sampling turn's input, and the searches billed
            final = usage(plan, step, hour_prefix, searches)
        lie_about(plan, final, input_key="input_tokens", output_key="output_tokens")
        closing = {"type": "message_delta", "delta": delta, "usage": final}
        yield _event("message_delta", closing)
        yield _event("message_stop", {"type": "message_stop"})
        finished = True
    finally:
        account.close(finished)


def _shown(n: int, count: int, every: int) -> bool:
    """Whether thinking token ``n`` of ``count`` is streamed when one in ``every`` is (a
    summary: the last always is, so the shortest thinking shows something)."""
    return n % every == every - 1 or n == count - 1


def _block_start(index: int, kind: str, plan: Plan) -> dict[str, Any]:
    block: dict[str, Any]
    if kind == "thinking":
        block = {"type": "thinking", "thinking": "", "signature": ""}
    elif kind == "tool_use":
        block = {"type": "tool_use", "id": _tool_id(), "name": plan.tool_name, "input": {}}
    else:
        block = {"type": "text", "text": ""}
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, kind: str, piece: str) -> dict[str, Any]:
    delta = {
        "thinking": {"type": "thinking_delta", "thinking": piece},
        "tool_use": {"type": "input_json_delta", "partial_json": piece},
        "text": {"type": "text_delta", "text": piece},
    }[kind]
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _bad_event(plan: Plan) -> bytes:
    if plan.malformed == ERROR_OBJECT:
        error = {"type": "overloaded_error", "message": "Overloaded"}
        return _event("error", {"type": "error", "error": error})
    return b"event: content_block_delta\ndata: this is not json {\n\n"


def _tool_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def message_body(
    model: str, plan: Plan, hour_prefix: int = 0, searches: Searches = NO_SEARCHES
) -> dict[str, Any]:
    """A whole (non-streamed) `message` (`hour_prefix`: see `usage`; `searches` made first,
    each query one billed output token)."""
    content: list[dict[str, Any]] = []
    for block, query in _search_blocks(searches, 0):
        content.append({**block, "input": json.loads(query)} if query else block)
    for kind, pieces in _blocks(plan):
        text = "".join(pieces)
        if kind == "thinking":
            every = plan.summarize
            shown = "".join(p for n, p in enumerate(pieces) if _shown(n, len(pieces), every))
            content.append({"type": "thinking", "thinking": shown, "signature": signature(text)})
        elif kind == "tool_use":
            try:
                arguments = json.loads(text)
            except ValueError:
                arguments = {}  # cut by max_tokens mid-object
            content.append(
                {"type": "tool_use", "id": _tool_id(), "name": plan.tool_name, "input": arguments}
            )
        else:
            content.append({"type": "text", "text": text})
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": STOP_REASONS[plan.finish_reason],
        "stop_sequence": None,
        "usage": usage(plan, plan.completion_tokens + searches.count, hour_prefix, searches),
    }
