"""Threshold notifications for local runs: what EventBridge and the template's targets do on AWS.

``hardcap serve`` prints each event as one JSON line on stdout (the envelope EventBridge hands a
target: ``source``, ``detail-type``, ``time``, ``detail``) and, with ``--notify-url`` (or
``HARDCAP_NOTIFY_URL``), POSTs the same JSON there. A POST that fails is logged, not retried:
the line on stdout is the record of the event, and printing it again would show it twice.

Not shipped to Lambda (the artifact leaves ``hardcap_core/local/`` out).
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from hardcap_core.logs import logger

if TYPE_CHECKING:
    from hardcap_core.rollup.notify import Notice

NOTIFY_URL_ENV = "HARDCAP_NOTIFY_URL"
POST_TIMEOUT_S = 5.0


class LocalNotifier:
    """Prints each notification to ``out`` (stdout) and POSTs it to ``url``, if given."""

    def __init__(self, url: str | None = None, out: TextIO | None = None) -> None:
        if url and not url.startswith(("http://", "https://")):
            raise ValueError(f"--notify-url must be an http(s) URL, got {url!r}")
        self.url = url or None
        self.out = out

    async def send(self, notices: Sequence[Notice]) -> list[bool]:
        for n in notices:
            line = json.dumps(n.envelope(), separators=(",", ":"))
            print(line, file=self.out or sys.stdout, flush=True)
            if self.url is not None:
                await asyncio.to_thread(self._post, line)
        return [True] * len(notices)

    def _post(self, body: str) -> None:
        assert self.url is not None
        request = urllib.request.Request(
            self.url, data=body.encode(), method="POST",
            headers={"content-type": "application/json", "user-agent": "hardcap-notify"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=POST_TIMEOUT_S) as reply:
                reply.read()
        except (urllib.error.URLError, OSError) as e:
            logger.warning("notification not posted", extra={"url": self.url, "error": str(e)})
