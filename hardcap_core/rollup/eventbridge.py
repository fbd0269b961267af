"""Threshold notifications to Amazon EventBridge (``PutEvents``), through boto3.

This module is the one boundary where botocore's errors for EventBridge are translated: a call
that fails, or an entry EventBridge refuses, becomes a notification not delivered (logged), which
the rollup gives back so the next pass sends it again (rollup/notify.py). The template's rule on
the bus (infra/template.yaml, ``NotificationRule``) matches ``source: hardcap`` and sends the
events on to an SNS topic and a webhook, if the stack names them.

``HARDCAP_EVENT_BUS`` names the bus (the template sets ``default``); unset, the rollup sends no
notifications and writes no claims.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Sequence
from typing import Any

from hardcap_core.logs import logger
from hardcap_core.rollup.notify import DETAIL_TYPE, SOURCE, Notice, Notifications

EVENT_BUS_ENV = "HARDCAP_EVENT_BUS"
BATCH = 10  # PutEvents takes at most 10 entries per call
# A bus that cannot be reached costs a pass seconds, not minutes (botocore's defaults: a 60 s
# connect timeout, retried): the notifications wait for the next pass.
CLIENT_CONFIG = {"connect_timeout": 2, "read_timeout": 5, "retries": {"max_attempts": 2}}


class EventBridgeNotifier:
    """PutEvents on ``bus`` with ``client`` (``boto3.client("events")``, made on first use)."""

    def __init__(self, client: Any = None, bus: str = "default") -> None:
        self._client = client
        self.bus = bus

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            self._client = boto3.client("events", config=Config(**CLIENT_CONFIG))
        return self._client

    async def send(self, notices: Sequence[Notice]) -> list[bool]:
        delivered: list[bool] = []
        for i in range(0, len(notices), BATCH):
            delivered += await asyncio.to_thread(self._put, notices[i : i + BATCH])
        return delivered

    def _put(self, notices: Sequence[Notice]) -> list[bool]:
        from botocore.exceptions import BotoCoreError, ClientError

        entries = [
            {"Source": SOURCE, "DetailType": DETAIL_TYPE, "EventBusName": self.bus,
             "Detail": json.dumps(n.detail(), separators=(",", ":")), "Resources": []}
            for n in notices
        ]  # fmt: skip
        try:
            reply = self.client.put_events(Entries=entries)
        except (ClientError, BotoCoreError) as e:
            logger.warning("EventBridge refused the notifications; the next pass sends them",
                           extra={"error": str(e), "count": len(notices)})  # fmt: skip
            return [False] * len(notices)
        results = reply.get("Entries") or []
        ok = [bool(r.get("EventId")) and not r.get("ErrorCode") for r in results]
        for n, r in zip(notices, results, strict=False):
            if code := r.get("ErrorCode"):
                logger.warning("EventBridge refused a notification; the next pass sends it",
                               extra={"event_id": n.event_id, "error": code})  # fmt: skip
        return ok + [False] * (len(notices) - len(ok))


def notifications_from_env() -> Notifications | None:
    """The rollup's notifications to the bus ``HARDCAP_EVENT_BUS`` names, or None (none)."""
    bus = os.environ.get(EVENT_BUS_ENV, "").strip()
    if not bus:
        return None
    return Notifications(EventBridgeNotifier(bus=bus), f"rollup-{uuid.uuid4().hex[:12]}")
