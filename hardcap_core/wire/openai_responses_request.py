"""Reading an OpenAI Responses body (``POST /v1/responses``): validation, and its translation
into the OpenAI chat shape every provider reads.

The field table (:data:`~hardcap_core.wire.openai_responses_fields.RESPONSES_FIELDS`) runs
first; then the body is translated once, and the input estimate is
:func:`hardcap_core.wire.openai_input.input_tokens` on the translated body: what reaches a
provider is exactly what is counted.

Translation: ``instructions`` becomes the first system message; ``input`` as a string becomes a
user message; input items: a message (``input_text`` → text, ``input_image`` with an
``image_url`` → an ``image_url`` part, ``input_file`` with ``file_data`` → a ``file`` part, an
assistant's ``output_text`` and ``refusal`` → its text) keeps its role; ``function_call`` items
become an assistant's ``tool_calls`` (merged into the assistant message before them, as chat
requires one assistant turn per set of calls); ``function_call_output`` becomes a ``tool``
message; the text of ``reasoning`` items of earlier turns is not sent (a chat upstream has
nowhere to take it, so it is not billed either), but an Anthropic upstream's signed thinking,
which the gateway carried out in the item's ``encrypted_content``, goes back as the next
assistant turn's ``thinking_blocks`` (Anthropic wants it ahead of a tool call's turn with
thinking on; an OpenAI-compatible upstream is not sent it). ``tools`` (function tools) become
chat functions; ``tool_choice`` maps onto chat's; ``text.format`` becomes ``response_format`` and
``text.verbosity`` ``verbosity``; ``reasoning.effort`` becomes ``reasoning_effort``, and the
request thinks with a budget by the effort (:data:`THINKING_BUDGETS`; an Anthropic upstream
is asked for that thinking, and the hold reserves for it as for a Messages client's);
``max_output_tokens`` the output cap. ``metadata``, ``user``, ``safety_identifier``,
``prompt_cache_key``, ``prompt_cache_retention``, ``service_tier``, ``temperature``, ``top_p``
and ``parallel_tool_calls`` keep their names.

``previous_response_id``: the gateway's stored conversation (``earlier``: its input and output
items, loaded by :mod:`hardcap_core.gateway.stored`) goes ahead of ``input``, and the whole is
translated and counted as one input; a body naming one that was not loaded is refused.
:attr:`ResponsesRequest.items` are the input items a stored response keeps.

Refused with a 400 naming the field: what the field table refuses, hosted tools (named),
content the request does not carry itself (``file_id``, ``file_url``, ``item_reference``), and
items a chat upstream cannot take.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from hardcap_core.chat import OPENAI_RESPONSES, ChatRequest
from hardcap_core.errors import InvalidRequest
from hardcap_core.wire import json_body
from hardcap_core.wire.openai_input import input_tokens
from hardcap_core.wire.openai_request import parse_chat_request
from hardcap_core.wire.openai_responses_fields import (
    HOSTED_TOOLS,
    RESPONSES_COUNT_FIELDS,
    RESPONSES_FIELDS,
)

DIALECT = OPENAI_RESPONSES
# The chat field the output cap goes upstream in (OpenAI's current name; reasoning models
# refuse `max_tokens`).
CAP_FIELD = "max_completion_tokens"
ROLES = frozenset({"user", "assistant", "system", "developer"})
# Anthropic's extended thinking for each reasoning effort (its floor is 1,024; the provider
# lowers a budget under the output cap, or turns thinking off below that floor). "none" and an
# effort not listed ask no thinking.
THINKING_BUDGETS = {"minimal": 1_024, "low": 1_024, "medium": 2_048, "high": 4_096, "xhigh": 8_192}
SAME_NAMES = (
    "metadata", "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
    "service_tier", "temperature", "top_p",
)  # fmt: skip
# What the response object repeats of the request (the API echoes these back).
ECHOED = (
    "instructions", "max_output_tokens", "metadata", "parallel_tool_calls", "reasoning",
    "service_tier", "temperature", "text", "tool_choice", "tools", "top_p", "truncation",
    "user", "safety_identifier", "prompt_cache_key", "store", "top_logprobs",
    "previous_response_id",
)  # fmt: skip


class Keeper(Protocol):
    """Keeps a response served with ``store`` (:class:`hardcap_core.gateway.stored.Keeper`)."""

    def keep(self, response: dict[str, Any]) -> bool:
        """Take the final ``response`` (completed or incomplete) to store, setting its
        ``store``; whether it will be stored (it may be too large)."""
        ...

    async def write(self) -> None:
        """Store what :meth:`keep` took, before the reply's last bytes go out."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class ResponsesRequest(ChatRequest):
    """A chat request that came in the Responses format, with what its reply repeats."""

    echo: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Every input item, a previous response's included (what a stored response keeps), and
    # what keeps this response (None: it is not stored).
    items: tuple[dict[str, Any], ...] = ()
    keeper: Keeper | None = None

    @property
    def thinking_budget(self) -> int | None:
        """Anthropic's thinking budget for its reasoning effort (:data:`THINKING_BUDGETS`):
        what an Anthropic upstream is asked to think, and what the hold reserves for it."""
        reasoning = self.echo.get("reasoning")
        effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
        return THINKING_BUDGETS.get(effort) if isinstance(effort, str) else None

    @property
    def thinks(self) -> bool:
        return self.thinking_budget is not None


def parse_responses_request(
    raw: bytes, *, counting: bool = False, earlier: Sequence[dict[str, Any]] | None = None
) -> ResponsesRequest:
    """Validate a Responses body (``counting``: a ``/v1/responses/input_tokens`` body, which has
    no output fields) and translate it; raise :class:`InvalidRequest` naming the bad field.
    ``earlier``: the items of the stored conversation its ``previous_response_id`` names."""
    body = json_body.loads(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    given = {k: v for k, v in body.items() if v is not None}
    if given.get("background") is False:
        del given["background"]  # the default: answered while the request lasts
    (RESPONSES_COUNT_FIELDS if counting else RESPONSES_FIELDS).check(given)

    model = given.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string.", param="model")
    stream = given.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean.", param="stream")
    max_tokens = given.get("max_output_tokens")
    if max_tokens is not None:
        if not _is_int(max_tokens):
            raise InvalidRequest(
                "'max_output_tokens' must be an integer.", param="max_output_tokens"
            )
        if max_tokens < 1:
            raise InvalidRequest(
                f"'max_output_tokens' must be at least 1, got {max_tokens}.",
                param="max_output_tokens",
            )

    messages: list[dict[str, Any]] = []
    instructions = given.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidRequest("'instructions' must be a string.", param="instructions")
        messages.append({"role": "system", "content": instructions})
    previous = given.get("previous_response_id")
    if previous is not None and earlier is None:
        raise InvalidRequest(
            "'previous_response_id' is not served on this path; send the whole conversation in "
            "'input' here.",
            param="previous_response_id",
        )
    items = _items(given.get("input"))
    messages += _input([*(earlier or ()), *items], len(earlier or ()))
    out: dict[str, Any] = {"model": model, "messages": messages}
    for name in SAME_NAMES:
        if name in given:
            out[name] = given[name]
    tools = _tools(given.get("tools"))
    if tools:
        out["tools"] = tools
        if "parallel_tool_calls" in given:
            out["parallel_tool_calls"] = _bool(given["parallel_tool_calls"], "parallel_tool_calls")
    if "tool_choice" in given:
        choice = _tool_choice(given["tool_choice"])
        if tools:  # chat refuses a tool_choice (and parallel_tool_calls) without tools
            out["tool_choice"] = choice
    out.update(_text(given.get("text")))
    effort = _reasoning(given.get("reasoning"))
    if effort is not None:
        out["reasoning_effort"] = effort
    _include(given.get("include"))
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}

    return ResponsesRequest(
        body=out,
        model=model,
        stream=stream,
        include_usage=True,  # response.completed always carries the usage
        max_tokens=max_tokens,
        max_tokens_field=CAP_FIELD,
        input_tokens=input_tokens(out),
        dialect=DIALECT,
        echo={name: given[name] for name in ECHOED if name in given},
        items=(*(earlier or ()), *items),
    )


def keeper_of(request: ChatRequest) -> Keeper | None:
    """What keeps ``request``'s response, if it came in the Responses format with one."""
    return request.keeper if isinstance(request, ResponsesRequest) else None


def parse_openai_body(raw: bytes) -> ChatRequest:
    """A chat-completions body, or a Responses one (``input`` and no ``messages``): what
    ``POST /v1/hardcap/quote`` accepts."""
    body = json_body.loads(raw)
    if isinstance(body, dict) and "input" in body and "messages" not in body:
        return parse_responses_request(raw)
    return parse_chat_request(raw)


# -- input ----------------------------------------------------------------------------------------


def _items(value: Any) -> list[dict[str, Any]]:
    """``input`` as items (a string is one user message, as the API lists it)."""
    if value is None:
        raise InvalidRequest("'input' is required.", param="input")
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            "'input' must be a string or a non-empty array of items.", param="input"
        )
    return value


def _input(value: list[Any], stored: int = 0) -> list[dict[str, Any]]:
    """The chat messages of the input items, the first ``stored`` of them a stored
    conversation's (named by where they came from in errors)."""
    out: list[dict[str, Any]] = []
    thinking: list[dict[str, Any]] = []  # signed thinking for the next assistant turn
    for i, item in enumerate(value):
        where = f"previous_response_id.input[{i}]" if i < stored else f"input[{i - stored}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"'{where}' must be an object.", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            out.append(_message(item, where))
            if thinking and out[-1]["role"] == "assistant":
                out[-1]["thinking_blocks"], thinking = thinking, []
        elif kind == "function_call":
            _function_call(out, item, where)  # into the assistant turn before it, or a new one
            if thinking:
                out[-1].setdefault("thinking_blocks", []).extend(thinking)
                thinking = []
        elif kind == "function_call_output":
            out.append(_function_output(item, where))
        elif kind == "reasoning":
            _object_list(item.get("summary", []), f"{where}.summary")
            # Its text is not sent (a chat upstream has nowhere to take it); an Anthropic
            # upstream's signed thinking goes back with the next assistant turn.
            thinking += thinking_blocks(item.get("encrypted_content"), f"{where}.encrypted_content")
        elif kind == "item_reference":
            raise InvalidRequest(
                f"'{where}': an item reference makes the provider bill a stored item this "
                "request does not carry, which the gateway cannot bound; send the item itself.",
                param=where,
            )
        else:
            raise InvalidRequest(
                f"'{where}.type' {kind!r} is not supported here (message, function_call, "
                "function_call_output, reasoning).",
                param=f"{where}.type",
            )
    if not any(m["role"] != "system" for m in out):
        raise InvalidRequest("'input' must hold at least one message.", param="input")
    return out


# The prefix of the reasoning items' encrypted_content the gateway makes (Anthropic thinking
# blocks, base64 JSON); another provider's encrypted content is not the gateway's to read.
SEALED = "hardcap.thinking.v1:"


def sealed_thinking(blocks: list[dict[str, Any]]) -> str:
    """Anthropic thinking blocks as a reasoning item's ``encrypted_content``."""
    return SEALED + base64.b64encode(json.dumps(blocks).encode()).decode()


def thinking_blocks(value: Any, where: str) -> list[dict[str, Any]]:
    """The thinking blocks :func:`sealed_thinking` made (none from another's content)."""
    if not isinstance(value, str) or not value.startswith(SEALED):
        return []
    try:
        blocks = json.loads(base64.b64decode(value[len(SEALED) :], validate=True))
    except (binascii.Error, ValueError) as e:
        raise InvalidRequest(f"'{where}' is not as the gateway made it.", param=where) from e
    kinds = ("thinking", "redacted_thinking")
    if not isinstance(blocks, list) or not all(
        isinstance(b, dict) and b.get("type") in kinds for b in blocks
    ):
        raise InvalidRequest(f"'{where}' is not as the gateway made it.", param=where)
    return blocks


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidRequest(
            f"'{where}.role' must be one of {', '.join(sorted(ROLES))}.", param=f"{where}.role"
        )
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise InvalidRequest(
            f"'{where}.content' must be a string or an array of parts.", param=f"{where}.content"
        )
    parts = [_part(p, f"{where}.content[{j}]") for j, p in enumerate(content)]
    if role == "user":
        return {"role": role, "content": parts}
    # System, developer and assistant turns take text only in chat: joined.
    texts = []
    for j, part in enumerate(parts):
        if part["type"] != "text":
            at = f"{where}.content[{j}]"
            raise InvalidRequest(f"'{at}': a {role} message holds text only.", param=at)
        texts.append(part["text"])
    return {"role": role, "content": "".join(texts)}


def _part(part: Any, where: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise InvalidRequest(f"'{where}' must be an object.", param=where)
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": _string(part.get("text"), f"{where}.text")}
    if kind == "refusal":
        return {"type": "text", "text": _string(part.get("refusal"), f"{where}.refusal")}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise _not_carried(where, "an image by 'file_id'", "'image_url' (a data: URL or https)")
        image: dict[str, Any] = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        data = part.get("file_data")
        if not isinstance(data, str) or not data:
            raise _not_carried(where, "a file by 'file_id' or 'file_url'", "'file_data'")
        file = {"file_data": data}
        if isinstance(part.get("filename"), str):
            file["filename"] = part["filename"]
        return {"type": "file", "file": file}
    raise InvalidRequest(
        f"'{where}.type' {kind!r} is not supported here (input_text, input_image, input_file, "
        "output_text, refusal).",
        param=f"{where}.type",
    )


def _not_carried(where: str, what: str, instead: str) -> InvalidRequest:
    return InvalidRequest(
        f"'{where}': {what} is stored with the provider, and its size is not in this request, "
        f"so the gateway cannot bound what it bills; send it inline as {instead}.",
        param=where,
    )


def _function_call(out: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    call_id = _string(item.get("call_id"), f"{where}.call_id")
    name = _string(item.get("name"), f"{where}.name")
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        raise InvalidRequest(f"'{where}.arguments' must be a string.", param=f"{where}.arguments")
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = out[-1] if out else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _function_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = _string(item.get("call_id"), f"{where}.call_id")
    output = item.get("output")
    if isinstance(output, list):
        parts = [_part(p, f"{where}.output[{j}]") for j, p in enumerate(output)]
        if any(p["type"] != "text" for p in parts):
            raise InvalidRequest(
                f"'{where}.output': a tool's output holds text only here.", param=f"{where}.output"
            )
        output = "".join(p["text"] for p in parts)
    if not isinstance(output, str):
        raise InvalidRequest(
            f"'{where}.output' must be a string or an array of parts.", param=f"{where}.output"
        )
    return {"role": "tool", "tool_call_id": call_id, "content": output}


# -- options --------------------------------------------------------------------------------------


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest("'tools' must be an array.", param="tools")
    out = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"'{where}' must be an object.", param=where)
        kind = tool.get("type")
        if isinstance(kind, str) and kind in HOSTED_TOOLS:
            raise InvalidRequest(
                f"'{where}': the hosted tool '{kind}' is billed per call by the provider, "
                "which this gateway does not price yet; define a function tool instead.",
                param=f"{where}.type",
            )
        if kind != "function":
            raise InvalidRequest(
                f"'{where}': tools of type {kind!r} are not supported here (function).",
                param=f"{where}.type",
            )
        function: dict[str, Any] = {"name": _string(tool.get("name"), f"{where}.name")}
        for name in ("description", "parameters", "strict"):
            if tool.get(name) is not None:
                function[name] = tool[name]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: Any) -> Any:
    if value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        name = _string(value.get("name"), "tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    raise InvalidRequest(
        "'tool_choice' must be auto, none, required, or a function ({type: function, name}).",
        param="tool_choice",
    )


def _text(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest("'text' must be an object.", param="text")
    out: dict[str, Any] = {}
    verbosity = value.get("verbosity")
    if verbosity is not None:
        out["verbosity"] = _string(verbosity, "text.verbosity")
    fmt = value.get("format")
    if fmt is None:
        return out
    if not isinstance(fmt, dict):
        raise InvalidRequest("'text.format' must be an object.", param="text.format")
    kind = fmt.get("type")
    if kind == "json_schema":
        schema = {k: v for k, v in fmt.items() if k != "type"}
        _string(schema.get("name"), "text.format.name")
        if not isinstance(schema.get("schema"), dict):
            raise InvalidRequest("'text.format.schema' must be an object.", param="text.format")
        out["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif kind in ("text", "json_object"):
        out["response_format"] = {"type": kind}
    else:
        raise InvalidRequest(
            "'text.format.type' must be text, json_object or json_schema.",
            param="text.format.type",
        )
    return out


def _reasoning(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest("'reasoning' must be an object.", param="reasoning")
    effort = value.get("effort")
    return None if effort is None else _string(effort, "reasoning.effort")


def _include(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequest("'include' must be an array of strings.", param="include")


# -- values ---------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{where}' must be a boolean.", param=where)
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"'{where}' must be a non-empty string.", param=where)
    return value


def _object_list(value: Any, where: str) -> None:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise InvalidRequest(f"'{where}' must be an array of objects.", param=where)
