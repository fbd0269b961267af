"""The rollup on a timer, for local runs: what the EventBridge schedule does on AWS.

``hardcap serve`` and ``hardcap demo`` start one next to the gateway. It keeps the cadence the
function on AWS keeps (:func:`hardcap_core.rollup.run.paced_passes`, which both run): a pass of
:func:`hardcap_core.rollup.run.run_rollup` starts every ``interval_s`` from the start of the one
before, and only the first and then one a minute are full (kept settles charged, every
tenant's thresholds checked: what each invocation's first pass does on AWS), so a pass where
nothing was settled is one ``XLEN`` per hierarchy and a lost cache forgets about one interval
(docs/design.md, "Losing the cache"). It runs in a thread of its own, with its own event loop
and its own cache client, so a slow DynamoDB call never stalls a request. A pass that fails is
logged and the next one tries again (and is full in its place). :meth:`stop` runs one last
rollup, so what was settled before the process exits is in the table.

Not shipped to Lambda (the artifact leaves ``hardcap_core/local/`` out).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from typing import TYPE_CHECKING, Any

from hardcap_core.config.settings import ROLLUP_FULL_SECONDS, ROLLUP_INTERVAL_SECONDS
from hardcap_core.logs import logger

if TYPE_CHECKING:
    from hardcap_core.config.model import Config
    from hardcap_core.control.live import LiveConfig
    from hardcap_core.rollup.notify import Notifier
    from hardcap_core.rollup.run import RollupReport
    from hardcap_core.rollup.table import UsageTable


class RollupTimer:
    """A rollup pass every ``interval_s`` seconds until :meth:`stop`, then once more."""

    def __init__(
        self,
        config: Config,
        table: UsageTable,
        *,
        interval_s: float = ROLLUP_INTERVAL_SECONDS,
        full_every_s: float = ROLLUP_FULL_SECONDS,
        live: LiveConfig | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"rollup interval must be positive, got {interval_s}")
        self.config = config
        self.live = live  # read again each run: tenants made by the admin API are rolled up
        self.table = table
        self.interval_s = interval_s
        self.full_every_s = full_every_s  # a full pass again after this long (as each invocation)
        self.notifier = notifier  # where threshold notifications go (None: not checked)
        self.runs = 0  # completed runs, failed or not
        self.owner = f"local-{uuid.uuid4().hex[:12]}"  # the streams' lease holder, every pass
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._client: Any = None
        self._notifications: Any = None  # made on the timer's loop, kept across runs
        self._ready = threading.Event()

    def start(self) -> RollupTimer:
        """Start the timer's thread; the first run comes one period from now."""
        self._thread = threading.Thread(target=self._main, name="hardcap-rollup", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the rollup timer's event loop did not start")
        return self

    def run_now(self, timeout_s: float = 60.0) -> RollupReport:
        """Run one full rollup pass now (between the timer's passes, never during one); raises
        its error."""
        loop = self._running_loop()
        return asyncio.run_coroutine_threadsafe(self._run_once(), loop).result(timeout_s)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Run a last rollup, close the cache client and end the thread."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None or loop is None or stopping is None or not thread.is_alive():
            return
        loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout_s)
        if thread.is_alive():
            logger.warning(
                "rollup timer: the last rollup did not finish", extra={"timeout_s": timeout_s}
            )

    def __enter__(self) -> RollupTimer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the rollup timer is not running")
        return self._loop

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        from hardcap_core.rollup.run import paced_passes

        self._loop = asyncio.get_running_loop()
        stopping = self._stopping = asyncio.Event()
        self._lock = asyncio.Lock()
        self._ready.set()
        try:
            await self._pause(self.interval_s)  # the first pass one interval after the start
            await paced_passes(self._run_logged, interval_s=self.interval_s,
                               full_every_s=self.full_every_s, sleep=self._pause,
                               stopped=stopping.is_set)  # fmt: skip
            await self._run_logged(True)  # the last one: what settled before the stop is kept
        finally:
            if self._client is not None:
                await self._client.aclose()

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the timer is stopped meanwhile."""
        assert self._stopping is not None
        with contextlib.suppress(TimeoutError):  # the pause ran out: time for the next pass
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _run_logged(self, full: bool, started: float = 0.0) -> RollupReport | None:
        """A pass, its error logged (None then)."""
        try:
            return await self._run_once(full)
        except Exception:
            # As the next scheduled invocation would on AWS, the next run tries again: the
            # streams keep what this one did not apply.
            logger.exception("rollup failed; the next run retries")
            return None

    async def _run_once(self, full: bool = True) -> RollupReport:
        from hardcap_core.rollup.notify import Notifications
        from hardcap_core.rollup.run import run_rollup

        assert self._lock is not None  # set before the loop serves anything
        async with self._lock:
            try:
                config = self.config if self.live is None else await self.live.reload()
                if self._notifications is None and self.notifier is not None:
                    self._notifications = Notifications(self.notifier, f"local-{id(self):x}")
                report = await run_rollup(config, await self._cache(), self.table,
                                          first_pass=full, owner=self.owner,
                                          notifications=self._notifications)  # fmt: skip
            finally:
                self.runs += 1
        logger.info(
            f"rollup applied {report.applied} records from {report.streams} streams",
            extra={
                "applied": report.applied,
                "streams": report.streams,
                "skipped_busy": report.skipped_busy,
                "replayed": report.replayed,
                "lag_s": report.lag_s,
                "stalled": report.stalled,
                "notified": report.notified,
                "full": full,
            },
        )
        return report

    async def _cache(self) -> Any:
        """The timer's own cache client, made on first use (a failure is retried next run)."""
        if self._client is None:
            from hardcap_core.ledger.connection import connect

            gateway = self.config.gateway
            if not gateway.redis_url:
                raise RuntimeError("the rollup needs gateway.redis_url (or HARDCAP_REDIS_URL)")
            self._client = await connect(gateway.redis_url, cluster=gateway.redis_cluster)
        return self._client
