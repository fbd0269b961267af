"""Anthropic's own count of a prompt (``POST /v1/messages/count_tokens``), for routes with
``count_api: true``: a call through the provider's transport, bounded by a short timeout,
its answers cached by prompt prefix.

Claude's tokenizer is not public, so the provider's count is the only exact one. It costs a
round trip (and that endpoint's own rate limit), so it is asked only where the count changes
a decision (:mod:`~hardcap_core.tokenize.routes`), and it is never waited on for long: past
:data:`TIMEOUT_S`, or on any error, the caller falls back to the calibrated bound. Errors of
this call end here (logged, never a client's error): the request goes on with the bound.

The cache: a conversation sends its earlier turns again with each new one, so every answer is
kept under a hash of the prompt through each message (the model, tools, tool choice and
thinking first). A prompt asked again is answered from the cache; one whose earlier turns were
counted and whose call fails is the cached count of that prefix plus the calibrated bound of
the messages after it. Anthropic calls its count an estimate that may differ from the bill "by
a small amount", so :data:`SLACK` and :data:`SLACK_TOKENS` are added to what it answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from hardcap_core import json_codec
from hardcap_core.chat import ChatRequest
from hardcap_core.config import Route
from hardcap_core.errors import GatewayError
from hardcap_core.logs import logger
from hardcap_core.providers.transport import Transport, TransportError, UpstreamRequest

TIMEOUT_S = 0.3  # the longest a request waits for the count before falling back to the bound
CACHE_ENTRIES = 4096  # prompt prefixes remembered per process (LRU)
SLACK = 0.01  # added to the API's count: it is an estimate of the bill ...
SLACK_TOKENS = 8  # ... "that may differ by a small amount"
COUNT_FIELDS = ("model", "system", "tools", "tool_choice", "thinking")


@dataclass(frozen=True, slots=True)
class Prefix:
    """The best the cache knows of a prompt: the count through ``messages`` of its messages
    (0 messages and no count: nothing known)."""

    messages: int
    tokens: int | None


class CountApi:
    """The count_tokens endpoint of a route's Anthropic upstream (see the module docstring)."""

    def __init__(self, transport: Transport, *, timeout_s: float = TIMEOUT_S) -> None:
        self.transport = transport
        self.timeout_s = timeout_s
        self._cache: OrderedDict[bytes, int] = OrderedDict()

    async def count(self, route: Route, chat: ChatRequest) -> int | Prefix:
        """The prompt's tokens with the slack (from the cache or the API), or, when the API
        does not answer in time, the longest counted :class:`Prefix` of it."""
        keys = prefix_keys(route.model, chat.body)
        cached = self._cache.get(keys[-1])
        if cached is not None:
            self._cache.move_to_end(keys[-1])
            return _slack(cached)
        tokens = await self._ask(route, chat)
        if tokens is None:
            return self._prefix(keys)
        self._remember(keys[-1], tokens)
        return _slack(tokens)

    async def _ask(self, route: Route, chat: ChatRequest) -> int | None:
        """The API's count, or None (logged) if it failed or took longer than the timeout."""
        # Imported here: only a config with count_api routes reaches it.
        from hardcap_core.providers.anthropic_request import ANTHROPIC_VERSION, messages_body

        try:
            full = messages_body(chat, route.model, route.max_output_tokens, stream=False)
        except GatewayError:  # what the provider cannot take, the call would refuse as well
            return None
        body = {k: full[k] for k in ("messages", *COUNT_FIELDS) if k in full}
        headers = {"content-type": "application/json", "anthropic-version": ANTHROPIC_VERSION}
        key = route.upstream.api_key()
        if key:
            headers["x-api-key"] = key
        url = route.upstream.base_url.rstrip("/") + "/messages/count_tokens"
        request = UpstreamRequest(url, headers, json_codec.dumps(body), self.timeout_s)
        try:
            async with asyncio.timeout(self.timeout_s):
                reply = await self.transport.send(request)
        except (TimeoutError, TransportError) as e:
            detail = {"route": route.name, "error": type(e).__name__}
            logger.info("count api: no answer in time", extra=detail)
            return None
        tokens = _tokens(reply.body) if reply.status == 200 else None
        if tokens is None:
            logger.warning("count api: unusable answer",
                           extra={"route": route.name, "status": reply.status})  # fmt: skip
        return tokens

    def _prefix(self, keys: list[bytes]) -> Prefix:
        for messages in range(len(keys) - 2, 0, -1):  # the longest counted prefix first
            tokens = self._cache.get(keys[messages])
            if tokens is not None:
                return Prefix(messages, _slack(tokens))
        return Prefix(0, None)

    def _remember(self, key: bytes, tokens: int) -> None:
        self._cache[key] = tokens
        self._cache.move_to_end(key)
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)


def prefix_keys(model: str, body: dict[str, Any]) -> list[bytes]:
    """A key per prefix of the prompt: ``[i]`` hashes the model, the tools, tool choice and
    thinking, then the first ``i`` messages (``[-1]``: the whole prompt)."""
    digest = hashlib.sha256(model.encode())
    head = {k: body.get(k) for k in COUNT_FIELDS[2:]}
    digest.update(json_codec.dumps(head))
    keys = [digest.digest()]
    for message in body.get("messages") or ():
        digest.update(json_codec.dumps(message))
        keys.append(digest.digest())
    return keys


def _slack(tokens: int) -> int:
    return tokens + math.ceil(tokens * SLACK) + SLACK_TOKENS


def _tokens(body: bytes) -> int | None:
    try:
        data = json_codec.loads(body)
    except ValueError:
        return None
    tokens = data.get("input_tokens") if isinstance(data, dict) else None
    return tokens if type(tokens) is int and tokens >= 0 else None
