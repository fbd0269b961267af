"""Counting what a provider bills: every output delta, and an estimate of the input.

The live count only steers extensions and truncation; settlement uses the provider's reported
usage when the stream delivers it. The count must never be low: the seed's live bug was a
reasoning model that ran to 400 tokens on a 60-token budget because only ``content`` was
counted. So every billed field counts (content, reasoning, reasoning_content, refusal, tool-call
names and arguments), and each non-empty field of a chunk counts at least one token; see
:func:`streamed_tokens` for how a delta's length maps to tokens.
"""

from __future__ import annotations

import json
import math
from typing import Any

# Delta fields a provider bills as output. `reasoning` (vLLM, Groq, OpenRouter),
# `reasoning_content` (DeepSeek and others), `thinking` (translated Anthropic thinking blocks).
BILLED_TEXT_FIELDS = ("content", "reasoning", "reasoning_content", "thinking", "refusal")
PER_MESSAGE_OVERHEAD = 4


def text_tokens(text: str, chars_per_token: float) -> int:
    """Tokens in ``text`` by the length heuristic; at least one for non-empty text."""
    if not text:
        return 0
    return max(1, math.ceil(len(text) / chars_per_token))


def streamed_tokens(text: str, chars_per_token: float) -> int:
    """Tokens in one streamed delta field.

    OpenAI, vLLM and most OpenAI-compatible servers stream one token per chunk, so a short
    delta is one token; a long delta (providers that batch several tokens per event) is
    counted by length. Counting every short delta by length instead would overcount English
    by about half, charge cut streams for tokens never generated, and waste budget.
    """
    if not text:
        return 0
    if len(text) <= 2 * chars_per_token:
        return 1
    return math.ceil(len(text) / chars_per_token)


def delta_tokens(chunk: dict[str, Any], chars_per_token: float) -> int:
    """Billed output tokens carried by one ``chat.completion.chunk``."""
    total = 0
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        for field in BILLED_TEXT_FIELDS:
            value = delta.get(field)
            if isinstance(value, str):
                total += streamed_tokens(value, chars_per_token)
        for call in delta.get("tool_calls") or ():
            fn = call.get("function") or {}
            for part in (fn.get("name"), fn.get("arguments")):
                if isinstance(part, str):
                    total += streamed_tokens(part, chars_per_token)
    return total


def message_output_tokens(message: dict[str, Any], chars_per_token: float) -> int:
    """Billed output tokens of a whole (non-streamed) message, for when usage is missing."""
    return delta_tokens({"choices": [{"delta": message}]}, chars_per_token)


def input_tokens(body: dict[str, Any], chars_per_token: float) -> int:
    """Estimate of the prompt: message text, tool definitions, and a few tokens per message."""
    total = 0
    for message in body.get("messages") or ():
        total += PER_MESSAGE_OVERHEAD
        content = message.get("content")
        if isinstance(content, str):
            total += text_tokens(content, chars_per_token)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += text_tokens(part["text"], chars_per_token)
        for call in message.get("tool_calls") or ():
            total += text_tokens(json.dumps(call, separators=(",", ":")), chars_per_token)
    if body.get("tools"):
        total += text_tokens(json.dumps(body["tools"], separators=(",", ":")), chars_per_token)
    return total
