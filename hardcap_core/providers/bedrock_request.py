"""An OpenAI-shaped chat body as the parameters of Bedrock's Converse and ConverseStream.

What is translated (the rest of the body is not sent; its input was still estimated by the
wire format, which counts every field, so nothing sent here goes uncounted):

- ``system`` and ``developer`` messages become ``system`` blocks, in order, wherever they are;
- user and assistant content (a string or text, image and file parts) becomes content blocks;
  images and files must be ``data:`` URLs (Converse takes their bytes, not a link), images as
  png, jpeg, gif or webp, files as one of Converse's document formats; audio is refused;
- an assistant's ``tool_calls`` become ``toolUse`` blocks (arguments parsed as JSON), a ``tool``
  message a ``toolResult`` block in a user turn; consecutive turns of one role are merged, as
  Converse wants the roles to alternate;
- ``tools`` become ``toolConfig.tools[].toolSpec`` and ``tool_choice`` ``toolConfig.toolChoice``
  (``auto`` / ``required`` -> ``any`` / a named function -> ``tool``). Converse has no "none":
  the tools are left out then, unless the conversation holds tool blocks, which Converse accepts
  only with a ``toolConfig`` (they are sent without a choice);
- ``stop`` -> ``inferenceConfig.stopSequences``, ``temperature``, ``top_p`` -> ``topP``, and the
  gateway's output cap -> ``inferenceConfig.maxTokens`` (whatever the client sent);
- reasoning: ``thinking`` (Anthropic's object, e.g. ``{"type": "enabled", "budget_tokens": N}``)
  and ``reasoning_effort`` (a string, as gpt-oss models on Bedrock take it) are passed in
  ``additionalModelRequestFields`` under those names. Nothing else reaches that field: what is
  there is merged into the model's native request, where a client could raise its output cap;
- ``user`` and string values of ``metadata`` become ``requestMetadata`` (labels for Bedrock's
  invocation logs), those that fit its limits.

A request of Anthropic's format with a server tool is refused naming it (``tools[i].type``;
admission refuses it first, money.tool_hold): Bedrock does not run one, and the request would
not do what it asks. Its ``anthropic-beta`` values that Bedrock takes (:data:`BEDROCK_BETAS`)
are sent as ``additionalModelRequestFields.anthropic_beta`` (a 1M-context one needs the
route's long-context prices); the others are not sent. A beta only enables fields and blocks,
and of Anthropic's fields only ``thinking`` is translated here, so a beta Bedrock does not
take has nothing to act on: Claude Code's defaults (``context-management-…``,
``prompt-caching-scope-…``, ``effort-…``, a client's own) then run. What a dropped beta's field
would have saved (``context_management`` clearing older tool results) is billed and charged,
as the input sent is what the gateway counted.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hardcap_core.chat import ChatRequest
from hardcap_core.config import Route
from hardcap_core.errors import InvalidRequest
from hardcap_core.wire.anthropic_fields import BEDROCK_BETAS
from hardcap_core.wire.anthropic_request import check_betas
from hardcap_core.wire.media import base64_bytes

IMAGE_FORMATS = {"png": "png", "jpeg": "jpeg", "jpg": "jpeg", "gif": "gif", "webp": "webp"}
DOCUMENT_FORMATS = {
    "application/pdf": "pdf",
    "text/csv": "csv",
    "application/msword": "doc",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "application/vnd.ms-excel": "xls",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
    "text/html": "html",
    "text/plain": "txt",
    "text/markdown": "md",
}
_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)(?:;[^,]*)?;base64,(.*)", re.DOTALL)
# requestMetadata: at most 16 pairs, keys and values of 1-256 of these characters.
_METADATA_TEXT = re.compile(r"[a-zA-Z0-9\s:_@$#=/+,\-.]{1,256}")
METADATA_PAIRS = 16


def converse_params(route: Route, request: ChatRequest, max_tokens: int) -> dict[str, Any]:
    """The keyword arguments of ``converse`` / ``converse_stream`` for ``request``."""
    body = request.body
    system, messages = _conversation(body["messages"])
    params: dict[str, Any] = {"modelId": route.model, "messages": messages}
    if system:
        params["system"] = system
    params["inferenceConfig"] = _inference(body, max_tokens)
    has_tool_blocks = any(
        "toolUse" in block or "toolResult" in block
        for message in messages
        for block in message["content"]
    )
    tool_config = _tool_config(body, has_tool_blocks)
    if tool_config:
        params["toolConfig"] = tool_config
    extra: dict[str, Any] = {}
    if body.get("thinking") is not None:
        if not isinstance(body["thinking"], dict):
            raise InvalidRequest("'thinking' must be an object.", param="thinking")
        extra["thinking"] = body["thinking"]
    if body.get("reasoning_effort") is not None:
        if not isinstance(body["reasoning_effort"], str):
            raise InvalidRequest("'reasoning_effort' must be a string.", param="reasoning_effort")
        extra["reasoning_effort"] = body["reasoning_effort"]
    betas = _betas(route, request)
    if betas:
        extra["anthropic_beta"] = betas
    if extra:
        params["additionalModelRequestFields"] = extra
    metadata = _request_metadata(body)
    if metadata:
        params["requestMetadata"] = metadata
    return params


def _betas(route: Route, request: ChatRequest) -> list[str]:
    """The anthropic-beta values Bedrock is sent (those it takes), or a 400 naming a server
    tool, which Bedrock does not run."""
    for tool in request.server_tools:
        raise InvalidRequest(
            f"'{tool.where}.type': Bedrock does not run the server tool {tool.type!r}.",
            param=f"{tool.where}.type",
        )
    check_betas(request, long_context_priced=route.prices.long_context is not None)
    return [beta for beta in request.betas if beta in BEDROCK_BETAS]


def _inference(body: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    inference: dict[str, Any] = {"maxTokens": max_tokens}
    if body.get("temperature") is not None:
        inference["temperature"] = body["temperature"]
    if body.get("top_p") is not None:
        inference["topP"] = body["top_p"]
    stop = body.get("stop")
    if isinstance(stop, str):
        inference["stopSequences"] = [stop]
    elif isinstance(stop, list) and stop:
        inference["stopSequences"] = stop
    return inference


def _conversation(raw: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system blocks, messages with alternating roles)."""
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(raw):
        role = message.get("role")
        where = f"messages[{i}]"
        if role in ("system", "developer"):
            system += [{"text": t} for t in _texts(message.get("content"), where)]
            continue
        if role == "user":
            blocks = _content(message.get("content"), where)
        elif role == "assistant":
            blocks = _content(message.get("content"), where, assistant=True)
            blocks += _tool_uses(message.get("tool_calls"), where)
        elif role == "tool":
            role, blocks = "user", [_tool_result(message, where)]
        else:
            raise InvalidRequest(
                f"'{where}.role' {role!r} is not supported on a Bedrock route "
                "(use tools and tool messages).",
                param=f"{where}.role",
            )
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += blocks
        else:
            turns.append({"role": role, "content": blocks})
    return system, turns


def _texts(content: Any, where: str) -> list[str]:
    """The text of a system message: a string or text parts."""
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise InvalidRequest(
                    f"'{where}.content[{j}]': a system message holds text only.",
                    param=f"{where}.content",
                )
            texts.append(str(part.get("text", "")))
        return texts
    raise InvalidRequest(f"'{where}.content' must be a string or an array.", param=where)


def _content(content: Any, where: str, *, assistant: bool = False) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []  # an assistant turn that only calls tools; Converse refuses blank text
    if isinstance(content, str):
        return [{"text": content}]
    if not isinstance(content, list):
        raise InvalidRequest(f"'{where}.content' must be a string or an array.", param=where)
    blocks: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" or (assistant and kind == "refusal"):
            blocks.append({"text": str(part.get(kind) or "")})
        elif kind == "image_url":
            blocks.append(_image(part, at))
        elif kind == "file":
            blocks.append(_document(part, at, len(blocks)))
        else:
            raise InvalidRequest(
                f"'{at}': content of type {kind!r} is not supported on a Bedrock route.",
                param=at,
            )
    return blocks


def _data_url(url: Any, at: str) -> tuple[str, bytes]:
    match = _DATA_URL.fullmatch(url) if isinstance(url, str) else None
    if match is None:
        raise InvalidRequest(
            f"'{at}': Bedrock takes images and files as base64 data: URLs, not links.", param=at
        )
    return match.group(1).lower(), base64_bytes(match.group(2))


def _image(part: dict[str, Any], at: str) -> dict[str, Any]:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    mime, data = _data_url(url, at)
    kind, _, sub = mime.partition("/")
    if kind != "image" or sub not in IMAGE_FORMATS:
        raise InvalidRequest(f"'{at}': Bedrock takes png, jpeg, gif or webp images.", param=at)
    return {"image": {"format": IMAGE_FORMATS[sub], "source": {"bytes": data}}}


def _document(part: dict[str, Any], at: str, index: int) -> dict[str, Any]:
    file = part.get("file")
    if not isinstance(file, dict):
        raise InvalidRequest(f"'{at}.file' must be an object.", param=at)
    mime, data = _data_url(file.get("file_data"), f"{at}.file.file_data")
    if mime not in DOCUMENT_FORMATS:
        raise InvalidRequest(f"'{at}': Bedrock takes no documents of type {mime}.", param=at)
    # A document's name is required, and only letters, digits, spaces, hyphens, parentheses
    # and brackets may be in it.
    name = re.sub(r"[^A-Za-z0-9 ()\[\]-]", "-", str(file.get("filename") or f"document {index}"))
    return {"document": {"format": DOCUMENT_FORMATS[mime], "name": name, "source": {"bytes": data}}}


def _tool_uses(calls: Any, where: str) -> list[dict[str, Any]]:
    if not calls:
        return []
    if not isinstance(calls, list):
        raise InvalidRequest(f"'{where}.tool_calls' must be an array.", param=where)
    blocks = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(call.get("id"), str):
            raise InvalidRequest(f"'{at}' needs an id and a function.", param=at)
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except (TypeError, ValueError) as e:
            raise InvalidRequest(f"'{at}.function.arguments' is not JSON.", param=at) from e
        name = str(fn.get("name"))
        blocks.append({"toolUse": {"toolUseId": call["id"], "name": name, "input": arguments}})
    return blocks


def _tool_result(message: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidRequest(f"'{where}.tool_call_id' is required.", param=where)
    texts = _texts(message.get("content"), where)
    return {"toolResult": {"toolUseId": call_id, "content": [{"text": t} for t in texts]}}


def _tool_config(body: dict[str, Any], has_tool_blocks: bool) -> dict[str, Any] | None:
    tools = body.get("tools")
    if not tools:
        if body.get("functions"):
            raise InvalidRequest(
                "Use 'tools' on a Bedrock route, not 'functions'.", param="functions"
            )
        return None
    specs = []
    for j, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequest(f"'tools[{j}]' needs a function with a name.", param="tools")
        spec: dict[str, Any] = {"name": fn["name"]}
        if fn.get("description"):
            spec["description"] = str(fn["description"])
        spec["inputSchema"] = {"json": fn.get("parameters") or {"type": "object", "properties": {}}}
        specs.append({"toolSpec": spec})
    config: dict[str, Any] = {"tools": specs}
    choice = body.get("tool_choice")
    if choice == "none":
        return config if has_tool_blocks else None
    if choice == "required":
        config["toolChoice"] = {"any": {}}
    elif choice == "auto":
        config["toolChoice"] = {"auto": {}}
    elif isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if not isinstance(name, str):
            raise InvalidRequest("'tool_choice.function.name' is required.", param="tool_choice")
        config["toolChoice"] = {"tool": {"name": name}}
    elif choice is not None:
        raise InvalidRequest(f"'tool_choice' {choice!r} is not supported.", param="tool_choice")
    return config


def _request_metadata(body: dict[str, Any]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    if isinstance(body.get("user"), str):
        pairs["user"] = body["user"]
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        pairs.update({k: v for k, v in metadata.items() if isinstance(v, str)})
    fit = {
        k: v
        for k, v in pairs.items()
        if _METADATA_TEXT.fullmatch(k) and _METADATA_TEXT.fullmatch(v)
    }
    return dict(list(fit.items())[:METADATA_PAIRS])
