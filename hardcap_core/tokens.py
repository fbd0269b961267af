"""Token counts from text length, for when nothing better is known.

The live output count only steers extensions and truncation; settlement uses the provider's
reported usage when it comes. The count must never be low: the seed's live bug was a reasoning
model that ran to 400 tokens on a 60-token budget because only ``content`` was counted. So every
billed field is counted (the providers decide which fields those are) and every non-empty
field counts at least one token.
"""

from __future__ import annotations

import json
import math
from typing import Any


def text_tokens(text: str, chars_per_token: float) -> int:
    """Tokens in ``text`` by the length heuristic; at least one for non-empty text."""
    if not text:
        return 0
    return max(1, math.ceil(len(text) / chars_per_token))


def json_tokens(value: Any, chars_per_token: float) -> int:
    """Tokens of a JSON value as a provider would see it serialized (tool schemas, calls)."""
    return text_tokens(json.dumps(value, separators=(",", ":")), chars_per_token)


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
