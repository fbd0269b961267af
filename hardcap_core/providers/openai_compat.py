"""OpenAI-compatible upstreams (OpenAI, vLLM, Groq, OpenRouter, DeepSeek, the mock, ...).

Sends the request's OpenAI-shaped body with the route's model and the output cap set, and
turns each ``chat.completion.chunk`` into an :class:`~hardcap_core.events.Event` with every
billed delta field counted.

The rule for a delta (or a whole reply's message): every field is billed output unless it is
known not to be. Known billed fields are counted by their kind: content, reasoning
(``reasoning``, ``reasoning_content``, ``thinking``), refusals, tool-call and legacy
function-call names and arguments, and audio (``audio.data`` by :data:`AUDIO_BYTES_PER_TOKEN`,
``audio.transcript`` as text). Any other field, and a known field whose value is not the text
it should be (Mistral streams ``content`` as a list of parts), counts by its length as
:attr:`~hardcap_core.events.OutputKind.OTHER`: a field this module does not know is never free.
Known not to be output, and not counted: the labels and ids listed in :data:`NOT_BILLED`,
:data:`CALL_NOT_BILLED` and :data:`AUDIO_NOT_BILLED`, and empty values (null, "", [], {}, 0),
which carry nothing. Outside the delta (the choice's ``index``, ``finish_reason``,
``logprobs``; the chunk's ``id``, ``model``, ``usage``, ...) a chunk holds metadata, not
output: ``logprobs`` repeat the tokens already counted in the delta and are not billed.

"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any

from hardcap_core import json_codec, sse
from hardcap_core.chat import (
    ANTHROPIC_MESSAGES,
    OPENAI_CHAT,
    OPENAI_EMBEDDINGS,
    OPENAI_RESPONSES,
    ChatRequest,
)
from hardcap_core.config import Route
from hardcap_core.config.settings import DEFAULT_GATEWAY
from hardcap_core.errors import UpstreamMalformed
from hardcap_core.events import Completion, Event, FinishReason, Output, OutputKind, Read, Usage
from hardcap_core.providers.http import open_sse, post, send_json
from hardcap_core.providers.transport import Transport, UpstreamRequest
from hardcap_core.tokenize.heuristics import streamed_tokens, text_tokens

DIALECT = OPENAI_CHAT

# Delta (and message) text fields a provider bills as output. `reasoning` (vLLM, Groq,
# OpenRouter), `reasoning_content` (DeepSeek and others), `thinking` (translated Anthropic).
TEXT_FIELDS = {
    "content": OutputKind.CONTENT,
    "reasoning": OutputKind.REASONING,
    "reasoning_content": OutputKind.REASONING,
    "thinking": OutputKind.REASONING,
    "refusal": OutputKind.REFUSAL,
}
CALL_FIELDS = {"name": OutputKind.TOOL_NAME, "arguments": OutputKind.TOOL_ARGUMENTS}
# Delta fields known not to be billed output. Each one is listed for a reason; anything not
# listed counts by its length.
NOT_BILLED = frozenset(
    {
        "role",  # who speaks: a label the model does not generate as output
        "token_id",  # Together: the id of the token whose text is in `content`, counted there
        "obfuscation",  # OpenAI's stream padding: random characters, by definition not output
    }
)
CALL_NOT_BILLED = frozenset({"index", "id", "type"})  # a tool call's position, id and kind
AUDIO_NOT_BILLED = frozenset({"id", "expires_at"})  # the audio's id and storage expiry
# Audio output is billed by duration: OpenAI bills assistant audio at 1 token per 50 ms, and
# streams it (chat completions can only stream `pcm16`) as 24 kHz 16-bit mono PCM, 48,000
# bytes a second: 2,400 bytes per billed token. Counted at 1,600 bytes per token: 1.5 times
# that rate, and exactly the rate of 16 kHz PCM, the lowest rate a speech model streams.
# Overcounting only grows the hold sooner and cuts sooner at the budget's end; settlement
# uses the provider's usage. (Compressed formats carry more audio per byte, but cannot be
# streamed; a whole reply is capped and settled by its usage.)
AUDIO_BYTES_PER_TOKEN = 1_600
# OpenAI's own rate for the pcm16 it streams (24 kHz, 1 token per 50 ms): audio surely carries
# this many tokens, the lower bound the gateway's cap is checked on.
AUDIO_BYTES_PER_TOKEN_EXACT = 2_400
CAP_FIELDS = ("max_tokens", "max_completion_tokens")
MALFORMED = "The provider sent a malformed stream event."


class OpenAICompatible:
    """A :class:`~hardcap_core.providers.base.Provider` for OpenAI-compatible APIs."""

    dialect = DIALECT

    def __init__(
        self, client: Transport, *, chars_per_token: float = DEFAULT_GATEWAY.chars_per_token
    ) -> None:
        self.client = client
        self.chars_per_token = chars_per_token

    async def complete(self, route: Route, request: ChatRequest, max_tokens: int) -> Completion:
        if request.dialect == OPENAI_EMBEDDINGS:
            return await self._embed(route, request)
        body = self._body(route, request, max_tokens, stream=False)
        data = await send_json(self.client, self._request(route, body, stream=False), route.name)
        if "error" in data:
            error = data["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise UpstreamMalformed(f"The provider for '{route.name}' failed: {message}")
        output = [
            out
            for i, choice in enumerate(_list(data.get("choices")))
            if isinstance(choice, dict)
            for out in self._outputs(choice.get("message"), i)
        ]
        finish = next((_finish(c) for c in _list(data.get("choices")) if _finish(c)), None)
        usage = _usage(data.get("usage"), data.get("service_tier"))
        return Completion(data, output, sum(o.tokens for o in output), usage, finish)

    def stream(
        self, route: Route, request: ChatRequest, max_tokens: int
    ) -> AbstractAsyncContextManager[AsyncIterator[Read]]:
        body = self._body(route, request, max_tokens, stream=True)
        return open_sse(
            self.client, self._request(route, body, stream=True), route.name, self._event
        )

    async def _embed(self, route: Route, request: ChatRequest) -> Completion:
        """An embeddings request, sent as it came to ``/embeddings``: it bills only its input
        (``usage.prompt_tokens``); no output."""
        body = dict(request.body, model=route.model)
        request_ = self._request(route, body, stream=False, path="/embeddings")
        data = await send_json(self.client, request_, route.name)
        if "error" in data:
            error = data["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise UpstreamMalformed(f"The provider for '{route.name}' failed: {message}")
        usage = data.get("usage")
        prompt = _int(usage.get("prompt_tokens")) if isinstance(usage, dict) else None
        billed = Usage(prompt, 0, raw=usage if isinstance(usage, dict) else None)
        return Completion(data, (), 0, billed, FinishReason.STOP)

    # -- requests -------------------------------------------------------------------------------

    def _body(
        self, route: Route, request: ChatRequest, max_tokens: int, *, stream: bool
    ) -> dict[str, Any]:
        body = dict(request.body, model=route.model)
        for name in CAP_FIELDS:
            body.pop(name, None)
        if request.dialect in (ANTHROPIC_MESSAGES, OPENAI_RESPONSES):
            body = _without_anthropic_fields(body)  # a Responses turn's signed thinking too
        body[request.max_tokens_field] = max_tokens
        if stream:
            # Usage is what a stream is settled with: always ask for it; the client only sees
            # the usage chunk if it asked.
            options = body.get("stream_options") or {}
            body["stream_options"] = {**options, "include_usage": True}
        return body

    def _request(
        self, route: Route, body: dict[str, Any], *, stream: bool, path: str = "/chat/completions"
    ) -> UpstreamRequest:
        headers = {"content-type": "application/json", "accept": "application/json"}
        if stream:
            # The stream is parsed as it arrives: compression would only add buffering.
            headers["accept"] = "text/event-stream"
            headers["accept-encoding"] = "identity"
        key = route.upstream.api_key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        url = route.upstream.base_url.rstrip("/") + path
        u = route.upstream
        return post(url, headers, body, u.timeout_seconds, u.head_timeout_seconds)

    # -- stream decoding ------------------------------------------------------------------------

    def _event(self, data: str) -> Event:
        if data == sse.DONE:
            return Event(done=True)
        try:
            chunk = json_codec.loads(data)
        except json_codec.JSONDecodeError:
            return Event(error=MALFORMED)
        if type(chunk) is not dict:
            # Not a chunk (a JSON array, a string, a number): nothing to forward, but what it
            # holds may be output a provider billed, so it counts by its length.
            other = self._other(chunk, 0)
            return Event(output=other, tokens=sum(o.tokens for o in other))
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
        usage = _usage(usage, chunk.get("service_tier")) if usage else None
        return Event(chunk, output, tokens, usage, finish)

    def _outputs(self, delta: Any, choice: int) -> list[Output]:
        """Every billed piece of one choice's delta (or whole message), by the module's rule:
        known fields by their kind, known labels not at all, anything else by its length."""
        if type(delta) is not dict:
            return self._other(delta, choice)  # not an object: whatever it holds is counted
        cpt = self.chars_per_token
        out: list[Output] = []
        for field, value in delta.items():
            if not value or field in NOT_BILLED:
                continue  # null, "", [], {}, 0: nothing was generated
            kind = TEXT_FIELDS.get(field)
            if kind is not None:
                if type(value) is str:
                    out.append(Output(kind, value, streamed_tokens(value, cpt), choice))
                else:
                    out += self._other(value, choice, kind)
            elif field == "tool_calls":
                out += self._tool_calls(value, choice)
            elif field == "function_call":
                out += self._function(value, choice, None)  # legacy: one call, no index
            elif field == "audio":
                out += self._audio(value, choice)
            else:
                out += self._other(value, choice)
        return out

    def _tool_calls(self, calls: Any, choice: int) -> list[Output]:
        """Names and arguments of each tool call; its index, id and type are not billed."""
        if type(calls) is not list:
            return self._other(calls, choice)
        out: list[Output] = []
        for j, item in enumerate(calls):
            if type(item) is not dict:
                out += self._other(item, choice)
                continue
            index = item.get("index", j)
            call = index if isinstance(index, int) and not isinstance(index, bool) else None
            for field, value in item.items():
                if not value or field in CALL_NOT_BILLED:
                    continue
                if field == "function":
                    out += self._function(value, choice, call)
                else:
                    out += self._other(value, choice, tool_call=call)
        return out

    def _function(self, fn: Any, choice: int, call: int | None) -> list[Output]:
        """A (tool or legacy) function call's name and arguments; other fields by length."""
        if type(fn) is not dict:
            return self._other(fn, choice, tool_call=call)
        cpt = self.chars_per_token
        out: list[Output] = []
        for field, value in fn.items():
            if not value:
                continue
            kind = CALL_FIELDS.get(field, OutputKind.OTHER)
            if type(value) is str:
                out.append(Output(kind, value, streamed_tokens(value, cpt), choice, call))
            else:
                out += self._other(value, choice, kind, call)
        return out

    def _audio(self, audio: Any, choice: int) -> list[Output]:
        """``audio.data`` (base64) by :data:`AUDIO_BYTES_PER_TOKEN`, the transcript as text;
        its id and expiry are not billed. The data's piece carries no text: it is not text."""
        if type(audio) is not dict:
            return self._other(audio, choice)
        out: list[Output] = []
        for field, value in audio.items():
            if not value or field in AUDIO_NOT_BILLED:
                continue
            if field == "data" and type(value) is str:
                least = _decoded_size(value) // AUDIO_BYTES_PER_TOKEN_EXACT
                out.append(Output(OutputKind.OTHER, "", audio_tokens(value), choice, None, least))
            else:
                out += self._other(value, choice)
        return out

    def _other(
        self,
        value: Any,
        choice: int,
        kind: OutputKind = OutputKind.OTHER,
        tool_call: int | None = None,
    ) -> list[Output]:
        """A value the decoder has no rule for, counted by its length (text as streamed, any
        other value as its compact JSON); empty values are nothing."""
        if not value:
            return []
        if type(value) is str:
            tokens = streamed_tokens(value, self.chars_per_token)
            return [Output(kind, value, tokens, choice, tool_call)]
        text = json.dumps(value, separators=(",", ":"))
        return [Output(kind, text, text_tokens(text, self.chars_per_token), choice, tool_call)]


# What a request that came in Anthropic's format keeps for the counters and an OpenAI-compatible
# API rejects as unknown: extended thinking, top_k, its output and context configuration,
# prompt-cache marks (the body's, its messages', their parts' and its tools').
ANTHROPIC_ONLY = ("thinking", "top_k", "output_config", "context_management", "cache_control")


def _without_anthropic_fields(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without the Anthropic-only fields (top level, in messages, parts and tools)."""
    out = {k: v for k, v in body.items() if k not in ANTHROPIC_ONLY}
    messages = []
    for message in out.get("messages") or []:
        if isinstance(message, dict):
            message = {
                k: v for k, v in message.items() if k not in ("thinking_blocks", "cache_control")
            }
            content = message.get("content")
            if isinstance(content, list):
                message["content"] = [_no_cache_mark(part) for part in content]
        messages.append(message)
    out["messages"] = messages
    if isinstance(out.get("tools"), list):
        out["tools"] = [_no_cache_mark(tool) for tool in out["tools"]]
    return out


def _no_cache_mark(item: Any) -> Any:
    return (
        {k: v for k, v in item.items() if k != "cache_control"} if isinstance(item, dict) else item
    )


def audio_tokens(data: str) -> int:
    """Tokens billed for base64 audio ``data``: its decoded size (3 bytes per 4 characters,
    less the padding) at :data:`AUDIO_BYTES_PER_TOKEN`; at least one. Not decoded: a chunk
    that is not valid base64 still counts by its size."""
    return max(1, math.ceil(_decoded_size(data) / AUDIO_BYTES_PER_TOKEN))


def _decoded_size(data: str) -> int:
    """Bytes that base64 ``data`` decodes to: 3 per 4 characters, less the padding."""
    padding = 2 if data.endswith("==") else 1 if data.endswith("=") else 0
    return max(len(data) * 3 // 4 - padding, 0)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _finish(choice: Any) -> FinishReason | None:
    return FinishReason.of(choice.get("finish_reason")) if isinstance(choice, dict) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _usage(usage: Any, tier: Any = None) -> Usage | None:
    """The usage object of a reply or chunk, with the service tier the reply says it was
    served at (OpenAI puts it beside the usage, not in it)."""
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
        service_tier=tier if isinstance(tier, str) and tier else None,
    )
