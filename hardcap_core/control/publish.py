"""How the admin tells running gateways that the live config changed: the new table version,
stored in the cache slot of each tenant hierarchy a change touched, which every gateway's next
admission there reads (``Ledger.publish_config_version``, ``lua/config_version.lua``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol


class ConfigPublisher(Protocol):
    """Tells every gateway instance that the hierarchies ``roots`` (``o:<org>``, ``t:<tenant>``)
    moved to config ``version``."""

    async def publish(self, roots: Sequence[str], version: int) -> None: ...


class _VersionLedger(Protocol):
    async def publish_config_version(self, roots: Sequence[str], version: int) -> None: ...


class LedgerPublisher:
    """A :class:`ConfigPublisher` over the cache: the ledger stores the version in each
    hierarchy's slot, which every gateway's next admission there reads. ``ledger`` is awaited
    on the first publish (the cache client belongs to the event loop that makes it)."""

    def __init__(
        self,
        ledger: Callable[[], Awaitable[_VersionLedger]],
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._ledger = ledger
        self._close = close  # closes the cache client, when this publisher made its own

    async def publish(self, roots: Sequence[str], version: int) -> None:
        ledger = await self._ledger()
        await ledger.publish_config_version(roots, version)

    async def aclose(self) -> None:
        if self._close is not None:
            await self._close()
