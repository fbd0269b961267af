"""Token counts from text length, for when nothing better is known.

The live output count only steers extensions and truncation; settlement uses the provider's
reported usage when it comes. The count must never be low: the seed's live bug was a reasoning
model that ran to 400 tokens on a 60-token budget because only ``content`` was counted. So every
billed field is counted (the providers decide which fields those are) and every non-empty
field counts at least one token.

Input is estimated differently (:func:`input_text_tokens`): it is reserved before the call and
must never be low, whatever text a tenant sends, so it is an upper bound by character class
rather than an average. It is what every request is reserved first; a route whose model has a
public tokenizer replaces it with the exact count where that changes a decision
(:mod:`~hardcap_core.tokenize.routes`), and it stays for what a tokenizer cannot see.
"""

from __future__ import annotations

import math


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


# -- input: an upper bound by character class -----------------------------------------------------
#
# Weights in tokens, measured against cl100k_base (bench/budget/input_estimate.py, docs/design.md
# "Counting") on prose, code, JSON, 15 languages, emoji, random text of every class, and strings
# built by a greedy search for the most tokens per character. Why each is what it is:
# - A BPE token is at least one byte, so one token per byte can never be low. Non-ASCII bytes,
#   control characters, ASCII punctuation, uppercase letters and other whitespace than spaces
#   get that weight: for each, the search found strings at one token per character.
# - A run of lowercase letters whose adjacent pairs all merge cannot end as two one-byte tokens
#   side by side, so it is at most 2 tokens per 3 letters (plus 1/2 per run). j, q, x and z
#   take part in almost every pair that does not merge (e.g. "qj", "xg"), so they count 4/3.
# - Digits are split into groups of three (1/3 per digit, 5/3 per run: a group started early,
#   and the space before a number, which is a token of its own).
# - A run of spaces is one token or a few: 1/64 per space and 1/8 per whitespace run.
# - A lowercase letter followed by an uppercase one starts a token (camelCase): 3/8 more.
# English prose is overestimated about 2.6x, the price of never being low on crafted text.
_W_LOWER = 2 / 3
_W_RARE = 4 / 3
_W_UPPER = _W_PUNCT = _W_SPACE_OTHER = _W_CONTROL = _W_NON_ASCII = 1.0
_W_DIGIT = 1 / 3
_W_SPACE = 1 / 64
_W_LETTER_RUN = 1 / 2
_W_DIGIT_RUN = 5 / 3
_W_SPACE_RUN = 1 / 8
_W_CASE_CHANGE = 3 / 8


def _table(classes: dict[bytes, bytes]) -> bytes:
    """A ``bytes.translate`` table: each byte of a key becomes its class byte, others ``-``."""
    table = bytearray(b"-" * 256)
    for members, name in classes.items():
        for byte in members:
            table[byte] = name[0]
    return bytes(table)


_LOWER = bytes(range(0x61, 0x7B))
_UPPER = bytes(range(0x41, 0x5B))
_DIGITS = b"0123456789"
_PUNCT = bytes(c for c in range(0x21, 0x7F) if not chr(c).isalnum())
_OTHER_SPACE = b"\t\n\x0b\x0c\r"
_CONTROL = bytes([*range(0, 9), *range(0x0E, 0x20), 0x7F])
_CLASSES = _table(
    {
        _LOWER: b"a",
        b"jqxz": b"j",
        _UPPER: b"A",
        _DIGITS: b"0",
        _PUNCT: b".",
        b" ": b" ",
        _OTHER_SPACE: b"w",
        _CONTROL: b"^",
        bytes(range(0x80, 0x100)): b"u",
    }
)
_LETTER_RUNS = _table({_LOWER + _UPPER: b"L"})
_DIGIT_RUNS = _table({_DIGITS: b"D"})
_SPACE_RUNS = _table({b" " + _OTHER_SPACE: b"W"})


def _runs(data: bytes, table: bytes, mark: bytes) -> int:
    """How many runs of ``mark`` ``table`` turns ``data`` into (everything else is ``-``):
    each run but a leading one starts with ``-`` then ``mark``, and those never overlap."""
    marked = data.translate(table)
    return marked.count(b"-" + mark) + marked.startswith(mark)


def input_text_tokens(text: str) -> int:
    """An upper bound on the tokens of ``text`` as a prompt (see the weights above): at least
    one for non-empty text. Runs at C speed (``bytes.translate`` and ``count``), about
    10 ms per MB."""
    if not text:
        return 0
    data = text.encode("utf-8", "surrogatepass")
    c = data.translate(_CLASSES)
    weighted = (
        _W_LOWER * c.count(b"a")
        + _W_RARE * c.count(b"j")
        + _W_UPPER * c.count(b"A")
        + _W_DIGIT * c.count(b"0")
        + _W_PUNCT * c.count(b".")
        + _W_SPACE * c.count(b" ")
        + _W_SPACE_OTHER * c.count(b"w")
        + _W_CONTROL * c.count(b"^")
        + _W_NON_ASCII * c.count(b"u")
        + _W_CASE_CHANGE * (c.count(b"aA") + c.count(b"jA"))
        + _W_LETTER_RUN * _runs(data, _LETTER_RUNS, b"L")
        + _W_DIGIT_RUN * _runs(data, _DIGIT_RUNS, b"D")
        + _W_SPACE_RUN * _runs(data, _SPACE_RUNS, b"W")
    )
    # +1: a short text's pieces each round up (the measured bound holds with it, not without).
    return math.ceil(weighted) + 1
