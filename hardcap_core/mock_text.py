"""Text, lengths and prompt sizes for the mock upstream (see `mock_upstream`).

Kept apart from the server so the parts that decide *what* is generated are pure functions of
a `random.Random`, which makes seeded runs reproducible and easy to test without a server.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Mapping
from typing import Any

# Word pieces as a BPE tokenizer would cut them: mostly a leading space plus a short word, some
# suffixes and punctuation. The mean length is about 4 characters, like real English output, so
# byte counts seen by the gateway relate to token counts as they would with a real model. No
# piece contains a quote or a backslash, so pieces can be put verbatim inside a JSON string.
VOCABULARY: tuple[str, ...] = (
    " the", " the", " the", " the", " a", " a", " a", " of", " of", " to", " to", " and", " and",
    " in", " in", " I", " an", " do",
    " is", " is", " it", " that", " for", " on", " with", " as", " by", " be", " are", " this",
    " we", " you", " can", " will", " not", " or", " at", " from", " each", " one", " all",
    " when", " which", " more", " than", " so", " if", " no", " per", " its", " our", " has",
    " only", " every", " also", " into", " over", " under", " before", " after", " then",
    " budget", " token", " tokens", " limit", " gateway", " model", " request", " tenant",
    " stream", " cost", " price", " key", " cache", " server", " client", " reply", " time",
    " test", " data", " user", " value", " count", " rate", " cap", " usage", " spend",
    " answer", " question", " system", " service", " call", " text", " word", " line", " run",
    " build", " deploy", " read", " write", " send", " check", " keep", " hold", " stop",
    " start", " end", " open", " close", " make", " use", " need", " want", " know", " see",
    " think", " say", " go", " get", " set", " show", " give", " take", " find", " work",
    " new", " old", " good", " high", " low", " fast", " slow", " small", " large", " hard",
    " soft", " real", " safe", " clear", " full", " free", " same", " other", " last", " next",
    " first", " second", " few", " many", " much", " most", " some", " any", " long", " short",
    " way", " part", " case", " point", " step", " plan", " idea", " place", " world", " day",
    " Python", " Lambda", " function", " result", " number", " error", " retry", " queue",
    "ing", "ed", "s", "s", "er", "ly", "tion", "ment", "ness", "able", "al", "ive", "est",
    "'s", "n't", "'re",
    ".", ".", ".", ".", ",", ",", ",", ",", ",", ":", ";", " -", "?", "!", " (", ")",
    " 1", " 2", " 3", "0", "5", "%",
)

_DIRECTIVE = re.compile(r"\[mock:([a-z_]+)=([0-9]+(?:\.[0-9]+)?)\]")
_WEATHER = re.compile(r"\bweather\b", re.IGNORECASE)

# Upper bound on any drawn length, like a real model's own output limit. Without it, the far
# tail of a log-normal (rare, but seeded benchmarks hit it) would stream for minutes.
MAX_DRAWN_TOKENS = 16_384
# `{"`, field, `":`, ` "` ... `"}`: the fixed pieces around the words of a tool-call argument.
_ARGUMENT_FRAME_TOKENS = 5


def draw_length(rng: random.Random, median: int, sigma: float) -> int:
    """A log-normal length: `round(median * exp(sigma * N(0, 1)))`, clamped to [1, 16384]."""
    drawn = round(median * math.exp(sigma * rng.gauss(0.0, 1.0)))
    return max(1, min(drawn, MAX_DRAWN_TOKENS))


def draw_words(rng: random.Random, count: int) -> list[str]:
    """`count` word pieces from the vocabulary, each one token."""
    return rng.choices(VOCABULARY, k=count)


def argument_tokens(rng: random.Random, count: int, field: str) -> list[str]:
    """Tokens that join into a JSON object `{"<field>": "<words>"}` of about `count` tokens.

    Never fewer than the frame plus one word, so the arguments of an uncapped tool call are
    always valid JSON; a caller that caps the list (max_tokens) gets a truncated object, which
    is what a real provider sends with finish_reason "length".
    """
    words = draw_words(rng, max(1, count - _ARGUMENT_FRAME_TOKENS))
    return ['{"', field, '":', ' "', *words, '"}']


def text_of(content: Any) -> str:
    """The text of a message's `content`: a string, or the text parts of a content array."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def estimate_prompt_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """`ceil(characters of all message texts / 4) + 4 per message`.

    The same family of heuristic as the gateway's own pre-flight estimate (characters / 4 plus
    a per-message overhead), so the two agree closely. A known limitation: it is not a real
    tokenizer, and it ignores tool definitions, tool-call arguments and images.
    """
    messages = list(messages)
    characters = sum(len(text_of(message.get("content"))) for message in messages)
    return math.ceil(characters / 4) + 4 * len(messages)


def directives(text: str) -> dict[str, float]:
    """The `[mock:name=value]` test directives found in `text`, e.g. {"status": 503.0}."""
    return {name: float(value) for name, value in _DIRECTIVE.findall(text)}


def mentions_weather(text: str) -> bool:
    """Whether `text` has the word "weather", the cue for an unforced tool call."""
    return _WEATHER.search(text) is not None
