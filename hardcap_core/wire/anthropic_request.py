"""Reading an Anthropic Messages body: validation, and its translation into OpenAI chat shape.

The :class:`~hardcap_core.chat.ChatRequest` body is OpenAI chat-completions shaped (the
lingua franca every provider reads), so a Messages request is translated here once, and the
input estimate is :func:`hardcap_core.wire.openai_input.input_tokens` on the translated body:
every field that reaches a provider counts. What Anthropic bills beyond that is added: its
tool-use system prompt (:func:`anthropic_extra_tokens`); images, and the image of each PDF page,
are counted by the route's model once the route is known (:mod:`hardcap_core.tokenize.routes`).

Which fields are accepted, and what each does to the bill, is the table in
:mod:`hardcap_core.wire.anthropic_fields`; a field it does not list, or lists as refused, is a
400 naming it, as Anthropic refuses extra inputs. Values a listed field may not take are
refused here, naming the field: server tools (web search, code execution, ...: billed per use,
not in tokens), ``context_management`` edits that bill a call of their own, ``speed: fast`` and
a pinned ``inference_geo`` (premium prices no route lists), and content a request does not
carry itself (files by id, documents by URL), whose size is on the provider.

The body as the client sent it is kept (``ChatRequest.native``): an Anthropic upstream is sent
it, with only the gateway's model, output cap, stream flag and thinking budget set
(:mod:`hardcap_core.providers.anthropic_request`), so cache marks, their TTLs and every block
kind reach it byte for byte; ``anthropic-beta`` headers go with it (:func:`with_headers`).

Translation, for the counters, the price terms and the other providers: ``system`` becomes a
system message; ``tool_result`` blocks become ``tool`` messages (with ``tool_call_id``), ahead
of the rest of their user message as OpenAI requires; ``tool_use`` blocks become an
assistant's ``tool_calls``; images become ``image_url`` parts (``data:`` URLs); a base64 PDF
becomes a ``file`` part; search results become text parts; ``tools[].input_schema`` becomes
the function's ``parameters``; ``tool_choice`` any/tool/none become required/a named
function/none; ``stop_sequences`` become ``stop``; ``metadata.user_id`` becomes ``user``. Kept
for the counters (an OpenAI-compatible upstream must drop them): the body's ``thinking``,
``output_config``, ``context_management`` and ``cache_control``, an assistant message's
``thinking_blocks``, ``cache_control`` on every part that had it, and ``top_k``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from hardcap_core.chat import ANTHROPIC_MESSAGES, ChatRequest, ServerTool
from hardcap_core.errors import InvalidRequest
from hardcap_core.wire import json_body
from hardcap_core.wire.anthropic_count import TOOL_SYSTEM_PROMPT_TOKENS, anthropic_extra_tokens
from hardcap_core.wire.anthropic_fields import (
    COUNT_FIELDS,
    LOWERING_EDITS,
    MESSAGES_FIELDS,
    PRICED_SERVER_TOOLS,
    SERVER_TOOLS,
)
from hardcap_core.wire.openai_input import input_tokens

DIALECT = ANTHROPIC_MESSAGES
# Anthropic-only fields the translated body keeps so every counter counts them.
COUNTED_EXTRAS = ("output_config", "context_management", "cache_control")
SERVICE_TIERS = ("auto", "standard_only")
BETA_HEADER = "anthropic-beta"
LONG_CONTEXT_BETA = "context-1m-"  # context-1m-2025-08-07: prompts past 200k, billed dearer
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
MIN_THINKING_BUDGET = 1024  # Anthropic's floor for thinking.budget_tokens


def parse_messages_request(raw: bytes, *, counting: bool = False) -> ChatRequest:
    """Validate a Messages body (``counting``: a count_tokens body, which has no max_tokens
    or stream) and translate it; raise :class:`InvalidRequest` naming the bad field."""
    body = json_body.loads(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    (COUNT_FIELDS if counting else MESSAGES_FIELDS).check(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string.", param="model")
    max_tokens = None if counting else _max_tokens(body.get("max_tokens"))
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean.", param="stream")

    out: dict[str, Any] = {"model": model, "messages": _system(body.get("system"))}
    out["messages"] += _messages(body.get("messages"))
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            out[name] = _number(body[name], name)
    if body.get("top_k") is not None:
        out["top_k"] = _int(body["top_k"], "top_k", least=0)
    if body.get("stop_sequences") is not None:
        out["stop"] = _strings(body["stop_sequences"], "stop_sequences")
    tools = body.get("tools")
    server: tuple[ServerTool, ...] = ()
    if tools is not None:
        tools, server = _tools(tools)
    if tools:  # OpenAI refuses an empty array
        out["tools"] = tools
    if body.get("tool_choice") is not None:
        out.update(_tool_choice(body["tool_choice"], bool(tools or server)))
    if body.get("thinking") is not None:
        out["thinking"] = _thinking(body["thinking"], max_tokens)
    user = _metadata(body.get("metadata"))
    if user is not None:
        out["user"] = user
    _check_terms(body)
    for name in COUNTED_EXTRAS:
        if body.get(name) is not None:
            out[name] = _extra(body[name], name)

    return ChatRequest(
        body=out,
        model=model,
        stream=bool(stream),
        include_usage=bool(stream),
        max_tokens=max_tokens,
        max_tokens_field="max_tokens",
        input_tokens=input_tokens(out) + anthropic_extra_tokens(out) + _server_tokens(body, out),
        dialect=DIALECT,
        native=body,
        server_tools=server,
    )


def _server_tokens(body: dict[str, Any], out: dict[str, Any]) -> int:
    """The input the server tools' definitions are billed as: their JSON, and the tool-use
    system prompt where no custom tool added it already (:func:`anthropic_extra_tokens`)."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return 0
    defined = [t for t in tools if isinstance(t, dict) and t.get("type") not in ("custom", None)]
    if not defined:
        return 0
    prompt = 0 if out.get("tools") else TOOL_SYSTEM_PROMPT_TOKENS
    return input_tokens({"server_tools": defined}) + prompt


def with_headers(chat: ChatRequest, headers: Mapping[str, str]) -> ChatRequest:
    """``chat`` with the ``anthropic-beta`` values of ``headers`` (a request of Anthropic's
    format; any other is returned as it is), for an Anthropic upstream to be sent."""
    if chat.dialect != DIALECT:
        return chat
    value = headers.get(BETA_HEADER) or ""
    betas = tuple(b.strip() for b in value.split(",") if b.strip())
    return replace(chat, betas=betas) if betas else chat


def check_betas(chat: ChatRequest, *, long_context_priced: bool) -> None:
    """Refuse a 1M-context beta on a route whose prices have no long-context tier: Anthropic
    bills a prompt past 200k tokens dearer, at a price the budget would not hold."""
    for beta in chat.betas:
        if beta.startswith(LONG_CONTEXT_BETA) and not long_context_priced:
            raise InvalidRequest(
                f"'{BETA_HEADER}: {beta}' bills long prompts at long-context prices, which "
                "this model's price table does not list (price.long_context).",
                param=BETA_HEADER,
            )


# -- top-level fields -----------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: Any, where: str, *, least: int) -> int:
    if not _is_int(value):
        raise InvalidRequest(f"'{where}' must be an integer.", param=where)
    if value < least:
        raise InvalidRequest(f"'{where}' must be at least {least}, got {value}.", param=where)
    result: int = value
    return result


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"'{where}' must be a number.", param=where)
    return float(value)


def _max_tokens(value: Any) -> int:
    if value is None:
        raise InvalidRequest(
            "'max_tokens' is required: the most output tokens the reply may have.",
            param="max_tokens",
        )
    return _int(value, "max_tokens", least=1)


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InvalidRequest(f"'{where}' must be an array of strings.", param=where)
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequest(f"'{where}' must be an object.", param=where)
    return value


def _thinking(value: Any, max_tokens: int | None) -> dict[str, Any]:
    thinking = _object(value, "thinking")
    kind = thinking.get("type")
    if not isinstance(kind, str):
        raise InvalidRequest("'thinking.type' must be a string.", param="thinking.type")
    if kind == "enabled":
        budget = _int(thinking.get("budget_tokens"), "thinking.budget_tokens", least=1)
        if budget < MIN_THINKING_BUDGET:
            raise InvalidRequest(
                f"'thinking.budget_tokens' must be at least {MIN_THINKING_BUDGET}.",
                param="thinking.budget_tokens",
            )
        if max_tokens is not None and budget >= max_tokens:
            raise InvalidRequest(
                "'max_tokens' must be greater than 'thinking.budget_tokens'.",
                param="max_tokens",
            )
    return thinking


def _metadata(value: Any) -> str | None:
    if value is None:
        return None
    metadata = _object(value, "metadata")
    for name in metadata:
        if name != "user_id":
            raise InvalidRequest(f"'metadata.{name}' is not supported.", param=f"metadata.{name}")
    user = metadata.get("user_id")
    if user is not None and not isinstance(user, str):
        raise InvalidRequest("'metadata.user_id' must be a string.", param="metadata.user_id")
    return user or None


def _check_terms(body: dict[str, Any]) -> None:
    """The values of priced fields that no route's price table can price (see the table)."""
    tier = body.get("service_tier")
    if tier is not None and tier not in SERVICE_TIERS:
        raise InvalidRequest(
            f"'service_tier' must be one of {', '.join(SERVICE_TIERS)}.", param="service_tier"
        )
    for name, plain in (("speed", "standard"), ("inference_geo", "global")):
        value = body.get(name)
        if value is not None and value != plain:
            raise InvalidRequest(
                f"'{name}': {value!r} is billed at a premium no route prices here; send "
                f"{plain!r} or leave it out.",
                param=name,
            )


def _extra(value: Any, name: str) -> dict[str, Any]:
    """An Anthropic-only object the translation keeps for the counters, checked."""
    extra = _object(value, name)
    if name == "cache_control":
        _cache_control(extra, name)
    if name == "context_management":
        edits = extra.get("edits") or []
        if not isinstance(edits, list):
            raise InvalidRequest(
                "'context_management.edits' must be an array.", param="context_management.edits"
            )
        for i, edit in enumerate(edits):
            kind = edit.get("type") if isinstance(edit, dict) else None
            if kind not in LOWERING_EDITS:
                where = f"context_management.edits[{i}].type"
                raise InvalidRequest(
                    f"'{where}' {kind!r}: only edits that clear content are supported here "
                    f"({', '.join(sorted(LOWERING_EDITS))}); one that compacts bills a "
                    "summarizing call the gateway cannot bound.",
                    param=where,
                )
    return extra


def _cache_control(mark: Any, where: str) -> None:
    if not isinstance(mark, dict) or mark.get("type") != "ephemeral":
        raise InvalidRequest(f"'{where}.type' must be ephemeral.", param=f"{where}.type")
    if mark.get("ttl", "5m") not in ("5m", "1h"):
        raise InvalidRequest(f"'{where}.ttl' must be 5m or 1h.", param=f"{where}.ttl")


def _tools(value: Any) -> tuple[list[dict[str, Any]], tuple[ServerTool, ...]]:
    """The custom tools as chat functions, and the server tools a route may price per use
    (:data:`PRICED_SERVER_TOOLS`; whether this route does is the money owner's to say). Any
    other tool the provider runs or prompts for is a 400 naming it."""
    if not isinstance(value, list):
        raise InvalidRequest("'tools' must be an array.", param="tools")
    out = []
    server: list[ServerTool] = []
    for i, item in enumerate(value):
        where = f"tools[{i}]"
        tool = _object(item, where)
        kind = tool.get("type", "custom")
        if kind not in ("custom", None):
            priced = next((p for p in PRICED_SERVER_TOOLS if str(kind).startswith(p + "_")), None)
            if isinstance(kind, str) and priced is not None:
                server.append(_server_tool(tool, priced, kind, where, i))
                continue
            billed = isinstance(kind, str) and kind.startswith(SERVER_TOOLS)
            what = "is billed per use" if billed else "is not a tool this gateway can count"
            raise InvalidRequest(
                f"'{where}.type': the tool {kind!r} {what}, which no route here prices; "
                "define the tool yourself.",
                param=f"{where}.type",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"'{where}.name' must be a non-empty string.", param=where)
        schema = _object(tool.get("input_schema"), f"{where}.input_schema")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        entry: dict[str, Any] = {"type": "function", "function": function}
        for name, field in tool.items():
            if name not in ("type", "name", "description", "input_schema"):
                entry[name] = field  # cache_control, and anything else, counted as sent
        out.append(entry)
    return out, tuple(server)


def _server_tool(tool: dict[str, Any], kind: str, type_: str, where: str, i: int) -> ServerTool:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"'{where}.name' must be a non-empty string.", param=f"{where}.name")
    uses = tool.get("max_uses")
    if uses is not None:
        uses = _int(uses, f"{where}.max_uses", least=1)
    if kind == "web_fetch" and tool.get("max_content_tokens") is not None:
        _int(tool["max_content_tokens"], f"{where}.max_content_tokens", least=1)
    return ServerTool(kind, type_, where, i, uses)


def _tool_choice(value: Any, has_tools: bool) -> dict[str, Any]:
    choice = _object(value, "tool_choice")
    kind = choice.get("type")
    out: dict[str, Any] = {}
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(
                "'tool_choice.name' is required when its type is 'tool'.", param="tool_choice.name"
            )
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif kind in TOOL_CHOICES:
        out["tool_choice"] = TOOL_CHOICES[kind]
    else:
        raise InvalidRequest(
            "'tool_choice.type' must be one of auto, any, tool, none.", param="tool_choice.type"
        )
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidRequest(
            "'tool_choice.disable_parallel_tool_use' must be a boolean.",
            param="tool_choice.disable_parallel_tool_use",
        )
    if parallel and has_tools:  # OpenAI refuses parallel_tool_calls without tools
        out["parallel_tool_calls"] = False
    return out


# -- messages -------------------------------------------------------------------------------------


def _system(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "system", "content": value}]
    if not isinstance(value, list):
        raise InvalidRequest(
            "'system' must be a string or an array of text blocks.", param="system"
        )
    parts = []
    for i, block in enumerate(value):
        where = f"system[{i}]"
        if not isinstance(block, dict) or block.get("type") != "text":
            raise InvalidRequest(f"'{where}' must be a text block.", param=where)
        parts.append(_text(block, where))
    return [{"role": "system", "content": parts}]


def _messages(value: Any) -> list[dict[str, Any]]:
    if value is None:
        raise InvalidRequest("'messages' is required.", param="messages")
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'messages' must be a non-empty array.", param="messages")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"messages[{i}]"
        message = _object(item, where)
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant", "system"):
            raise InvalidRequest(
                f"'{where}.role' must be user, assistant or system.", param=f"{where}.role"
            )
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise InvalidRequest(
                f"'{where}.content' must be a string or an array of content blocks.",
                param=f"{where}.content",
            )
        blocks = [_object(b, f"{where}.content[{j}]") for j, b in enumerate(content)]
        if role == "user":
            out += _user(blocks, f"{where}.content")
        elif role == "assistant":
            out.append(_assistant(blocks, f"{where}.content"))
        else:
            out.append(_system_turn(blocks, f"{where}.content"))
    return out


def _system_turn(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    """A system message mid-conversation (Claude Code sends its environment as one): text,
    and the tools it adds or removes from there on, counted by their length (a tool defined
    there is checked as ``tools`` are: a server tool is refused)."""
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = block.get("type")
        if kind == "text":
            parts.append(_text(block, at))
            continue
        if kind not in ("tool_addition", "tool_removal"):
            raise InvalidRequest(
                f"'{at}.type' {kind!r} cannot be in a system message here (text, "
                "tool_addition, tool_removal).",
                param=f"{at}.type",
            )
        tool = _object(block.get("tool"), f"{at}.tool")
        if tool.get("type") == "tool_definition":
            where = f"{at}.tool.definition"
            _, server = _tools([_object(tool.get("definition"), where)])
            if server:  # its uses would not be held: the hold is sized from `tools`
                raise InvalidRequest(
                    f"'{where}.type': the server tool {server[0].type!r} is billed per use; "
                    "declare it in 'tools', where its uses are held, not mid-conversation.",
                    param=f"{where}.type",
                )
        elif tool.get("type") != "tool_reference":
            raise InvalidRequest(
                f"'{at}.tool.type' {tool.get('type')!r}: only tools of this request can be "
                "added or removed here (an MCP server's are refused with mcp_servers).",
                param=f"{at}.tool.type",
            )
        _mark(block, at)
        parts.append(block)  # only an Anthropic upstream takes it; counted as sent
    return {"role": "system", "content": parts}


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Tool results as tool messages first (OpenAI wants them right after the assistant's
    calls), then the rest, with images the tool results carried, as one user message."""
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        if block.get("type") == "tool_result":
            message, images = _tool_result(block, at)
            tools.append(message)
            parts += images
        else:
            parts += _part(block, at)
    return tools + ([{"role": "user", "content": parts}] if parts or not tools else [])


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    thinking: list[dict[str, Any]] = []
    mark: dict[str, Any] | None = None
    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = block.get("type")
        if kind == "text":
            parts.append(_text(block, at))
        elif kind == "tool_use":
            name, tool_id = block.get("name"), block.get("id")
            if not isinstance(name, str) or not isinstance(tool_id, str):
                raise InvalidRequest(f"'{at}' needs an 'id' and a 'name'.", param=at)
            arguments = json.dumps(_object(block.get("input"), f"{at}.input"))
            call = {"name": name, "arguments": arguments}
            calls.append({"id": tool_id, "type": "function", "function": call})
            found = _mark(block, at)
            if found is not None and (mark is None or found.get("ttl", "5m") != "5m"):
                mark = found  # an hour-long one, if any, prices the write
        elif kind in ("thinking", "redacted_thinking"):
            thinking.append(block)
        else:
            raise InvalidRequest(
                f"'{at}.type' {kind!r} cannot be in an assistant message here (text, tool_use, "
                "thinking, redacted_thinking).",
                param=f"{at}.type",
            )
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if mark is not None:  # a tool_use block's: the message holds it for the price terms
        message["cache_control"] = mark
    if parts:
        plain = all(set(p) == {"type", "text"} for p in parts)
        message["content"] = "".join(p["text"] for p in parts) if plain else parts
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["thinking_blocks"] = thinking
    return message


def _tool_result(block: dict[str, Any], where: str) -> tuple[dict[str, Any], list[Any]]:
    tool_id = block.get("tool_use_id")
    if not isinstance(tool_id, str) or not tool_id:
        raise InvalidRequest(f"'{where}.tool_use_id' is required.", param=f"{where}.tool_use_id")
    content = block.get("content")
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    mark = _mark(block, where)
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for k, item in enumerate(content):
            for part in _part(_object(item, f"{where}.content[{k}]"), f"{where}.content[{k}]"):
                inner = part.get("cache_control")
                if inner is not None and (mark is None or inner.get("ttl", "5m") != "5m"):
                    mark = inner  # the price terms see the marks of what the result holds
                if part["type"] == "text":
                    texts.append(part["text"])
                else:
                    images.append(part)  # a tool message holds text only in OpenAI chat
    elif content is not None:
        raise InvalidRequest(
            f"'{where}.content' must be a string or blocks.", param=f"{where}.content"
        )
    if block.get("is_error"):
        texts.insert(0, "Error:")
    message: dict[str, Any] = {"role": "tool", "tool_call_id": tool_id}
    message["content"] = "\n".join(texts)
    if mark is not None:  # the message holds it for the price terms
        message["cache_control"] = mark
    return message, images


def _text(block: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("text"), str):
        raise InvalidRequest(f"'{where}.text' must be a string.", param=f"{where}.text")
    return _marked(block, {"type": "text", "text": block["text"]}, where)


def _mark(block: dict[str, Any], where: str) -> dict[str, Any] | None:
    """A block's prompt-cache mark, checked (its ``ttl`` prices the cache write)."""
    mark = block.get("cache_control")
    if mark is None:
        return None
    _cache_control(mark, f"{where}.cache_control")
    result: dict[str, Any] = mark
    return result


def _marked(block: dict[str, Any], part: dict[str, Any], where: str) -> dict[str, Any]:
    """``part`` with ``block``'s cache mark, if it has one."""
    mark = _mark(block, where)
    return part if mark is None else {**part, "cache_control": mark}


def _part(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The OpenAI parts of one user content block."""
    kind = block.get("type")
    if kind == "text":
        return [_text(block, where)]
    if kind == "image":
        source = _object(block.get("source"), f"{where}.source")
        image = {"type": "image_url", "image_url": {"url": _image_url(source, where)}}
        return [_marked(block, image, where)]
    if kind == "document":
        parts = _document(block, where)
        return [*parts[:-1], _marked(block, parts[-1], where)] if parts else parts
    if kind == "search_result":
        return _search_result(block, where)
    raise InvalidRequest(
        f"'{where}.type' {kind!r} cannot be in a user message here (text, image, document, "
        "search_result, tool_result).",
        param=f"{where}.type",
    )


def _image_url(source: dict[str, Any], where: str) -> str:
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise InvalidRequest(f"'{where}.source' needs media_type and data.", param=where)
        return f"data:{media};base64,{data}"
    if kind == "url" and isinstance(source.get("url"), str):
        url: str = source["url"]
        return url
    raise InvalidRequest(
        f"'{where}.source.type' must be base64 or url: a file sent by id cannot be counted "
        "before the call, so the budget cannot hold it.",
        param=f"{where}.source.type",
    )


def _document(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    source = _object(block.get("source"), f"{where}.source")
    kind = source.get("type")
    # A title and context are shown to the model with the document: they count as text.
    parts = [
        {"type": "text", "text": block[name]}
        for name in ("title", "context")
        if isinstance(block.get(name), str)
    ]
    if kind == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type") or "application/pdf"
        url = f"data:{media};base64,{source['data']}"
        file = {"filename": block.get("title") or "document.pdf", "file_data": url}
        return [*parts, {"type": "file", "file": file}]
    if kind == "text" and isinstance(source.get("data"), str):
        return [*parts, {"type": "text", "text": source["data"]}]
    if kind == "content" and isinstance(source.get("content"), list):
        inner = source["content"]
        for k, item in enumerate(inner):
            parts += _part(_object(item, f"{where}.source.content[{k}]"), where)
        return parts
    raise InvalidRequest(
        f"'{where}.source' must be base64, text or content: a document sent by URL or file id "
        "cannot be counted before the call, so the budget cannot hold it.",
        param=f"{where}.source",
    )


def _search_result(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A search result the client found (its source, title and text blocks): text parts."""
    parts = []
    for name in ("source", "title"):
        if not isinstance(block.get(name), str):
            raise InvalidRequest(f"'{where}.{name}' must be a string.", param=f"{where}.{name}")
        parts.append({"type": "text", "text": block[name]})
    content = block.get("content")
    if not isinstance(content, list):
        raise InvalidRequest(f"'{where}.content' must be an array of text blocks.",
                             param=f"{where}.content")  # fmt: skip
    for k, item in enumerate(content):
        at = f"{where}.content[{k}]"
        text = _object(item, at)
        if text.get("type") != "text":
            raise InvalidRequest(f"'{at}' must be a text block.", param=at)
        parts.append(_text(text, at))
    return [*parts[:-1], _marked(block, parts[-1], where)]
