"""OpenAI-compatible upstreams (OpenAI, vLLM, Groq, OpenRouter, DeepSeek, the mock, ...).

Sends the request's OpenAI-shaped body with the route's model and the output cap set, and
turns each ``chat.completion.chunk`` into an :class:`~hardcap_core.events.Event` with every
billed delta field counted: content, reasoning (``reasoning``, ``reasoning_content``,
``thinking``), refusals, tool-call and legacy function-call names and arguments.
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
from hardcap_core.errors import UpstreamFailed
from hardcap_core.events import Completion, Event, FinishReason, Output, OutputKind, Read, Usage
from hardcap_core.providers.http import (
    CONNECT_TIMEOUT_S,
    status_error,
    stream_error,
    transport_error,
)
from hardcap_core.tokens import streamed_tokens

DIALECT = "openai_chat"

# Delta (and message) text fields a provider bills as output. `reasoning` (vLLM, Groq,
# OpenRouter), `reasoning_content` (DeepSeek and others), `thinking` (translated Anthropic).
TEXT_FIELDS = (
    ("content", OutputKind.CONTENT),
    ("reasoning", OutputKind.REASONING),
    ("reasoning_content", OutputKind.REASONING),
    ("thinking", OutputKind.REASONING),
    ("refusal", OutputKind.REFUSAL),
)
CALL_FIELDS = (("name", OutputKind.TOOL_NAME), ("arguments", OutputKind.TOOL_ARGUMENTS))
CAP_FIELDS = ("max_tokens", "max_completion_tokens")
MALFORMED = "The provider sent a malformed stream event."


class OpenAICompatible:
    """A :class:`~hardcap_core.providers.base.Provider` for OpenAI-compatible APIs."""

    dialect = DIALECT

    def __init__(self, client: httpx.AsyncClient, *, chars_per_token: float = 4.0) -> None:
        self.client = client
        self.chars_per_token = chars_per_token

    async def complete(self, route: Route, request: ChatRequest, max_tokens: int) -> Completion:
        body = self._body(route, request, max_tokens, stream=False)
        try:
            response = await self.client.send(self._request(route, body, stream=False))
        except httpx.HTTPError as e:
            raise transport_error(route.name, e) from e
        if response.status_code >= 400:
            raise status_error(route.name, response.status_code, response.content)
        try:
            data = response.json()
        except ValueError as e:
            raise UpstreamFailed(f"Provider for '{route.name}' sent invalid JSON.") from e
        if not isinstance(data, dict):
            raise UpstreamFailed(f"Provider for '{route.name}' sent an unexpected body.")
        output = [
            out
            for i, choice in enumerate(_list(data.get("choices")))
            if isinstance(choice, dict)
            for out in self._outputs(choice.get("message"), i)
        ]
        finish = next((_finish(c) for c in _list(data.get("choices")) if _finish(c)), None)
        return Completion(
            data, output, sum(o.tokens for o in output), _usage(data.get("usage")), finish
        )

    @asynccontextmanager
    async def stream(
        self, route: Route, request: ChatRequest, max_tokens: int
    ) -> AsyncIterator[AsyncIterator[Read]]:
        body = self._body(route, request, max_tokens, stream=True)
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

    # -- requests -------------------------------------------------------------------------------

    def _body(
        self, route: Route, request: ChatRequest, max_tokens: int, *, stream: bool
    ) -> dict[str, Any]:
        body = dict(request.body, model=route.model)
        for name in CAP_FIELDS:
            body.pop(name, None)
        body[request.max_tokens_field] = max_tokens
        if stream:
            # Usage is what a stream is settled with: always ask for it; the client only sees
            # the usage chunk if it asked.
            options = body.get("stream_options") or {}
            body["stream_options"] = {**options, "include_usage": True}
        return body

    def _request(self, route: Route, body: dict[str, Any], *, stream: bool) -> httpx.Request:
        headers = {"content-type": "application/json", "accept": "application/json"}
        if stream:
            # The stream is parsed as it arrives: compression would only add buffering.
            headers["accept"] = "text/event-stream"
            headers["accept-encoding"] = "identity"
        key = route.upstream.api_key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        url = route.upstream.base_url.rstrip("/") + "/chat/completions"
        timeout = httpx.Timeout(route.upstream.timeout_seconds, connect=CONNECT_TIMEOUT_S)
        return self.client.build_request(
            "POST", url, headers=headers, content=json.dumps(body), timeout=timeout
        )

    # -- stream decoding ------------------------------------------------------------------------

    async def _reads(self, response: httpx.Response) -> AsyncGenerator[Read, None]:
        """One batch of events per network read. ``aiter_bytes`` undoes any content encoding
        a provider applied although we asked for none."""
        parser = sse.SSEParser()
        try:
            async for piece in response.aiter_bytes():
                yield [self._event(data) for data in parser.feed(piece)]
        except httpx.HTTPError as e:
            raise stream_error(e) from e
        tail = [self._event(data) for data in parser.flush()]
        if tail:
            yield tail

    def _event(self, data: str) -> Event:
        if data == sse.DONE:
            return Event(done=True)
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            return Event(error=MALFORMED)
        if type(chunk) is not dict:
            return Event()
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            return Event(chunk, error=f"The provider failed mid-stream: {message or 'error'}")
        output: list[Output] = []
        finish = None
        choices = chunk.get("choices")
        if type(choices) is list:
            for i, choice in enumerate(choices):
                if type(choice) is dict:
                    delta = choice.get("delta")
                    if delta:
                        output += self._outputs(delta, i)
                    if finish is None and choice.get("finish_reason") is not None:
                        finish = FinishReason.of(choice["finish_reason"])
        usage = chunk.get("usage")
        tokens = sum(o.tokens for o in output) if output else 0
        return Event(chunk, output, tokens, _usage(usage) if usage else None, finish)

    def _outputs(self, delta: Any, choice: int) -> list[Output]:
        """Every billed piece of one choice's delta (or whole message)."""
        if type(delta) is not dict:
            return []
        cpt = self.chars_per_token
        out = []
        for field, kind in TEXT_FIELDS:
            value = delta.get(field)
            if value and type(value) is str:
                out.append(Output(kind, value, streamed_tokens(value, cpt), choice))
        if "tool_calls" in delta or "function_call" in delta:
            out += self._calls(delta, choice)
        return out

    def _calls(self, delta: dict[str, Any], choice: int) -> list[Output]:
        """Tool-call and legacy function-call names and arguments."""
        calls = [(c.get("index", j), c.get("function")) for j, c in _dicts(delta.get("tool_calls"))]
        if isinstance(delta.get("function_call"), dict):
            calls.append((None, delta["function_call"]))
        out = []
        for index, fn in calls:
            if not isinstance(fn, dict):
                continue
            call = index if isinstance(index, int) else None
            for field, kind in CALL_FIELDS:
                value = fn.get(field)
                if isinstance(value, str) and value:
                    tokens = streamed_tokens(value, self.chars_per_token)
                    out.append(Output(kind, value, tokens, choice, call))
        return out


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[tuple[int, dict[str, Any]]]:
    return [(i, v) for i, v in enumerate(_list(value)) if isinstance(v, dict)]


def _finish(choice: Any) -> FinishReason | None:
    return FinishReason.of(choice.get("finish_reason")) if isinstance(choice, dict) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _usage(usage: Any) -> Usage | None:
    if not isinstance(usage, dict) or not usage:
        return None
    details = usage.get("completion_tokens_details")
    prompt_details = usage.get("prompt_tokens_details")
    return Usage(
        input_tokens=_int(usage.get("prompt_tokens")),
        output_tokens=_int(usage.get("completion_tokens")),
        reasoning_tokens=_int(details.get("reasoning_tokens"))
        if isinstance(details, dict)
        else None,
        cached_input_tokens=(
            _int(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else None
        ),
        raw=usage,
    )
