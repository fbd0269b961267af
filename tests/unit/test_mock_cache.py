"""The mock's prompt cache: a prefix sent again unchanged is read, one changed byte is written
again, and a prompt shorter than the least cacheable is not cached."""

from __future__ import annotations

from typing import Any

from hardcap_core.local.mock_cache import MIN_CACHED_TOKENS, CacheUse, PromptCache

MARK = {"type": "ephemeral"}


def blocks(text: str, *more: tuple[Any, int]) -> list[tuple[Any, int]]:
    return [({"type": "text", "text": text, "cache_control": MARK}, MIN_CACHED_TOKENS), *more]


def test_a_prefix_sent_again_is_read_and_what_follows_written() -> None:
    cache = PromptCache()
    assert cache.use(blocks("system")) == CacheUse(0, MIN_CACHED_TOKENS)
    turn = ({"type": "text", "text": "next", "cache_control": MARK}, 50)
    assert cache.use(blocks("system", turn)) == CacheUse(MIN_CACHED_TOKENS, 50)


def test_one_changed_byte_or_a_moved_mark_is_no_read() -> None:
    cache = PromptCache()
    cache.use(blocks("system"))
    assert cache.use(blocks("system ")) == CacheUse(0, MIN_CACHED_TOKENS)
    unmarked = {"type": "text", "text": "system"}  # the mark itself is not part of the prefix
    assert cache.use([(unmarked, MIN_CACHED_TOKENS)], mark_last=True) == CacheUse(
        MIN_CACHED_TOKENS, 0
    )


def test_short_or_unmarked_prompts_are_not_cached() -> None:
    cache = PromptCache()
    assert cache.use([({"type": "text", "text": "x", "cache_control": MARK}, 10)]) is None
    assert cache.use([({"type": "text", "text": "x"}, 5_000)]) is None


def test_it_keeps_only_its_last_prefixes() -> None:
    cache = PromptCache(max_prefixes=2)
    for text in ("a", "b", "c"):
        cache.use(blocks(text))
    assert len(cache.prefixes) == 2
    assert cache.use(blocks("a")) == CacheUse(0, MIN_CACHED_TOKENS)
