"""Anthropic's Messages API as an upstream.

The OpenAI-shaped request is translated into a Messages request
(:mod:`~hardcap_core.providers.anthropic_request`), sent to ``{base_url}/messages`` with the
route's key in ``x-api-key``, ``anthropic-version: 2023-06-01`` and the client's
``anthropic-beta`` values (a 1M-context one only where the route prices long context:
:func:`~hardcap_core.wire.anthropic_request.check_betas`); the reply's events are
decoded with every billed piece counted (:mod:`~hardcap_core.providers.anthropic_events`:
text, thinking, signatures, tool names and input, anything unknown by its length). Error
statuses become client errors in :func:`~hardcap_core.providers.http.status_error`; Anthropic's
529 (overloaded) is a 5xx there like any other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any

from hardcap_core.chat import ANTHROPIC_MESSAGES, ChatRequest
from hardcap_core.config import Route
from hardcap_core.config.settings import DEFAULT_GATEWAY
from hardcap_core.errors import UpstreamMalformed
from hardcap_core.events import Completion, Read
from hardcap_core.providers.anthropic_events import MessageDecoder, completion
from hardcap_core.providers.anthropic_request import ANTHROPIC_VERSION, messages_body
from hardcap_core.providers.base import no_embeddings
from hardcap_core.providers.http import open_sse, post, send_json
from hardcap_core.providers.transport import Transport, UpstreamRequest
from hardcap_core.wire.anthropic_request import BETA_HEADER, check_betas

DIALECT = ANTHROPIC_MESSAGES


class AnthropicMessages:
    """A :class:`~hardcap_core.providers.base.Provider` for Anthropic's Messages API."""

    dialect = DIALECT

    def __init__(
        self, http: Transport, *, chars_per_token: float = DEFAULT_GATEWAY.chars_per_token
    ) -> None:
        self.client = http
        self.chars_per_token = chars_per_token

    async def complete(self, route: Route, request: ChatRequest, max_tokens: int) -> Completion:
        no_embeddings(request)
        body = messages_body(request, route.model, max_tokens, stream=False)
        upstream = self._request(route, request, body, stream=False)
        data = await send_json(self.client, upstream, route.name)
        if data.get("type") == "error":
            error = data.get("error")
            message = error.get("message") if isinstance(error, dict) else error
            raise UpstreamMalformed(f"The provider for '{route.name}' failed: {message}")
        return completion(data, self.chars_per_token)

    def stream(
        self, route: Route, request: ChatRequest, max_tokens: int
    ) -> AbstractAsyncContextManager[AsyncIterator[Read]]:
        body = messages_body(request, route.model, max_tokens, stream=True)
        decoder = MessageDecoder(self.chars_per_token)  # one per stream: it keeps block state
        return open_sse(self.client, self._request(route, request, body, stream=True),
                        route.name, decoder.event)  # fmt: skip

    def _request(
        self, route: Route, request: ChatRequest, body: dict[str, Any], *, stream: bool
    ) -> UpstreamRequest:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if stream else "application/json",
            "anthropic-version": ANTHROPIC_VERSION,
        }
        if stream:
            headers["accept-encoding"] = "identity"  # parsed as it arrives: no buffering
        if request.betas:
            check_betas(request, long_context_priced=route.prices.long_context is not None)
            headers[BETA_HEADER] = ",".join(request.betas)
        key = route.upstream.api_key()
        if key:
            headers["x-api-key"] = key
        url = route.upstream.base_url.rstrip("/") + "/messages"
        u = route.upstream
        return post(url, headers, body, u.timeout_seconds, u.head_timeout_seconds)
