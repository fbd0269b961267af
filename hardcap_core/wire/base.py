"""The wire-format interface: what a client speaks, parsed in and encoded back out.

One implementation per client format (OpenAI chat completions today; Anthropic Messages is to
come, its own module here). A format parses and validates a body into a
:class:`~hardcap_core.chat.ChatRequest` (raising :class:`~hardcap_core.errors.InvalidRequest`
naming the field), and encodes what the gateway sends back: stream events, the closing events,
whole replies, errors, budget headers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hardcap_core.chat import ChatRequest
from hardcap_core.errors import GatewayError
from hardcap_core.events import Completion, Event, Usage
from hardcap_core.ledger import BudgetState, RateState


@dataclass(frozen=True, slots=True)
class Charged:
    """What a request was charged, for the usage the client sees at the end."""

    input_tokens: int
    output_tokens: int
    provider_usage: Usage | None  # the provider's own report, when the stream completed


class StreamEncoder(Protocol):
    """Encodes one stream for the client; one per request (it remembers ids)."""

    def event(self, event: Event) -> bytes | None:
        """Bytes for one provider event, or None if the client gets nothing for it."""
        ...

    def close(self, *, cut: bool, charged: Charged) -> bytes:
        """The stream's last bytes: the closing event (``cut``: ended for length), the usage
        if the client asked for it, and the end-of-stream marker."""
        ...

    def error(self, error: GatewayError) -> bytes:
        """An error event, for a failure after the response began."""
        ...


class WireFormat(Protocol):
    """A client format, e.g. OpenAI chat completions."""

    dialect: str

    def parse(self, raw: bytes) -> ChatRequest:
        """Validate a request body; raise InvalidRequest naming the bad field. The request's
        ``input_tokens`` bounds every input field a provider bills."""
        ...

    def encoder(self, request: ChatRequest, *, model: str, same_dialect: bool) -> StreamEncoder:
        """An encoder for one stream; ``model`` is the public name the client sees,
        ``same_dialect`` whether the provider's raw events are already in this format."""
        ...

    def reply(
        self, completion: Completion, *, model: str, same_dialect: bool, charged: Charged
    ) -> dict[str, Any]:
        """The body of a whole (non-streamed) reply; its usage is what was ``charged``."""
        ...

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        """The error body this format's SDKs map to their exception classes."""
        ...

    def budget_headers(
        self, budgets: Sequence[BudgetState], rates: Sequence[RateState], now_ms: int
    ) -> dict[str, str]:
        """Headers describing the tightest budget and rate limit."""
        ...
