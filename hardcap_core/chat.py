"""A chat request in the gateway's own terms, whatever format the client spoke.

A wire format (:mod:`hardcap_core.wire`) parses and validates what a client sent into a
:class:`ChatRequest`; a provider (:mod:`hardcap_core.providers`) turns it into what its
upstream speaks. The body is kept in OpenAI chat-completions shape, the lingua franca most
providers speak: a wire format for another dialect translates into it, and an OpenAI-compatible
provider forwards it with the fields Hardcap does not know intact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The dialects a request comes in (ChatRequest.dialect) and a provider's events are in
# (Provider.dialect): a wire format and a provider of the same one may pass chunks through.
OPENAI_CHAT = "openai_chat"
ANTHROPIC_MESSAGES = "anthropic_messages"
BEDROCK_CONVERSE = "bedrock_converse"


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated request and what the gateway needs from it."""

    body: dict[str, Any]  # OpenAI chat-completions shape; unknown fields pass through
    model: str  # the public model name the client asked for (a route)
    stream: bool
    include_usage: bool  # the client asked for the final usage chunk
    max_tokens: int | None  # the client's output cap, if it set one
    max_tokens_field: str  # the field it used: max_tokens or max_completion_tokens
    input_tokens: int  # estimate of every input field a provider bills
    dialect: str  # the wire format it came in (e.g. "openai_chat")

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.body["messages"]
        return messages
