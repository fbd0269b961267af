"""The rollup function: EventBridge Scheduler calls it every minute (template: RollupFunction).

It moves every tenant hierarchy's new usage records from the cache's streams into the DynamoDB
ledger, exactly once, and writes the spend metrics (CloudWatch EMF on stdout). The event's
content does not matter: each run picks up where the last one left off. Everything is built
once per execution environment and reused by later runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from hardcap_core.logs import logger
from hardcap_core.rollup.service import rollup_from_env

_service = rollup_from_env()
_loop = asyncio.new_event_loop()


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """One rollup run; returns (and logs) its report."""
    report = _loop.run_until_complete(_service.run())
    summary = dataclasses.asdict(report)
    logger.info("rollup done", extra=summary)
    return summary


def close() -> None:
    """Close the cache client and the loop (Lambda never needs it; a local caller does)."""
    _loop.run_until_complete(_service.aclose())
    _loop.close()
