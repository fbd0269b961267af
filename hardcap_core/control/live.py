"""The config a running gateway serves with, kept fresh without a read per request.

The file's sections joined with the config table's state (:mod:`.state`). How a change reaches
an instance, fastest first:

* **A changed or revoked tenant, key or budget**: the admin publishes the table's new version
  in the cache slot of each hierarchy it touched (``Ledger.publish_config_version``); the next
  admit of that hierarchy carries this copy's version and answers "stale" instead of reserving
  (``ConfigStale``), so the request reloads, authenticates again and is admitted under the new
  config. No call of its own: the check rides on the admit every billed request makes.
* **A refusal this copy decides** (a disabled tenant or org, a route the tenant may not use):
  such a request makes no admit, so before it is refused the hierarchy's published version is
  read from the cache (:meth:`LiveConfig.refresh`: one GET, at most every :data:`RECHECK_S` per
  hierarchy per instance) and, if newer, the config is read again and the request decided
  again. A re-enabled tenant or a restored route is served within about a second; a request
  that is admitted never makes this read.
* **A key this copy has never seen** (a new key, of a new tenant perhaps): looked up once by its
  hash (one GetItem); a miss is remembered for :data:`MISS_TTL_S` so a stream of wrong keys
  cannot turn into a stream of table reads, and lookups are capped per second.
* **A temporary budget's end or a rotated key's end**: known in advance (``Joined.changes_at``);
  the first request after it joins the state again, with no I/O.
* **Anything the cache did not carry** (a publish that failed, a lost cache): the table's version
  is read at most every :data:`POLL_S` seconds, off the request's path.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from hardcap_core.auth import MAX_KEY_LENGTH, hash_key
from hardcap_core.config.model import Config, Principal
from hardcap_core.control.state import LiveState, join
from hardcap_core.errors import ConfigError, HardcapError
from hardcap_core.logs import logger

POLL_S = 30.0  # the table's version is read at most this often (a backstop for the cache's)
MISS_TTL_S = 2.0  # an unknown key is looked up again after this long
MAX_MISSES = 10_000  # unknown keys remembered (the oldest forgotten first)
LOOKUPS_PER_S = 20  # table lookups of unknown keys per second, per instance, at most
RECHECK_S = 1.0  # a refused request reads its hierarchy's published version at most this often
MAX_RECHECKED = 10_000  # hierarchies whose last recheck is remembered (the oldest forgotten)

# The newest config version the admin published for a hierarchy (by its root's tag): the
# ledger's ``published_config_version``, wired in when the gateway is built.
VersionReader = Callable[[str], Awaitable[int]]


def live_from_env(path: str) -> LiveConfig | None:
    """The live config over the table ``HARDCAP_CONFIG_TABLE`` names, joined with the file at
    ``path``; None when no table is named."""
    from hardcap_core.config.loader import read_data
    from hardcap_core.control.store import ConfigStore

    store = ConfigStore.from_env()
    return None if store is None else LiveConfig(read_data(path), path, store)


class LiveConfig:
    """The current :class:`Config` of a gateway: the file's, joined with the table's state."""

    def __init__(
        self,
        file_data: Mapping[str, Any],
        source: str,
        store: Any,  # hardcap_core.control.store.ConfigStore
        *,
        clock: Callable[[], float] = time.time,
        poll_s: float = POLL_S,
    ) -> None:
        self.file_data = dict(file_data)
        self.source = source
        self.store = store
        self.clock = clock
        self.poll_s = poll_s
        self.state = LiveState(0)
        self.config: Config | None = None
        self.changes_at = math.inf
        self.loaded_at = 0.0  # monotonic time of the last read of the table
        self._reload_lock = asyncio.Lock()
        self._misses: OrderedDict[str, float] = OrderedDict()
        self._lookups: list[float] = []
        self._poll: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[Config], None]] = []
        self._published: VersionReader | None = None
        self._rechecked: OrderedDict[str, float] = OrderedDict()
        self._checks: dict[str, asyncio.Task[bool]] = {}  # by root tag: reads under way

    @property
    def version(self) -> int:
        """The table's version this copy holds (0: the table was never written)."""
        return self.state.version

    def on_change(self, listener: Callable[[Config], None]) -> None:
        """Call ``listener`` with each new config (what holds a config besides the gateway)."""
        self._listeners.append(listener)

    def watch(self, published: VersionReader) -> None:
        """Read the versions the admin publishes per hierarchy with ``published`` (the
        gateway's ledger), so that a refused request can learn this copy is stale."""
        self._published = published

    async def refresh(self, root_tag: str) -> bool:
        """Whether the config was read again because the admin published a newer version for
        the hierarchy ``root_tag`` (``o:acme``, ``t:beta``) than this copy holds: what a request
        about to be refused for a reason the config decides asks first. At most one read of the
        cache per hierarchy every :data:`RECHECK_S`: a request that asks while one is under way
        waits for its answer, one that asks later in that second is answered False without I/O.
        False too when the cache or the table cannot be read (the request is decided by this
        copy, and the poll stays the backstop)."""
        if self._published is None:
            return False
        pending = self._checks.get(root_tag)
        if pending is None:
            now = time.monotonic()
            last = self._rechecked.get(root_tag)
            if last is not None and now - last < RECHECK_S:
                return False
            self._rechecked[root_tag] = now
            self._rechecked.move_to_end(root_tag)
            while len(self._rechecked) > MAX_RECHECKED:
                self._rechecked.popitem(last=False)
            pending = asyncio.get_running_loop().create_task(self._recheck(root_tag))
            self._checks[root_tag] = pending
            pending.add_done_callback(lambda _: self._checks.pop(root_tag, None))
        return await asyncio.shield(pending)  # a caller that gives up leaves it to the others

    async def _recheck(self, root_tag: str) -> bool:
        assert self._published is not None
        try:
            version = await self._published(root_tag)
            if version <= self.state.version:
                return False
            await self.reload(version)
        except HardcapError:
            logger.warning("could not learn whether the config changed", exc_info=True)
            return False
        return True

    def load(self) -> Config:
        """Read the table and build the config (blocking: at start, in a worker thread later)."""
        state = self.store.load()
        return self._install(state)

    async def reload(self, at_least: int = 0) -> Config:
        """Read the table again, unless another reload already brought a version of at least
        ``at_least`` (many requests that meet one change read the table once)."""
        async with self._reload_lock:
            if self.config is not None and at_least and self.state.version >= at_least:
                return self.config
            state = await asyncio.to_thread(self.store.load)
            return self._install(state)

    def current(self) -> Config:
        """The config for a request arriving now: joined again (no I/O) once a temporary
        budget or a rotated key ended; a version check of the table started in the background
        when the last is older than the poll interval."""
        assert self.config is not None, "load() first"
        if self.clock() >= self.changes_at:
            self._install(self.state)
        if time.monotonic() - self.loaded_at >= self.poll_s and self._poll is None:
            self.loaded_at = time.monotonic()  # one check per interval, even when it fails
            self._poll = asyncio.get_running_loop().create_task(self._check_version())
        return self.config

    async def lookup(self, presented_key: str) -> Principal | None:
        """The principal of a key the current config does not know, if the table has it now."""
        if not presented_key or len(presented_key) > MAX_KEY_LENGTH:
            return None
        key_hash = hash_key(presented_key)
        now = time.monotonic()
        seen = self._misses.get(key_hash)
        if seen is not None and now - seen < MISS_TTL_S:
            return None
        self._lookups = [t for t in self._lookups if now - t < 1.0]
        if len(self._lookups) >= LOOKUPS_PER_S:
            return None  # refused now, looked up on a later try: the table is not a free oracle
        self._lookups.append(now)
        record = await asyncio.to_thread(self.store.key_by_hash, key_hash)
        if record is None or not record.active(self.clock()):
            self._miss(key_hash, now)
            return None
        config = await self.reload()
        principal = config.authenticate(presented_key)
        if principal is None:
            self._miss(key_hash, now)
        return principal

    def _miss(self, key_hash: str, now: float) -> None:
        self._misses[key_hash] = now
        self._misses.move_to_end(key_hash)
        while len(self._misses) > MAX_MISSES:
            self._misses.popitem(last=False)

    def _install(self, state: LiveState) -> Config:
        from hardcap_core.config.validation import parse_config

        joined = join(self.file_data, state, self.clock())
        try:
            config = parse_config(joined.data, self.source)
        except ConfigError:
            if self.config is None:
                raise
            # The admin API validates every change before writing it, so this is a table
            # edited by hand: keep serving with the last good config rather than with none.
            logger.exception("the live config does not validate; keeping the previous one")
            return self.config
        self.state, self.config, self.changes_at = state, config, joined.changes_at
        self.loaded_at = time.monotonic()
        self._misses.clear()
        for listener in self._listeners:
            listener(config)
        return config

    async def _check_version(self) -> None:
        try:
            version = await asyncio.to_thread(self.store.version)
            if version > self.state.version:
                await self.reload(version)
        except HardcapError:
            # The table is unreachable: keep serving with this copy and try again later.
            logger.warning("could not read the config table's version", exc_info=True)
        finally:
            self._poll = None
