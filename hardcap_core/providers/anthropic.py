"""Anthropic's Messages API as an upstream.

The OpenAI-shaped request is translated into a Messages request
(:mod:`~hardcap_core.providers.anthropic_request`), sent to ``{base_url}/messages`` with the
route's key in ``x-api-key`` and ``anthropic-version: 2023-06-01``; the reply's events are
decoded with every billed piece counted (:mod:`~hardcap_core.providers.anthropic_events`:
text, thinking, signatures, tool names and input, anything unknown by its length). Error
statuses become client errors in :func:`~hardcap_core.providers.http.status_error`; Anthropic's
529 (overloaded) is a 5xx there like any other.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from hardcap_core import sse
from hardcap_core.chat import ChatRequest
from hardcap_core.config import Route
from hardcap_core.errors import UpstreamMalformed
from hardcap_core.events import Completion, Read
from hardcap_core.providers.anthropic_events import MessageDecoder, completion
from hardcap_core.providers.anthropic_request import ANTHROPIC_VERSION, messages_body
from hardcap_core.providers.http import (
    CONNECT_TIMEOUT_S,
    status_error,
    stream_error,
    transport_error,
)

DIALECT = "anthropic_messages"


class AnthropicMessages:
    """A :class:`~hardcap_core.providers.base.Provider` for Anthropic's Messages API."""

    dialect = DIALECT

    def __init__(self, http: httpx.AsyncClient, *, chars_per_token: float = 4.0) -> None:
        self.client = http
        self.chars_per_token = chars_per_token

    async def complete(self, route: Route, request: ChatRequest, max_tokens: int) -> Completion:
        body = messages_body(request, route.model, max_tokens, stream=False)
        try:
            response = await self.client.send(self._request(route, body, stream=False))
        except httpx.HTTPError as e:
            raise transport_error(route.name, e) from e
        if response.status_code >= 400:
            raise status_error(route.name, response.status_code, response.content)
        # Past this point the provider answered 200: it generated, and bills, the reply.
        try:
            data = response.json()
        except ValueError as e:
            raise UpstreamMalformed(f"Provider for '{route.name}' sent invalid JSON.") from e
        if not isinstance(data, dict):
            raise UpstreamMalformed(f"Provider for '{route.name}' sent an unexpected body.")
        if data.get("type") == "error":
            error = data.get("error")
            message = error.get("message") if isinstance(error, dict) else error
            raise UpstreamMalformed(f"The provider for '{route.name}' failed: {message}")
        return completion(data, self.chars_per_token)

    @asynccontextmanager
    async def stream(
        self, route: Route, request: ChatRequest, max_tokens: int
    ) -> AsyncIterator[AsyncIterator[Read]]:
        body = messages_body(request, route.model, max_tokens, stream=True)
        try:
            response = await self.client.send(self._request(route, body, stream=True), stream=True)
        except httpx.HTTPError as e:
            raise transport_error(route.name, e) from e
        reads = self._reads(response)
        try:
            if response.status_code >= 400:
                raise status_error(route.name, response.status_code, await response.aread())
            yield reads
        finally:
            await reads.aclose()
            await response.aclose()

    def _request(self, route: Route, body: dict[str, Any], *, stream: bool) -> httpx.Request:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if stream else "application/json",
            "anthropic-version": ANTHROPIC_VERSION,
        }
        if stream:
            headers["accept-encoding"] = "identity"  # parsed as it arrives: no buffering
        key = route.upstream.api_key()
        if key:
            headers["x-api-key"] = key
        url = route.upstream.base_url.rstrip("/") + "/messages"
        timeout = httpx.Timeout(route.upstream.timeout_seconds, connect=CONNECT_TIMEOUT_S)
        return self.client.build_request(
            "POST", url, headers=headers, content=json.dumps(body), timeout=timeout
        )

    async def _reads(self, response: httpx.Response) -> AsyncGenerator[Read, None]:
        """One batch of events per network read."""
        parser = sse.SSEParser()
        decoder = MessageDecoder(self.chars_per_token)
        try:
            async for piece in response.aiter_bytes():
                yield [decoder.event(data) for data in parser.feed(piece)]
        except httpx.HTTPError as e:
            raise stream_error(e) from e
        tail = [decoder.event(data) for data in parser.flush()]
        if tail:
            yield tail
