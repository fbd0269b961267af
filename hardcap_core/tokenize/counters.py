"""How a route counts a request's input: one counter per kind of tokenizer, behind one protocol.

- ``bound``: the upper bound by character class (:func:`~hardcap_core.wire.openai_input.
  input_tokens`), what every request is reserved first; no vocabulary.
- ``o200k_base``, ``cl100k_base``: the public BPE encoding the route's model bills with, through
  OpenAI's chat format with its margin (:func:`~hardcap_core.wire.openai_input.
  exact_input_tokens`): never below the bill, so admission may reserve it.
- ``anthropic``: Claude's tokenizer is not public, so this is a bound calibrated on
  cl100k_base, :data:`CLAUDE_PER_CL100K` times its count with the chat format's margin, and
  never more than the upper bound. Not exact: it is an assumption with its margin, checked
  against the count API where a route has one (a count above it is logged,
  :mod:`~hardcap_core.tokenize.count_api`).

A counter counts an OpenAI-shaped body by OpenAI's rules; what an Anthropic model bills beyond
them (its tool-use system prompt, images, PDF pages) is added by the caller per target
(:mod:`~hardcap_core.tokenize.routes`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from hardcap_core.tokenize.vocabularies import VOCABULARY_OF, encoding
from hardcap_core.wire.openai_input import exact_input_tokens, input_tokens

# Claude's tokens per cl100k_base token, at most (the calibrated bound's ratio), with its margin.
# No Claude tokenizer is public or reachable from here, so this is not measured by this code: it
# is a stated assumption, about 1.5 times the ratios published for Claude 3 against GPT-4's
# tokenizer, and the calibrated count never exceeds the upper bound, which holds whatever the
# ratio. Routes with count_api log every answer above it (count_api.py), which is how it is
# checked in production.
CLAUDE_PER_CL100K = 2.0
CLAUDE_VOCABULARY = VOCABULARY_OF["anthropic"]


class InputCounter(Protocol):
    """Counts the prompt tokens an OpenAI-shaped body is billed."""

    @property
    def name(self) -> str:
        """The config's tokenizer name."""
        ...

    @property
    def exact(self) -> bool:
        """Whether its count is never below the bill (the tokenizer is the provider's own)."""
        ...

    @property
    def vocabulary(self) -> str | None:
        """The shipped encoding it loads on first use, if any."""
        ...

    def count(self, body: dict[str, Any]) -> int: ...


class BoundCounter:
    """Today's upper bound: no vocabulary, always available."""

    name = "bound"
    exact = False
    vocabulary: str | None = None

    def count(self, body: dict[str, Any]) -> int:
        return input_tokens(body)


@dataclass(frozen=True, slots=True)
class BpeCounter:
    """A public BPE encoding: the exact count."""

    name: str
    exact: bool = True

    @property
    def vocabulary(self) -> str | None:
        return self.name

    def count(self, body: dict[str, Any]) -> int:
        return exact_input_tokens(body, text_counter(self.name), openai_tools=True)


class CalibratedCounter:
    """Anthropic's models: :data:`CLAUDE_PER_CL100K` times cl100k_base's count, capped by the
    upper bound."""

    name = "anthropic"
    exact = False
    vocabulary: str | None = CLAUDE_VOCABULARY

    def count(self, body: dict[str, Any]) -> int:
        tokens = text_counter(CLAUDE_VOCABULARY)

        def claude(text: str) -> int:
            return math.ceil(CLAUDE_PER_CL100K * tokens(text))

        return min(input_tokens(body), exact_input_tokens(body, claude))


def text_counter(name: str) -> Callable[[str], int]:
    """The tokens of a text in the encoding ``name`` (special-token text counts as text, as a
    provider treats it in a prompt)."""
    encode = encoding(name).encode_ordinary

    def count(text: str) -> int:
        return len(encode(text)) if text else 0

    return count


def counter_for(tokenizer: str) -> InputCounter:
    """The counter of a route's ``tokenizer`` (its config value)."""
    if tokenizer == "bound":
        return BoundCounter()
    if tokenizer == "anthropic":
        return CalibratedCounter()
    return BpeCounter(tokenizer)
