"""An OpenAI-shaped chat request translated into an Anthropic Messages request.

A request that came in Anthropic's own format is not translated back: its body as the client
sent it (``ChatRequest.native``) is sent, with the route's model, the gateway's output cap, the
stream flag and the thinking budget (as below) set, so every field, block kind and cache mark
the wire format accepted reaches Anthropic unchanged (a changed byte of a cached prefix is a
cache miss, billed at the write price). Otherwise:

- system and developer messages → the top-level ``system`` (text blocks, in order);
- user and assistant messages → content blocks: text, images (a ``data:`` URL → a base64
  source, an http(s) URL → a url source), files (a PDF ``data:`` URL → a document block);
  assistant ``tool_calls`` (and a legacy ``function_call``) → ``tool_use`` blocks; a ``tool``
  message → a user message of ``tool_result`` blocks. Consecutive messages of one role are
  merged into one turn, as the API requires, with tool results first in it;
- tools (function ``parameters`` → ``input_schema``), tool_choice (auto, none, required → any,
  a named function → tool; ``parallel_tool_calls: false`` → ``disable_parallel_tool_use``),
  stop → stop_sequences, temperature (Anthropic's range is 0-1: a higher one is sent as 1),
  top_p, the output cap as ``max_tokens`` (Anthropic requires it), a ``thinking`` object
  as given, ``user`` → ``metadata.user_id``.

Anthropic requires ``thinking.budget_tokens`` of at least 1,024 and below ``max_tokens``; the
gateway may cap ``max_tokens`` below what a client asked for (its budget's room), so a budget
at or over the cap is lowered to ``max_tokens - 1``, and when that is under 1,024 thinking is
left off: the reply the budget can afford, rather than a 400 the client cannot explain.
Reasoning text of earlier assistant turns is not sent (Anthropic ignores thinking of earlier
turns without its signature). What Anthropic cannot take (audio input, ``n`` > 1, tools that
are not functions, unparsable tool-call arguments) is refused naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from hardcap_core.chat import ANTHROPIC_MESSAGES, ChatRequest
from hardcap_core.errors import InvalidRequest

ANTHROPIC_VERSION = "2023-06-01"
MIN_THINKING_BUDGET = 1_024


def messages_body(
    request: ChatRequest, model: str, max_tokens: int, *, stream: bool
) -> dict[str, Any]:
    """The Messages API body for ``request`` on ``model`` with at most ``max_tokens`` output."""
    if request.native is not None and request.dialect == ANTHROPIC_MESSAGES:
        return _native(request.native, model, max_tokens, stream=stream)
    body = request.body
    if isinstance(body.get("n"), int) and body["n"] > 1:
        raise InvalidRequest("This route's provider returns one choice: 'n' must be 1.", param="n")
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(request.messages):
        role = message.get("role")
        if role in ("system", "developer"):
            system += _text_blocks(message.get("content"), f"messages[{i}].content")
            continue
        if role == "tool":
            block = _tool_result(message, i)
            _append(turns, "user", [block])
        elif role == "user":
            _append(turns, "user", _user_blocks(message.get("content"), i))
        elif role == "assistant":
            _append(turns, "assistant", _assistant_blocks(message, i))
        else:
            raise InvalidRequest(
                f"Role '{role}' cannot be sent to this route's provider.",
                param=f"messages[{i}].role",
            )
    out: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": turns}
    if system:
        out["system"] = system
    if stream:
        out["stream"] = True
    _options(body, out, max_tokens)
    return out


def _native(native: dict[str, Any], model: str, max_tokens: int, *, stream: bool) -> dict[str, Any]:
    """The client's own Messages body, with the gateway's model, cap, stream and budget."""
    out = dict(native, model=model, max_tokens=max_tokens)
    if stream:
        out["stream"] = True
    else:
        out.pop("stream", None)
    thinking = _thinking(native.get("thinking"), max_tokens)
    if thinking is None:
        out.pop("thinking", None)
    else:
        out["thinking"] = thinking
    return out


def _append(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Add a message's blocks as a turn, merged into the last one if it has the same role."""
    if not blocks:
        return
    if turns and turns[-1]["role"] == role:
        merged = turns[-1]["content"] + blocks
        # Anthropic wants a turn's tool results before anything else in it.
        merged.sort(key=lambda b: b["type"] != "tool_result")
        turns[-1]["content"] = merged
    else:
        turns.append({"role": role, "content": list(blocks)})


def _text_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise InvalidRequest("Content must be a string or a list of parts.", param=where)
    out: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        text = (
            part.get("text")
            if kind == "text"
            else part.get("refusal")
            if kind == "refusal"
            else None
        )
        if not isinstance(text, str):
            raise InvalidRequest("Only text parts can go here.", param=f"{where}[{j}]")
        if text:
            out.append(_cache_mark(part, {"type": "text", "text": text}))
    return out


def _cache_mark(source: dict[str, Any], block: dict[str, Any]) -> dict[str, Any]:
    """``block`` with ``source``'s prompt-cache mark, if it had one (a request that came in
    Anthropic's format keeps it: without it every turn pays the full input price)."""
    mark = source.get("cache_control")
    return {**block, "cache_control": mark} if isinstance(mark, dict) else block


def _user_blocks(content: Any, i: int) -> list[dict[str, Any]]:
    where = f"messages[{i}].content"
    if not isinstance(content, list):
        return _text_blocks(content, where)
    out: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image_url":
            out.append(_image(part.get("image_url"), f"{where}[{j}]"))
        elif kind == "file":
            out.append(_document(part.get("file"), f"{where}[{j}]"))
        elif kind in ("text", "refusal"):
            out += _text_blocks([part], where)
        else:
            raise InvalidRequest(
                f"Content parts of type '{kind}' cannot be sent to this route's provider.",
                param=f"{where}[{j}]",
            )
    return out


def _data_url(url: str) -> tuple[str, str] | None:
    """(media type, base64 data) of a base64 ``data:`` URL."""
    header, comma, data = url.partition(",")
    if not (url.startswith("data:") and comma and header.endswith(";base64")):
        return None
    return header[5 : -len(";base64")], data


def _image(image: Any, where: str) -> dict[str, Any]:
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str):
        raise InvalidRequest("An image needs a URL.", param=where)
    parsed = _data_url(url)
    if parsed is not None:
        source = {"type": "base64", "media_type": parsed[0], "data": parsed[1]}
    elif url.startswith(("https://", "http://")):
        source = {"type": "url", "url": url}
    else:
        raise InvalidRequest("An image URL must be a base64 data: URL or http(s).", param=where)
    return {"type": "image", "source": source}


def _document(file: Any, where: str) -> dict[str, Any]:
    data = file.get("file_data") if isinstance(file, dict) else None
    parsed = _data_url(data) if isinstance(data, str) else None
    if parsed is None:
        raise InvalidRequest("A file must carry its data as a base64 data: URL.", param=where)
    source = {"type": "base64", "media_type": parsed[0], "data": parsed[1]}
    return {"type": "document", "source": source}


def _assistant_blocks(message: dict[str, Any], i: int) -> list[dict[str, Any]]:
    # Signed thinking blocks of a request that came in Anthropic's format go back first: with
    # thinking on, Anthropic requires them ahead of the tool_use of the last assistant turn.
    thinking = message.get("thinking_blocks")
    out = [
        b
        for b in (thinking if isinstance(thinking, list) else [])
        if isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")
    ]
    out += _text_blocks(message.get("content"), f"messages[{i}].content")
    calls = message.get("tool_calls") or []
    if message.get("function_call"):
        calls = [*calls, {"id": f"call_legacy_{i}", "function": message["function_call"]}]
    for k, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{k}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequest("A tool call needs a function name.", param=where)
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except ValueError as e:
            raise InvalidRequest("Tool-call arguments must be JSON.", param=where) from e
        if not isinstance(arguments, dict):
            raise InvalidRequest("Tool-call arguments must be a JSON object.", param=where)
        call_id = call.get("id") or f"call_{i}_{k}"
        out.append({"type": "tool_use", "id": call_id, "name": fn["name"], "input": arguments})
    return out


def _tool_result(message: dict[str, Any], i: int) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidRequest("A tool message needs tool_call_id.", param=f"messages[{i}]")
    blocks = _text_blocks(message.get("content"), f"messages[{i}].content")
    return {"type": "tool_result", "tool_use_id": call_id, "content": blocks}


def _options(body: dict[str, Any], out: dict[str, Any], max_tokens: int) -> None:
    tools = body.get("tools")
    if tools:
        out["tools"] = [_tool(tool, k) for k, tool in enumerate(tools)]
    choice = _tool_choice(body.get("tool_choice"))
    if body.get("parallel_tool_calls") is False and tools:
        choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
    if choice is not None and tools:
        out["tool_choice"] = choice
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    temperature = body.get("temperature")
    if isinstance(temperature, (int, float)):
        out["temperature"] = min(float(temperature), 1.0)
    if body.get("top_p") is not None:
        out["top_p"] = body["top_p"]
    if body.get("top_k") is not None:
        out["top_k"] = body["top_k"]
    user = body.get("user") or body.get("safety_identifier")
    if isinstance(user, str) and user:
        out["metadata"] = {"user_id": user}
    thinking = _thinking(body.get("thinking"), max_tokens)
    if thinking is not None:
        out["thinking"] = thinking


def _tool(tool: Any, k: int) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidRequest(
            "Only function tools can be sent to this provider.", param=f"tools[{k}]"
        )
    schema = fn.get("parameters") or {"type": "object", "properties": {}}
    out = {"name": fn["name"], "input_schema": schema}
    if isinstance(fn.get("description"), str):
        out["description"] = fn["description"]
    return _cache_mark(tool, out)


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    if isinstance(choice, str):
        kind = {"auto": "auto", "none": "none", "required": "any"}.get(choice)
        if kind is None:
            raise InvalidRequest(f"tool_choice '{choice}' is not known.", param="tool_choice")
        return {"type": kind}
    name = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str):
        raise InvalidRequest("tool_choice must name a function.", param="tool_choice")
    return {"type": "tool", "name": name}


def _thinking(thinking: Any, max_tokens: int) -> Any:
    """``thinking`` as given, its budget lowered under ``max_tokens`` (see the module)."""
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return thinking
    budget = thinking.get("budget_tokens")
    if isinstance(budget, int) and budget >= max_tokens:
        if max_tokens - 1 < MIN_THINKING_BUDGET:
            return None
        return {**thinking, "budget_tokens": max_tokens - 1}
    return thinking
