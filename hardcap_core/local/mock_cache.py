"""The mock's prompt cache, kept as Anthropic keeps one: a prompt is cached up to each block
marked ``cache_control`` (in the order Anthropic caches: tools, system, messages; a top-level
``cache_control`` marks the last block), when at least :data:`MIN_CACHED_TOKENS` lie before
the mark. A later prompt whose blocks up to a mark are the same, byte for byte as JSON (the
marks themselves aside), reads that prefix from the cache; what lies between the longest prefix
read and its last mark is written. So a gateway that changes one byte of a cached prefix turns
every read into a write.

The mock's Anthropic mode reports what a request read and wrote as Anthropic does
(``cache_read_input_tokens``, ``cache_creation_input_tokens``) unless its
``[mock:cache_read=N]`` / ``[mock:cache_write=N]`` directives say otherwise. The last
:data:`MAX_PREFIXES` prefixes are kept; ``POST /mock/reset`` empties it.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MIN_CACHED_TOKENS = 1_024  # Anthropic's least cacheable prompt (Sonnet and Opus models)
MAX_PREFIXES = 256


@dataclass(frozen=True, slots=True)
class CacheUse:
    """The prompt tokens a request read from the cache and wrote to it."""

    read: int
    written: int


class PromptCache:
    """Prefixes seen, by the hash of their blocks, with the prompt tokens through each."""

    def __init__(self, max_prefixes: int = MAX_PREFIXES) -> None:
        self.max_prefixes = max_prefixes
        self.prefixes: OrderedDict[bytes, int] = OrderedDict()

    def use(self, blocks: Sequence[tuple[Any, int]], *, mark_last: bool = False) -> CacheUse | None:
        """Read and write the prefixes of ``blocks`` (each a block and its prompt tokens, in
        cache order; ``mark_last``: the body's own ``cache_control`` marks the last); None
        when nothing in them is marked to be cached."""
        marks: list[tuple[bytes, int]] = []
        digest = hashlib.sha256()
        end = 0
        for i, (block, tokens) in enumerate(blocks):
            end += tokens
            marked = isinstance(block, dict) and block.get("cache_control") is not None
            unmarked = (
                {k: v for k, v in block.items() if k != "cache_control"}
                if isinstance(block, dict)
                else block
            )
            digest.update(json.dumps(unmarked, ensure_ascii=False).encode())
            if (marked or (mark_last and i == len(blocks) - 1)) and end >= MIN_CACHED_TOKENS:
                marks.append((digest.copy().digest(), end))
        if not marks:
            return None
        read = max((tokens for key, tokens in marks if key in self.prefixes), default=0)
        for key, tokens in marks:
            self.prefixes[key] = tokens
            self.prefixes.move_to_end(key)
        while len(self.prefixes) > self.max_prefixes:
            self.prefixes.popitem(last=False)
        return CacheUse(read, max(0, marks[-1][1] - read))

    def clear(self) -> None:
        self.prefixes.clear()
