"""Reading an OpenAI chat-completions body: validation, and the estimate of its billed input.

Bad input gets a clear 400 naming the field or saying what is wrong (and costs the tenant
nothing: this runs before admission); the JSON itself is checked by
:mod:`hardcap_core.wire.json_body`. What each documented field does to the bill is the table in
:mod:`hardcap_core.wire.openai_chat_fields` (a field it refuses is a 400 naming it); fields it
does not list are passed through to the provider untouched, and counted
(:mod:`hardcap_core.wire.openai_input`).
"""

from __future__ import annotations

from typing import Any

from hardcap_core.budgets import NO_TERMS, Terms
from hardcap_core.chat import OPENAI_CHAT, ChatRequest
from hardcap_core.errors import InvalidRequest
from hardcap_core.wire import json_body
from hardcap_core.wire.openai_chat_fields import CHAT_FIELDS
from hardcap_core.wire.openai_input import input_tokens

DIALECT = OPENAI_CHAT
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def parse_chat_request(raw: bytes) -> ChatRequest:
    """Validate a request body; raise :class:`InvalidRequest` naming the bad field."""
    body = json_body.loads(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    CHAT_FIELDS.check(body, forward_unknown=True)

    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string.", param="model")
    _check_messages(body.get("messages"))

    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean.", param="stream")
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise InvalidRequest("'stream_options' must be an object.", param="stream_options")
        flag = options.get("include_usage", False)
        if not isinstance(flag, bool):
            raise InvalidRequest(
                "'stream_options.include_usage' must be a boolean.",
                param="stream_options.include_usage",
            )
        include_usage = flag

    n = body.get("n", 1)
    if n is not None and (not _is_int(n) or n != 1):
        raise InvalidRequest("Only n=1 is supported: each choice needs its own budget.", param="n")
    for name in ("tools", "functions"):
        if body.get(name) is not None and not isinstance(body[name], list):
            raise InvalidRequest(f"'{name}' must be an array.", param=name)
    response_format = body.get("response_format")
    if response_format is not None and not isinstance(response_format, dict):
        raise InvalidRequest("'response_format' must be an object.", param="response_format")
    # A tier changes the price: it is priced by the route or refused (gateway/charge.py).
    tier = body.get("service_tier")
    if tier is not None and (not isinstance(tier, str) or not tier):
        raise InvalidRequest("'service_tier' must be a non-empty string.", param="service_tier")

    field, max_tokens = "max_tokens", None
    # Both are checked; max_completion_tokens (OpenAI's current name) wins when both are sent.
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value):
            raise InvalidRequest(f"'{name}' must be an integer.", param=name)
        if value < 1:
            raise InvalidRequest(f"'{name}' must be at least 1, got {value}.", param=name)
        field, max_tokens = name, value

    return ChatRequest(
        body=body,
        model=model,
        stream=bool(stream),
        include_usage=include_usage,
        max_tokens=max_tokens,
        max_tokens_field=field,
        input_tokens=input_tokens(body),
        dialect=DIALECT,
    )


def price_terms(body: dict[str, Any]) -> Terms:
    """What an OpenAI-shaped ``body`` asks that changes its price: its ``service_tier``, and
    whether it, any of its messages, their parts or its tools marks a prompt-cache write kept
    longer than 5 minutes (Anthropic's ``cache_control.ttl: "1h"``, 2x the input price: any
    ``ttl`` but "5m"; a translated Anthropic request keeps its marks there)."""
    tier = body.get("service_tier")
    tier = tier if isinstance(tier, str) and tier else None
    messages = [m for m in body.get("messages") or () if type(m) is dict]
    hour = (
        _kept_long(body)
        or any(_kept_long(tool) for tool in body.get("tools") or ())
        or any(_kept_long(message) for message in messages)
        or any(
            _kept_long(part)
            for message in messages
            if type(content := message.get("content")) is list
            for part in content
        )
    )
    return NO_TERMS if tier is None and not hour else Terms(tier, hour)


def _kept_long(item: Any) -> bool:
    mark = item.get("cache_control") if type(item) is dict else None
    return type(mark) is dict and mark.get("ttl", "5m") != "5m"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_messages(messages: Any) -> None:
    if messages is None:
        raise InvalidRequest("'messages' is required.", param="messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array.", param="messages")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise InvalidRequest(f"'{where}' must be an object.", param=where)
        role = m.get("role")
        if role not in ROLES:
            raise InvalidRequest(
                f"'{where}.role' must be one of {', '.join(sorted(ROLES))}.", param=f"{where}.role"
            )
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            raise InvalidRequest(
                f"'{where}.content' must be a string or an array of parts.",
                param=f"{where}.content",
            )
        calls = m.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise InvalidRequest(
                f"'{where}.tool_calls' must be an array.", param=f"{where}.tool_calls"
            )
