"""The mock upstream's Anthropic mode: `POST /v1/messages` (streamed or not) and
`POST /v1/messages/count_tokens`, speaking Anthropic's Messages API.

Like the real API it requires a key, in `x-api-key` (or `Authorization: Bearer`, which the
`anthropic` SDK 2.x sends; 401 without either), and `anthropic-version` (400 without),
rejects fields the API does not have (so a provider that leaks OpenAI fields is caught),
requires `max_tokens`, and answers errors as `{"type": "error", "error": {"type",
"message"}}` (529 `overloaded_error` among them). One liberty: `metadata.hardcap_bench_id`
is accepted next to `user_id` and gives the request its own ground-truth record, as in the
OpenAI mode (the real API would reject it; the gateway's provider never sends it).

What it was sent: `GET /mock/anthropic/received`, the last `RECEIVED` Messages requests (path,
`anthropic-beta` header, body), oldest first, for tests that a gateway forwards them unchanged.

Tenant: `metadata.user_id`, else "anonymous". The same ground truth as the OpenAI mode.

The prompt is billed as Anthropic bills it, with cl100k_base standing in for Claude's own
tokenizer (`anthropic_prompt_tokens`): the system prompt, every message's blocks (text,
tool_use name and input, tool_result content, thinking text, documents), images by
Anthropic's rule (width x height / 750 after scaling to fit 1568 px and 1.23 megapixels, at
most 1,640; 1,640 when the size cannot be read; Claude Opus 4.7 and later 2,576 px, 3.75
megapixels, 4,784: :func:`image_limits`), a base64 PDF document as its PDF support page says
(each page's extracted text, and an image of the page, rendered as `mock_billing` does and
billed by the model's image rule; a PDF it cannot read is refused, as the API refuses it), each
tool's
definition and, with tools, the tool-use system prompt Anthropic adds
(:data:`TOOL_SYSTEM_TOKENS`). `count_tokens` answers the
same bill. Usage reports it split: `cache_read_input_tokens` and `cache_creation_input_tokens`
by `[mock:cache_read=N]` and `[mock:cache_write=N]`, or without them by its prompt cache
(`mock_cache`: prefixes up to each `cache_control` mark, read when sent again unchanged), the
rest as `input_tokens`; the writes
split again in `cache_creation` by how long they are kept, as Anthropic reports them: those
within the blocks up to the last one marked `cache_control: {"ttl": "1h"}` are kept an hour
(billed 2x input, against 1.25x for the default 5 minutes; `hour_prefix`).

Directives work as in the OpenAI mode (`mock_upstream`): tokens, pace_ms, thinking (thinking
blocks streamed as thinking_delta; a `thinking` parameter of type "enabled" draws their
length when no directive says), tool_use, ignore_cap, die_after, eof_after, status,
retry_after, hang, cache_read, cache_write, and malformed=3 (an `error` event, then the body
ends) or 5 (data that is not JSON); faults from `POST /mock/fault` too. Its own: summarize=N
(thinking streamed as a summary, one token in N, billed in full, as Claude 4 models do) and
stall_after=N (nothing more after N steps until the client leaves). `max_tokens` caps
thinking and output together: stop_reason "max_tokens"; `thinking.budget_tokens` caps the
thinking, as it caps the full thinking of Claude 4. Others (hidden, silent_ms, audio,
function_call, gzip, redirect, set_cookie, other malformed kinds) are refused with a 400.

Server tools: a `web_search_*` tool (its `name`, `max_uses`, domain and location options)
makes the reply search first (`mock_anthropic_replies.Searches`): `[mock:web_search=N]`
searches (default 1), never more than its `max_uses`, as the API stops there; each search's
results billed as `[mock:search_tokens=N]` input tokens (default `SEARCH_RESULT_TOKENS`), and
the count reported in `usage.server_tool_use.web_search_requests`. `[mock:overreport=N]`
misbehaves: it reports N more searches than it ran (past `max_uses`). A `web_fetch_*` tool
is accepted (fetches nothing). Other server tools are refused, as a gateway must not send them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hardcap_core.local.mock_anthropic_replies import (
    ANTHROPIC_MALFORMED,
    NO_SEARCHES,
    Searches,
    message_body,
    stream_messages,
)
from hardcap_core.local.mock_billing import pdf_pages, text_tokens, value_tokens
from hardcap_core.local.mock_cache import PromptCache
from hardcap_core.local.mock_faults import Faults, apply_fault, hang, retry_headers
from hardcap_core.local.mock_plan import ChatRequest, Plan
from hardcap_core.local.mock_replies import CuttableStreamingResponse, dropped
from hardcap_core.local.mock_truth import Account, GroundTruth
from hardcap_core.tokenize.images import CLAUDE_HIGH_RES, rules_for
from hardcap_core.wire.media import base64_bytes, image_size

TOOL_SYSTEM_TOKENS = 346  # Anthropic's tool-use system prompt (tool_choice auto or none)
TOKENS_PER_MESSAGE = 3
# The vision docs' "~1.15 megapixels, ~1,600 tokens", read as their table of the largest images
# not resized reads it: 784 x 1,568 (1:2) is among them, 1,229,312 pixels, 1,640 tokens.
IMAGE_MAX_TOKENS = 1_640
IMAGE_LONG_EDGE = 1_568
IMAGE_MAX_PIXELS = 1_229_312
# Claude Opus 4.7 and later take larger images (Anthropic's vision docs): 2,576 px on the long
# edge, ~3.75 megapixels, 4,784 tokens at most.
HIGH_RES = (2_576, 3_750_000, 4_784)
Limits = tuple[int, int, int]  # long edge, pixels, tokens
DEFAULT_LIMITS: Limits = (IMAGE_LONG_EDGE, IMAGE_MAX_PIXELS, IMAGE_MAX_TOKENS)


def image_limits(model: Any) -> Limits:
    """The image limits ``model`` bills by: the larger images of a Claude the gateway's table
    names as Opus 4.7 or later (hardcap_core/tokenize/images.py); Claude up to 4.6's for any
    other name, as the mock always billed."""
    rules = rules_for(model if isinstance(model, str) else "", "anthropic")
    return HIGH_RES if rules == (CLAUDE_HIGH_RES,) else DEFAULT_LIMITS


FIELDS = frozenset(
    {
        "model", "messages", "max_tokens", "system", "stream", "stop_sequences", "temperature",
        "top_p", "top_k", "tools", "tool_choice", "metadata", "thinking", "service_tier",
        "context_management", "output_config", "cache_control", "speed", "inference_geo",
        "diagnostics", "fallback_credit_token",
    }
)  # fmt: skip
BLOCKS = frozenset(
    {"text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking", "document",
     "search_result", "tool_addition", "tool_removal"}
)  # fmt: skip
ROLES = ("user", "assistant", "system")  # system mid-conversation: a 2026 beta Claude Code uses
TOOL_FIELDS = frozenset(
    {"name", "description", "input_schema", "cache_control", "type", "strict", "defer_loading",
     "input_examples", "eager_input_streaming"}
)  # fmt: skip
SERVER_TOOL_FIELDS = frozenset(
    {"type", "name", "max_uses", "allowed_domains", "blocked_domains", "user_location",
     "cache_control", "max_content_tokens", "citations", "defer_loading", "allowed_callers"}
)  # fmt: skip
SERVER_TOOL_TYPES = ("web_search_", "web_fetch_")
SEARCH_RESULT_TOKENS = 400  # input a search's results add (the mock's; real ones vary)
RECEIVED = 16  # the last requests `GET /mock/anthropic/received` shows
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
UNSUPPORTED = ("hidden", "silent_ms", "audio", "function_call", "gzip", "redirect", "set_cookie")

Planner = Callable[[ChatRequest], Plan]


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """Anthropic's error body."""
    kind = ERROR_TYPES.get(status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


class Invalid(ValueError):
    """A request the real API would refuse with this status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def check(headers: Mapping[str, str], body: Any, *, count_only: bool = False) -> None:
    """Refuse what the Messages API refuses (the parts a provider could get wrong)."""
    bearer = headers.get("authorization", "").removeprefix("Bearer ").strip()
    if not headers.get("x-api-key") and not bearer:
        raise Invalid("x-api-key header is required", 401)
    if not headers.get("anthropic-version"):
        raise Invalid("anthropic-version: header is required")
    if not isinstance(body, dict):
        raise Invalid("the body must be a JSON object")
    extra = set(body) - FIELDS
    if extra:
        raise Invalid(f"{sorted(extra)[0]}: Extra inputs are not permitted")
    if not isinstance(body.get("model"), str):
        raise Invalid("model: Field required")
    if not count_only:
        cap = body.get("max_tokens")
        if type(cap) is not int or cap < 1:
            raise Invalid("max_tokens: Field required (an integer >= 1)")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Invalid("messages: at least one message is required")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise Invalid(f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'")
        content = message.get("content")
        if isinstance(content, list):
            for j, block in enumerate(content):
                _check_block(block, f"messages.{i}.content.{j}")
        elif not isinstance(content, str):
            raise Invalid(f"messages.{i}.content: a string or a list of blocks")
    _check_options(body)


def _check_block(block: Any, where: str) -> None:
    if not isinstance(block, dict) or block.get("type") not in BLOCKS:
        raise Invalid(f"{where}.type: one of {sorted(BLOCKS)}")
    if block["type"] == "image":
        source = block.get("source")
        source = source if isinstance(source, dict) else {}
        if source.get("type") == "base64":
            if source.get("media_type") not in IMAGE_TYPES or not source.get("data"):
                raise Invalid(f"{where}.source: a base64 image needs media_type and data")
        elif source.get("type") != "url" or not isinstance(source.get("url"), str):
            raise Invalid(f"{where}.source: type 'base64' or 'url'")
    if block["type"] == "document" and _pdf(block) is None:
        source = block.get("source")
        if isinstance(source, dict) and source.get("type") == "base64":
            raise Invalid(f"{where}.source: The PDF specified was not valid.")
    if block["type"] == "tool_use" and not (block.get("id") and block.get("name")):
        raise Invalid(f"{where}: tool_use needs id and name")
    if block["type"] == "tool_result" and not block.get("tool_use_id"):
        raise Invalid(f"{where}: tool_result needs tool_use_id")


def _check_options(body: dict[str, Any]) -> None:
    for i, tool in enumerate(body.get("tools") or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind.startswith(SERVER_TOOL_TYPES):
            if not tool.get("name") or set(tool) - SERVER_TOOL_FIELDS:
                raise Invalid(f"tools.{i}: a server tool needs a name, and no other fields")
            uses = tool.get("max_uses")
            if uses is not None and (type(uses) is not int or uses < 1):
                raise Invalid(f"tools.{i}.max_uses: an integer >= 1")
            continue
        if kind not in (None, "custom"):
            raise Invalid(f"tools.{i}.type: {kind!r} is not a tool this mock runs")
        if not isinstance(tool, dict) or not tool.get("name") or "input_schema" not in tool:
            raise Invalid(f"tools.{i}: a tool needs name and input_schema")
        if set(tool) - TOOL_FIELDS:
            raise Invalid(f"tools.{i}: Extra inputs are not permitted")
    choice = body.get("tool_choice")
    if choice is not None:
        choice = choice if isinstance(choice, dict) else {}
        kind = choice.get("type")
        if kind not in ("auto", "any", "tool", "none") or (
            kind == "tool" and not choice.get("name")
        ):
            raise Invalid("tool_choice: type auto, any, none, or tool with a name")
    stop = body.get("stop_sequences")
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise Invalid("stop_sequences: a list of strings")
    temperature = body.get("temperature")
    if temperature is not None and not 0 <= temperature <= 1:
        raise Invalid("temperature: must be between 0 and 1")
    metadata = body.get("metadata")
    if metadata is not None and (
        not isinstance(metadata, dict) or set(metadata) - {"user_id", "hardcap_bench_id"}
    ):
        raise Invalid("metadata: only user_id is permitted")
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        cap = body.get("max_tokens") or math.inf
        if type(budget) is not int or budget < 1024 or budget >= cap:
            raise Invalid("thinking.budget_tokens: must be >= 1024 and less than max_tokens")


def anthropic_prompt_tokens(body: Mapping[str, Any]) -> int:
    """The input tokens Anthropic bills for a Messages ``body`` (see the module docstring)."""
    limits = image_limits(body.get("model"))
    total = _content_tokens(body.get("system"), limits)
    for message in body.get("messages") or ():
        total += TOKENS_PER_MESSAGE + _content_tokens(message.get("content"), limits)
    tools = body.get("tools") or []
    if tools:
        total += TOOL_SYSTEM_TOKENS + sum(value_tokens(tool) for tool in tools)
        total += value_tokens(body.get("tool_choice"))
    return total


def cache_blocks(body: Mapping[str, Any]) -> list[tuple[Any, int]]:
    """A prompt's blocks in the order Anthropic caches it (the tool-use system prompt, tools,
    system, each message's role and blocks), each with its prompt tokens."""
    tools = body.get("tools") or []
    blocks: list[tuple[Any, int]] = []
    if tools:  # counted ahead of the tools, as the mock has always counted it
        choice = body.get("tool_choice")
        blocks.append(({"tool_choice": choice}, TOOL_SYSTEM_TOKENS + value_tokens(choice)))
    blocks += [(tool, value_tokens(tool)) for tool in tools]
    system, limits = body.get("system"), image_limits(body.get("model"))
    blocks += [(b, _content_tokens([b], limits)) for b in _listed(system)]
    for message in body.get("messages") or ():
        parts = _listed(message.get("content"))
        role = {"role": message.get("role")}
        blocks += [(role, TOKENS_PER_MESSAGE), *((b, _content_tokens([b], limits)) for b in parts)]
    return blocks


def hour_prefix(body: Mapping[str, Any]) -> int:
    """The prompt tokens through the last block marked to be cached an hour (`cache_control`
    with `ttl: "1h"`), in the order Anthropic caches a prompt: tools, system, messages."""
    end = marked = 0
    for block, tokens in cache_blocks(body):
        end += tokens
        mark = block.get("cache_control") if isinstance(block, dict) else None
        if isinstance(mark, dict) and mark.get("ttl") == "1h":
            marked = end
    return marked


def _listed(content: Any) -> list[Any]:
    return content if isinstance(content, list) else [content]


def _content_tokens(content: Any, limits: Limits = DEFAULT_LIMITS) -> int:
    if not isinstance(content, list):
        return value_tokens(content)
    total = 0
    for block in content:
        if not isinstance(block, dict):
            total += value_tokens(block)
        elif block.get("type") == "image":
            total += image_tokens(block.get("source"), limits)
        elif block.get("type") == "tool_result":
            total += _content_tokens(block.get("content"), limits)
        elif block.get("type") == "document" and (pages := _pdf(block)) is not None:
            total += sum(text_tokens(text) + _size_tokens(size, limits) for text, size in pages)
            total += value_tokens(block.get("title")) + value_tokens(block.get("context"))
        else:
            total += sum(
                _content_tokens(v, limits) if k == "content" else value_tokens(v)
                for k, v in block.items()
                if k not in ("type", "id", "tool_use_id", "cache_control", "signature")
            )
    return total


def _pdf(block: dict[str, Any]) -> tuple[tuple[str, tuple[int, int]], ...] | None:
    """The pages of a document block's base64 PDF (see `mock_billing.pdf_pages`)."""
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64":
        return None
    return pdf_pages(base64_bytes(str(source.get("data", ""))))


def image_tokens(source: Any, limits: Limits = DEFAULT_LIMITS) -> int:
    """Anthropic's image rule: (w x h) / 750 after scaling down to fit the model's ``limits``,
    at most its largest image (1,640 tokens; 4,784 from Claude Opus 4.7)."""
    size = None
    if isinstance(source, dict) and source.get("type") == "base64":
        size = image_size(base64_bytes(str(source.get("data", "")), 64 * 1024))
    return _size_tokens(size, limits)


def page_image_tokens(size: tuple[int, int] | None, limits: Limits = DEFAULT_LIMITS) -> int:
    """What an image of ``size`` pixels (None: unknown) is billed: width x height / 750 after
    fitting the model's ``limits`` (a PDF page's image is billed so too)."""
    return _size_tokens(size, limits)


def _size_tokens(size: tuple[int, int] | None, limits: Limits = DEFAULT_LIMITS) -> int:
    long_edge, max_pixels, max_tokens = limits
    if size is None:
        return max_tokens
    width, height = size
    scale = min(1.0, long_edge / max(width, height))
    scale = min(scale, math.sqrt(max_pixels / (width * height)))
    tokens = math.ceil(width * scale * height * scale / 750)
    return max(1, min(tokens, max_tokens))


def planning_request(body: dict[str, Any]) -> ChatRequest:
    """The OpenAI-shaped request the mock's planner reads: the same messages, cap, tools and
    tool choice, the tenant as `user`."""
    tools = [
        {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
        for t in body.get("tools") or []
        if "input_schema" in t  # a server tool is not the model's to call as a function
    ]
    choice: Any = None
    spec = body.get("tool_choice")
    if isinstance(spec, dict):
        named = {"type": "function", "function": {"name": spec.get("name")}}
        choice = {"auto": "auto", "any": "required", "none": "none"}.get(spec["type"], named)
    thinking = body.get("thinking")
    thinks = isinstance(thinking, dict) and thinking.get("type") == "enabled"
    metadata = body.get("metadata") or {}
    return ChatRequest(
        model=body["model"],
        messages=body["messages"],
        max_tokens=body.get("max_tokens"),
        stream=bool(body.get("stream")),
        tools=tools or None,
        tool_choice=choice,
        user=metadata.get("user_id") or None,
        metadata=metadata,
        reasoning_effort="high" if thinks else None,
    )


def searches(body: Mapping[str, Any], text: str) -> Searches:
    """The web searches a reply to ``body`` makes (``text``: where the directives are)."""
    tool = next(
        (t for t in body.get("tools") or [] if str(t.get("type", "")).startswith("web_search_")),
        None,
    )
    if tool is None:
        return NO_SEARCHES
    knobs = {name: int(float(v)) for name, v in re.findall(r"\[mock:([a-z_]+)=([0-9.]+)\]", text)}
    count = knobs.get("web_search", 1)
    if tool.get("max_uses") is not None:
        count = min(count, tool["max_uses"])  # the API stops searching at max_uses
    tokens = knobs.get("search_tokens", SEARCH_RESULT_TOKENS)
    return Searches(True, count, count + knobs.get("overreport", 0), tokens)


def anthropic_routes(
    truth: GroundTruth,
    faults: Faults,
    planner: Planner,
    first_token_ms: float,
    cache: PromptCache | None = None,
) -> list[Route]:
    """The Anthropic mode's routes, sharing the OpenAI mode's ground truth, faults and planner."""
    received: deque[dict[str, Any]] = deque(maxlen=RECEIVED)

    async def messages(request: Request) -> Response:
        try:
            body = await request.json()
            beta = request.headers.get("anthropic-beta")
            received.append({"path": request.url.path, "anthropic_beta": beta, "body": body})
            check(request.headers, body)
            req = planning_request(body)
            plan = _plan(planner, req, body)
            search = searches(body, req.last_user_text())
            # Its results are input of the sampling turns after each search: billed as such.
            plan = dataclasses.replace(
                plan, prompt_tokens=plan.prompt_tokens + search.count * search.result_tokens
            )
            if cache is not None and not (plan.cache_read or plan.cache_write):
                use = cache.use(cache_blocks(body), mark_last=body.get("cache_control") is not None)
                if use is not None:
                    plan = dataclasses.replace(plan, cache_read=use.read, cache_write=use.written)
        except Invalid as exc:
            return error(exc.status, str(exc))
        except ValueError as exc:
            return error(400, str(exc))
        plan = apply_fault(plan, faults.active())
        request_id = (req.metadata or {}).get("hardcap_bench_id")
        refused = plan.hang or plan.status >= 400
        account = truth.receive(req.tenant(), plan.prompt_tokens, request_id, refused=refused)
        if account is None:
            if plan.hang:
                return await hang(request)
            message = f"injected error ([mock:status={plan.status}])"
            return error(plan.status, message, retry_headers(plan.retry_after))
        hour = hour_prefix(body)
        if req.stream:
            events = stream_messages(req.model, plan, account, first_token_ms, hour, search)
            return CuttableStreamingResponse(events, account)
        return await _whole(req.model, plan, account, first_token_ms, hour, search)

    async def count_tokens(request: Request) -> Response:
        try:
            body = await request.json()
            check(request.headers, body, count_only=True)
        except Invalid as exc:
            return error(exc.status, str(exc))
        except ValueError as exc:
            return error(400, str(exc))
        # An injected fault holds for counting too (a gateway's count_api must fall back).
        fault = faults.active()
        if fault is not None and fault.mode == "hang":
            return await hang(request)
        if fault is not None and fault.mode == "status":
            return error(fault.status, f"injected error ({fault.status})")
        return JSONResponse({"input_tokens": anthropic_prompt_tokens(body)})

    async def shown(_: Request) -> Response:
        return JSONResponse(list(received))

    return [
        Route("/mock/anthropic/received", shown, methods=["GET"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    ]


def _plan(planner: Planner, req: ChatRequest, body: dict[str, Any]) -> Plan:
    plan = planner(req)
    refused = [d for d in UNSUPPORTED if f"[mock:{d}=" in req.last_user_text()]
    if refused or (plan.malformed is not None and plan.malformed not in ANTHROPIC_MALFORMED):
        what = refused[0] if refused else f"malformed={plan.malformed}"
        raise Invalid(f"[mock:{what}] is not available in the Anthropic mode")
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and type(budget := thinking.get("budget_tokens")) is int:
        plan = dataclasses.replace(plan, reasoning=plan.reasoning[:budget])
    return dataclasses.replace(plan, prompt_tokens=anthropic_prompt_tokens(body))


async def _whole(
    model: str, plan: Plan, account: Account, first_token_ms: float, hour: int, search: Searches
) -> Response:
    finished = False
    try:
        steps = len(plan.reasoning) + len(plan.content)
        await asyncio.sleep((first_token_ms + steps * plan.pace_ms) / 1000)
        body = message_body(model, plan, hour, search)
        if plan.drop:
            events = dropped(json.dumps(body).encode(), account)
            return CuttableStreamingResponse(events, account, None, "application/json")
        account.add_tokens(plan.completion_tokens + search.count)
        finished = True
    finally:
        if not plan.drop:
            account.close(finished)
    return JSONResponse(body)
