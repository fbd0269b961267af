"""The wire-format interface: what a client speaks, parsed in and encoded back out.

One implementation per client format, each its own module here: OpenAI chat completions
(``openai_chat.py``), the OpenAI Responses API (``openai_responses.py``) and Anthropic Messages
(``anthropic_messages.py``). A format parses and
validates a body into a :class:`~hardcap_core.chat.ChatRequest` (raising
:class:`~hardcap_core.errors.InvalidRequest` naming the field), and encodes what the gateway
sends back: stream events, the closing events, whole replies, errors, budget headers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

from hardcap_core.chat import ChatRequest
from hardcap_core.errors import GatewayError
from hardcap_core.events import Completion, Event, Usage
from hardcap_core.ledger import BudgetState, RateState

COST_HEADER = "x-hardcap-cost-usd"
TOKENS_HEADER = "x-hardcap-tokens-charged"  # input + output tokens the ledger charged


@dataclass(frozen=True, slots=True)
class Charged:
    """What a request was charged, for the usage the client sees at the end."""

    input_tokens: int
    output_tokens: int
    provider_usage: Usage | None  # the provider's own report, when the stream completed
    cost_nusd: int = 0  # what the settle charged the budgets, in nano-USD
    estimate: bool = False  # the counts are the gateway's estimate (a cut, unreported stream)

    def cost_usd(self) -> str:
        """The cost as an exact decimal USD string ("0.000123"): a float would round it."""
        return f"{Decimal(self.cost_nusd).scaleb(-9).normalize():f}"

    def extension(self) -> dict[str, Any]:
        """The ``hardcap`` object added to a stream's final usage: a documented extension
        field the SDKs keep (openai: ``usage.model_extra``), so a client reads its cost where
        it reads its tokens. ``cost_usd`` is a JSON number; the header carries the exact
        string."""
        return {
            "cost_usd": self.cost_nusd / 1e9,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "estimate": self.estimate,
        }

    def headers(self) -> dict[str, str]:
        """The headers of a whole reply: its cost and the tokens charged (input + output)."""
        return {
            COST_HEADER: self.cost_usd(),
            TOKENS_HEADER: str(self.input_tokens + self.output_tokens),
        }


class StreamEncoder(Protocol):
    """Encodes one stream for the client; one per request (it remembers ids)."""

    def event(self, event: Event) -> bytes | None:
        """Bytes for one provider event, or None if the client gets nothing for it."""
        ...

    def close(self, *, for_length: bool, charged: Charged) -> bytes:
        """The stream's last bytes: the closing event (``for_length``: the gateway cut the
        stream, so it ends with finish reason "length"), the usage if the client asked for
        it, and the end-of-stream marker."""
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
