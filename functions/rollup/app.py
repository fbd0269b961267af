"""The rollup function: EventBridge Scheduler calls it every minute (template: RollupFunction).

It moves every tenant hierarchy's new usage records from the cache's streams into the DynamoDB
ledger, exactly once, and writes the spend metrics (CloudWatch EMF on stdout), in passes every
few seconds until shortly before its timeout (hardcap_core/rollup/run.py: INTERVAL_S,
RESERVE_S), so a cache that loses its data forgets seconds of usage, not a minute. The event's
content does not matter: each run picks up where the last one left off. Everything is built
once per execution environment and reused by later runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from hardcap_core.logs import logger
from hardcap_core.rollup.run import RESERVE_S
from hardcap_core.rollup.service import rollup_from_env

_service = rollup_from_env()
_loop = asyncio.new_event_loop()


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Rollup passes until RESERVE_S before the invocation's deadline (one pass without a
    Lambda context); returns (and logs) their report."""
    until = None
    if context is not None:
        until = time.monotonic() + context.get_remaining_time_in_millis() / 1000 - RESERVE_S
    report = _loop.run_until_complete(_service.run(until))
    summary = dataclasses.asdict(report)
    logger.info("rollup done", extra=summary)
    return summary


def close() -> None:
    """Close the cache client and the loop (Lambda never needs it; a local caller does)."""
    _loop.run_until_complete(_service.aclose())
    _loop.close()
