"""``LiveConfig.refresh``: what a request about to be refused for a reason the live config
decides asks first. One read of the hierarchy's published version a second at most, a reload
only when it is newer, and a refusal decided by this copy when the cache or the table fails."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hardcap_core.control.live import LiveConfig
from hardcap_core.control.state import LiveState
from hardcap_core.errors import DurableStoreUnavailable, LedgerUnavailable
from tests.stack import config_data


class Store:
    def __init__(self, version: int = 0) -> None:
        self.version = version
        self.loads = 0
        self.fails = False

    def load(self) -> LiveState:
        self.loads += 1
        if self.fails:
            raise DurableStoreUnavailable("the table is unreachable")
        return LiveState(self.version)


class Published:
    def __init__(self) -> None:
        self.version = 0
        self.reads: list[str] = []
        self.fails = False

    async def __call__(self, root: str) -> int:
        self.reads.append(root)
        if self.fails:
            raise LedgerUnavailable("the cache is unreachable")
        return self.version


def live(store: Store) -> LiveConfig:
    made = LiveConfig(config_data("http://127.0.0.1:9", "redis://127.0.0.1:9"), "test", store)
    made.load()
    return made


async def test_without_a_reader_nothing_is_read() -> None:
    assert await live(Store()).refresh("t:open") is False


async def test_a_newer_version_reloads_once_and_the_next_second_reads_nothing() -> None:
    store, published = Store(), Published()
    copy = live(store)
    copy.watch(published)
    assert await copy.refresh("t:open") is False  # the same version: no reload
    published.version = store.version = 3
    assert await copy.refresh("t:open") is False  # asked within the second: not read
    assert published.reads == ["t:open"] and store.loads == 1
    assert await copy.refresh("o:acme") is True  # another hierarchy: its own second
    assert copy.version == 3 and store.loads == 2


async def test_an_unreachable_cache_or_table_leaves_the_copy_to_decide(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, published = Store(), Published()
    copy = live(store)
    copy.watch(published)
    published.fails = True
    with caplog.at_level(logging.WARNING):
        assert await copy.refresh("t:a") is False
    published.fails, published.version, store.fails = False, 2, True
    with caplog.at_level(logging.WARNING):
        assert await copy.refresh("t:b") is False
    assert copy.version == 0
    assert [r.getMessage() for r in caplog.records].count(
        "could not learn whether the config changed"
    ) == 2


async def test_requests_that_ask_during_a_read_wait_for_its_answer() -> None:
    """A burst of refused requests meeting a re-enable: one read, and every one of them is
    decided by the new copy (not only the first)."""
    store, published = Store(), Published()
    gate = asyncio.Event()
    copy = live(store)
    published.version = store.version = 5

    async def slow(root: str) -> int:
        await gate.wait()
        return await published(root)

    copy.watch(slow)
    asking = [asyncio.create_task(copy.refresh("t:open")) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(*asking) == [True] * 5
    assert published.reads == ["t:open"] and store.loads == 2
