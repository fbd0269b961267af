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
OPENAI_RESPONSES = "openai_responses"  # translated into chat shape: no provider speaks it yet
OPENAI_EMBEDDINGS = "openai_embeddings"  # an embeddings body, sent to `/embeddings` as it came
ANTHROPIC_MESSAGES = "anthropic_messages"
BEDROCK_CONVERSE = "bedrock_converse"


@dataclass(frozen=True, slots=True)
class ServerTool:
    """A tool the provider runs and bills per use (Anthropic's web search, web fetch), as a
    request declared it; :func:`hardcap_core.gateway.money.tool_hold` prices and bounds it."""

    kind: str  # what prices it: web_search, web_fetch
    type: str  # its versioned type as sent (web_search_20250305)
    where: str  # where the request declared it (tools[2]): a 400 names it
    index: int  # its place in the request's ``tools``
    max_uses: int | None  # the request's bound, if it set one


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
    # The body as the client sent it, for a provider of its dialect to send on unchanged
    # (Anthropic Messages: cache marks, block kinds and new fields byte for byte); None: the
    # provider builds its own from ``body``.
    native: dict[str, Any] | None = None
    betas: tuple[str, ...] = ()  # the anthropic-beta values it came with
    server_tools: tuple[ServerTool, ...] = ()  # tools the provider runs and bills per use

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.body["messages"]
        return messages

    @property
    def thinks(self) -> bool:
        """Whether it asks for extended thinking: Anthropic's ``thinking`` of any type but
        ``disabled`` (``enabled`` with a budget, ``adaptive`` without; a type the gateway does
        not know counts as thinking)."""
        thinking = self.body.get("thinking")
        if thinking is None:
            return False
        return not (isinstance(thinking, dict) and thinking.get("type") == "disabled")

    @property
    def thinking_budget(self) -> int | None:
        """The most tokens it lets the model think (``thinking.budget_tokens``), if it says."""
        thinking = self.body.get("thinking")
        budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            return None
        return budget

    @property
    def reasons(self) -> bool:
        """Whether a reasoning model may reason: unless it turns reasoning off
        (``reasoning_effort: "none"``; every other effort, or none given, reasons)."""
        return self.body.get("reasoning_effort") != "none"
