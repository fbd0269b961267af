"""What a provider sends back, in the gateway's own terms.

A provider (:mod:`hardcap_core.providers`) turns each network read of its upstream's stream
into a batch of :class:`Event`; the meter decides per batch whether output may go on, and a
wire format (:mod:`hardcap_core.wire`) encodes each event for the client. An event keeps the
provider's own chunk (``raw``) so a relay between the same dialects passes through fields the
gateway does not know.

Designed for three stream shapes: OpenAI-compatible SSE (one chunk carries deltas, a finish
reason and, at the end, usage; then ``[DONE]``), Anthropic Messages SSE (content_block_delta
events per kind, message_delta with stop_reason and usage, message_stop) and Bedrock
ConverseStream (AWS event-stream frames: contentBlockDelta with text, reasoningContent or
toolUse input; messageStop with stopReason; metadata with usage, after which the stream ends).
Each maps onto events of this one type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple


class OutputKind(StrEnum):
    """Kinds of billed output; every one counts against the budget."""

    CONTENT = "content"
    REASONING = "reasoning"  # reasoning / thinking text a provider streams and bills
    REFUSAL = "refusal"
    TOOL_NAME = "tool_name"
    TOOL_ARGUMENTS = "tool_arguments"
    OTHER = "other"  # billed output of a kind the gateway does not model (counted all the same)


class FinishReason(StrEnum):
    """Why the provider stopped, in OpenAI's vocabulary (wire formats map it to their own)."""

    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    CONTENT_FILTER = "content_filter"
    FUNCTION_CALL = "function_call"
    OTHER = "other"

    @classmethod
    def of(cls, value: object) -> FinishReason | None:
        if not isinstance(value, str) or not value:
            return None
        try:
            return cls(value)
        except ValueError:
            return cls.OTHER


class Output(NamedTuple):
    """One piece of billed output in an event. (A tuple: one is made per streamed delta.)"""

    kind: OutputKind
    text: str
    tokens: int  # billed tokens this piece carries, by the provider's counting rules
    choice: int = 0
    tool_call: int | None = None  # index of the tool call, for tool name and arguments
    # Tokens it surely carries (a lower bound): the gateway's own cap is checked on these,
    # so a provider that obeys the cap is never cut by an over-count.
    least: int = 1


@dataclass(frozen=True, slots=True)
class Usage:
    """What the provider reports it billed. None where it did not say.

    ``input_tokens`` is every input token billed, cached ones included (a provider that
    reports them apart, as Anthropic does, has them added in); ``cached_input_tokens`` and
    ``cache_write_input_tokens`` say how many of them were read from or written to the
    provider's prompt cache, each billed at its route's own price; of the writes,
    ``cache_write_1h_input_tokens`` were kept an hour (a dearer price). ``service_tier``: the
    tier the provider says it served (OpenAI's reply, Anthropic's usage), which sets the
    price."""

    input_tokens: int | None
    output_tokens: int | None
    reasoning_tokens: int | None = None
    cached_input_tokens: int | None = None
    cache_write_input_tokens: int | None = None
    raw: dict[str, Any] | None = None  # the provider's own usage object
    cache_write_1h_input_tokens: int | None = None
    service_tier: str | None = None
    # Server-tool uses it billed, by kind (Anthropic's usage.server_tool_use: web_search,
    # web_fetch); None: it did not say.
    tool_uses: tuple[tuple[str, int], ...] | None = None


@dataclass(slots=True)
class Event:
    """One provider event. ``raw`` is the provider's chunk; a same-dialect encoder may forward
    it (and may change it in place: nothing else reads it afterwards)."""

    raw: dict[str, Any] | None = None
    output: Sequence[Output] = ()
    tokens: int = 0  # billed output tokens in this event (sum over ``output``)
    usage: Usage | None = None
    finish: FinishReason | None = None
    error: str | None = None  # the provider reported a failure mid-stream
    done: bool = False  # the provider said the stream is complete ([DONE], message_stop)


Read = Sequence[Event]  # the events of one network read


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole (non-streamed) reply."""

    raw: dict[str, Any]
    output: Sequence[Output]
    tokens: int  # billed output tokens counted from ``output``
    usage: Usage | None
    finish: FinishReason | None
