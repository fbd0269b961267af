"""Anthropic Messages events (and whole ``message`` bodies) decoded into Hardcap's events, with
every billed piece counted.

Counted, by kind: ``text_delta`` and text blocks (content), ``thinking_delta`` and thinking
blocks (reasoning), ``signature_delta`` and ``redacted_thinking`` data (reasoning, see below),
``input_json_delta`` and a tool_use block's input (tool arguments), a tool_use block's name at
``content_block_start`` (tool name). Anything else a content block or delta carries (citations,
server tool blocks, kinds added later) counts by its length as other output; an event of an
unknown type counts by its length too. Not output: ``ping``, block indexes, ids, ``type``
labels, ``stop_reason`` / ``stop_sequence``, and the usage objects.

Signatures are counted. Anthropic's extended-thinking documentation (as mirrored in AWS's
Bedrock guide, "Thinking encryption") says the full thinking is encrypted and returned in the
signature field, sent as a ``signature_delta`` just before ``content_block_stop``; on Claude 4
models the streamed thinking is a summary while the bill is the full thinking. So the visible
thinking text can be far shorter than what is billed, and the signature is the only piece of
the stream that grows with the rest: counting it by its length (as reasoning that carries no
text, and no lower bound for the cap check) keeps the live count from falling behind the bill.
``redacted_thinking`` (encrypted thinking) is counted the same way.

Usage arrives in two events: ``message_start`` carries the input (``input_tokens`` plus
``cache_read_input_tokens`` and ``cache_creation_input_tokens``, which Anthropic reports apart
and :class:`~hardcap_core.events.Usage` adds in) and ``message_delta`` the cumulative
``output_tokens`` (and, on newer models, input counts again); each event that carries usage
gets the merged usage so far, and the relay keeps the last.
"""

from __future__ import annotations

import json
from typing import Any

from hardcap_core import json_codec
from hardcap_core.events import Completion, Event, FinishReason, Output, OutputKind, Usage
from hardcap_core.tokenize.heuristics import streamed_tokens, text_tokens

MALFORMED = "The provider sent a malformed stream event."
FINISH = {
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "max_tokens": FinishReason.LENGTH,
    "tool_use": FinishReason.TOOL_CALLS,
    "refusal": FinishReason.CONTENT_FILTER,
}
DELTA_TEXT = {
    "text_delta": ("text", OutputKind.CONTENT),
    "thinking_delta": ("thinking", OutputKind.REASONING),
    "input_json_delta": ("partial_json", OutputKind.TOOL_ARGUMENTS),
}
BLOCK_NOT_BILLED = frozenset({"type", "id", "tool_use_id", "cache_control"})
# A server tool's results (search results, a fetched page): streamed to the client, but billed
# as input of the next sampling turn, not as output. The hold has input for them
# (money.tool_hold), the provider's final report counts them; counted as output, a search's
# encrypted results (kilobytes each) would look like thousands of output tokens and cut the
# stream at its cap.
SERVER_RESULT_BLOCKS = frozenset({"web_search_tool_result", "web_fetch_tool_result"})
USAGE_FIELDS = (
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens",
)


def finish_reason(stop_reason: Any) -> FinishReason | None:
    """OpenAI's finish reason for an Anthropic ``stop_reason`` (None when there is none)."""
    if not isinstance(stop_reason, str) or not stop_reason:
        return None
    return FINISH.get(stop_reason, FinishReason.OTHER)


def usage_of(raw: dict[str, Any]) -> Usage:
    """:class:`Usage` from an Anthropic usage object (cache reads and writes added in; the
    writes split by how long they are kept, ``cache_creation``, and the service tier)."""
    counts = {k: v for k in USAGE_FIELDS if isinstance(v := raw.get(k), int)}
    split = raw.get("cache_creation")
    split = split if isinstance(split, dict) else {}
    hour, minutes = (split.get(f"ephemeral_{ttl}_input_tokens") for ttl in ("1h", "5m"))
    hour = hour if isinstance(hour, int) else None
    if "cache_creation_input_tokens" not in counts and hour is not None:
        counts["cache_creation_input_tokens"] = hour + (minutes if isinstance(minutes, int) else 0)
    read = counts.get("cache_read_input_tokens", 0)
    written = counts.get("cache_creation_input_tokens", 0)
    tier = raw.get("service_tier")
    details = raw.get("output_tokens_details")
    thinking = details.get("thinking_tokens") if isinstance(details, dict) else None
    has_input = "input_tokens" in counts or read or written
    server = raw.get("server_tool_use")
    tool_uses = None
    if isinstance(server, dict):  # web_search_requests: 3 -> ("web_search", 3)
        tool_uses = tuple(
            (name.removesuffix("_requests"), n) for name, n in server.items()
            if isinstance(n, int) and not isinstance(n, bool)
        )  # fmt: skip
    return Usage(
        input_tokens=counts.get("input_tokens", 0) + read + written if has_input else None,
        output_tokens=counts.get("output_tokens"),
        reasoning_tokens=thinking if isinstance(thinking, int) else None,
        cached_input_tokens=read if "cache_read_input_tokens" in counts else None,
        cache_write_input_tokens=written if "cache_creation_input_tokens" in counts else None,
        raw=dict(raw),
        cache_write_1h_input_tokens=hour,
        service_tier=tier if isinstance(tier, str) and tier else None,
        tool_uses=tool_uses,
    )


class MessageDecoder:
    """Decodes one stream's events; remembers each content block's kind and tool-call index."""

    def __init__(self, chars_per_token: float) -> None:
        self.cpt = chars_per_token
        self.blocks: dict[int, str] = {}  # content block index -> block type
        self.calls: dict[int, int] = {}  # content block index -> tool-call index
        self.usage: dict[str, Any] = {}  # the usage reported so far, merged

    def event(self, data: str) -> Event:
        """The event for one SSE ``data`` payload."""
        try:
            chunk = json_codec.loads(data)
        except json_codec.JSONDecodeError:
            return Event(error=MALFORMED)
        if type(chunk) is not dict:
            other = self.other(chunk)
            return Event(output=other, tokens=sum(o.tokens for o in other))
        kind = chunk.get("type")
        output: list[Output] = []
        usage = finish = None
        if kind == "ping" or kind == "content_block_stop":
            pass
        elif kind == "message_start":
            message = chunk.get("message")
            message = message if isinstance(message, dict) else {}
            for block in _list(message.get("content")):  # empty in practice: counted if not
                output += self.block(block, len(self.blocks))
            usage = self._merge(message.get("usage"))
        elif kind == "content_block_start":
            output = self.block(chunk.get("content_block"), chunk.get("index"))
        elif kind == "content_block_delta":
            output = self.delta(chunk.get("delta"), chunk.get("index"))
        elif kind == "message_delta":
            delta = chunk.get("delta")
            if isinstance(delta, dict):
                finish = finish_reason(delta.get("stop_reason"))
            usage = self._merge(chunk.get("usage"))
        elif kind == "message_stop":
            return Event(chunk, done=True)
        elif kind == "error":
            error = chunk.get("error")
            message = error.get("message") if isinstance(error, dict) else error
            return Event(chunk, error=f"The provider failed mid-stream: {message or 'error'}")
        else:
            output = self.other({k: v for k, v in chunk.items() if k != "type"})
        tokens = sum(o.tokens for o in output)
        return Event(chunk, output, tokens, usage, finish)

    def _merge(self, raw: Any) -> Usage | None:
        if not isinstance(raw, dict):
            return None
        self.usage.update({k: v for k, v in raw.items() if v is not None})
        return usage_of(self.usage)

    def block(self, block: Any, index: Any) -> list[Output]:
        """A content block as it starts (or a whole reply's block): what it already holds."""
        if not isinstance(block, dict):
            return self.other(block)
        kind = block.get("type")
        at = index if isinstance(index, int) else len(self.blocks)
        self.blocks[at] = str(kind)
        if kind in SERVER_RESULT_BLOCKS:
            return []
        call = None
        if kind == "tool_use":
            call = self.calls.setdefault(at, len(self.calls))
        out: list[Output] = []
        for field, value in block.items():
            if not value or field in BLOCK_NOT_BILLED:
                continue
            if kind == "text" and field == "text":
                out += self.text(OutputKind.CONTENT, value)
            elif kind == "thinking" and field == "thinking":
                out += self.text(OutputKind.REASONING, value)
            elif field in ("signature", "data") and kind in ("thinking", "redacted_thinking"):
                out += self.opaque(value)
            elif kind == "tool_use" and field == "name":
                out += self.text(OutputKind.TOOL_NAME, value, call)
            elif kind == "tool_use" and field == "input":
                out += self.other(value, OutputKind.TOOL_ARGUMENTS, call)
            else:
                out += self.other(value, tool_call=call)
        return out

    def delta(self, delta: Any, index: Any) -> list[Output]:
        """A ``content_block_delta``'s billed pieces."""
        if not isinstance(delta, dict):
            return self.other(delta)
        call = self.calls.get(index) if isinstance(index, int) else None
        kind = delta.get("type")
        if kind == "signature_delta":
            return self.opaque(delta.get("signature"))
        known = DELTA_TEXT.get(str(kind))
        out: list[Output] = []
        for field, value in delta.items():
            if not value or field == "type":
                continue
            if known is not None and field == known[0]:
                out += self.text(known[1], value, call)
            else:
                out += self.other(value, tool_call=call)
        return out

    def text(self, kind: OutputKind, value: Any, call: int | None = None) -> list[Output]:
        """A text piece of ``kind``; a value that is not text counts by its length."""
        if type(value) is not str:
            return self.other(value, kind, call)
        return [Output(kind, value, streamed_tokens(value, self.cpt), 0, call)]

    def opaque(self, value: Any) -> list[Output]:
        """An encrypted piece of thinking: billed reasoning by its length, no text to show,
        and no lower bound (its length is not a token count)."""
        if not value:
            return []
        text = value if isinstance(value, str) else json.dumps(value)
        return [Output(OutputKind.REASONING, "", text_tokens(text, self.cpt), 0, None, 0)]

    def other(
        self, value: Any, kind: OutputKind = OutputKind.OTHER, tool_call: int | None = None
    ) -> list[Output]:
        """A value with no rule, counted by its length (text as streamed, else its JSON). As
        output of an unknown kind it carries no text: nothing to show a client (a tool call's
        input given whole keeps its JSON: it is the call's arguments)."""
        if not value:
            return []
        if type(value) is str:
            tokens = streamed_tokens(value, self.cpt)
            text = value
        else:
            text = json.dumps(value, separators=(",", ":"))
            tokens = text_tokens(text, self.cpt)
        shown = "" if kind is OutputKind.OTHER else text
        return [Output(kind, shown, tokens, 0, tool_call)]


def completion(data: dict[str, Any], chars_per_token: float) -> Completion:
    """A whole ``message`` body as a :class:`Completion`."""
    decoder = MessageDecoder(chars_per_token)
    output = [
        out
        for index, block in enumerate(_list(data.get("content")))
        for out in decoder.block(block, index)
    ]
    for field, value in data.items():
        # Fields of a message that are not output; anything else counts by its length.
        if field not in ("id", "type", "role", "model", "content", "stop_reason",
                         "stop_sequence", "usage", "container", "context_management"):  # fmt: skip
            output += decoder.other(value)
    raw_usage = data.get("usage")
    usage = usage_of(raw_usage) if isinstance(raw_usage, dict) else None
    return Completion(
        data, output, sum(o.tokens for o in output), usage, finish_reason(data.get("stop_reason"))
    )


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
