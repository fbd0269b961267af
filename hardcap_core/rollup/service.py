"""The rollup and the durable store as a process builds them from its environment.

``HARDCAP_USAGE_TABLE`` names the table; unset, there is no durable store (the gateway then
starts a lost cache's counters from zero and loses a settle the cache misses, as before).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from hardcap_core import env
from hardcap_core.config import Config, load_config
from hardcap_core.control.live import LiveConfig, live_from_env
from hardcap_core.errors import ConfigError
from hardcap_core.ledger import Ledger
from hardcap_core.ledger.connection import connect
from hardcap_core.rollup.durable import DurableSettles
from hardcap_core.rollup.restore import durable_ledger
from hardcap_core.rollup.table import UsageTable

if TYPE_CHECKING:
    from hardcap_core.rollup.run import RollupReport


def usage_table_from_env(client: Any = None) -> UsageTable | None:
    """The table ``HARDCAP_USAGE_TABLE`` names (its client made on first use), or None."""
    name = os.environ.get(env.USAGE_TABLE)
    return UsageTable(client, name) if name else None


def gateway_ledger(
    cache: Any, config: Config, table: UsageTable | None, **kwargs: Any
) -> tuple[Ledger, DurableSettles | None]:
    """The gateway's ledger, restoring lost counters from ``table``, and where a settle the
    cache misses is kept (both plain when there is no table)."""
    if table is None:
        return Ledger(cache, **kwargs), None
    return durable_ledger(cache, config, table, **kwargs), DurableSettles(table)


class RollupService:
    """One rollup invocation per :meth:`run`, with the config, cache client and table built
    once."""

    def __init__(self, config: Config, table: UsageTable, live: LiveConfig | None = None) -> None:
        self.config = config
        self.table = table
        self.live = live  # read again each invocation: tenants made since are rolled up
        self._cache: Any = None
        # Imported here, as the rollup below: a gateway imports this module too.
        from hardcap_core.rollup.eventbridge import notifications_from_env

        # Kept across warm invocations: thresholds known sent are not asked about again.
        self.notifications = notifications_from_env()

    async def run(self, until: float | None = None) -> RollupReport:
        """Passes every few seconds until ``until`` (``time.monotonic``); one pass without."""
        # Imported here: a gateway builds its durable ledger from this module and never rolls
        # up, so its cold start does not pay for the rollup and its metrics.
        from hardcap_core.rollup.metrics import RollupMetrics
        from hardcap_core.rollup.run import rollup_loop, run_rollup

        if self.live is not None:
            self.config = await self.live.reload()
        g = self.config.gateway
        if self._cache is None:
            # The cache client belongs to the event loop it was made on: the handler keeps one.
            self._cache = await connect(g.redis_url or "", cluster=g.redis_cluster)
        metrics = RollupMetrics()
        notify = self.notifications
        if until is None:
            return await run_rollup(self.config, self._cache, self.table, metrics=metrics,
                                    notifications=notify)  # fmt: skip
        return await rollup_loop(self.config, self._cache, self.table, until=until,
                                 metrics=metrics, notifications=notify)  # fmt: skip

    async def aclose(self) -> None:
        if self._cache is not None:
            await self._cache.aclose()
            self._cache = None


def rollup_from_env() -> RollupService:
    """The rollup as ``HARDCAP_CONFIG``, the cache settings and ``HARDCAP_USAGE_TABLE`` say."""
    path = os.environ.get(env.CONFIG_PATH)
    if not path:
        raise ConfigError(f"set {env.CONFIG_PATH} to the path of the config file")
    config = load_config(path)
    table = usage_table_from_env()
    if table is None:
        raise ConfigError(f"set {env.USAGE_TABLE} to the name of the usage table")
    if not config.gateway.redis_url:
        raise ConfigError(f"gateway.redis_url is not set (or set {env.REDIS_URL})")
    return RollupService(config, table, live_from_env(path))
