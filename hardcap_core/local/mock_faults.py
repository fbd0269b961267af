"""Fault injection for the mock upstream: a provider that fails for a while, as real ones do.

`POST /mock/fault` with a JSON object sets a fault that every chat request (OpenAI and
Anthropic modes alike) meets for the next `seconds`:

- `{"mode": "status", "status": 503, "seconds": 7}`: answer that error status (default 503);
  a 429 carries `Retry-After` (`retry_after`, default 1 s), as real providers send it.
- `{"mode": "hang", "seconds": 5}`: accept the request, read it, and never send a byte until
  the client gives up (a provider that stopped answering behind a live load balancer).
- `{"mode": "disconnect", "seconds": 5}`: a stream drops its connection after
  :data:`DISCONNECT_AFTER` steps (`after`: that many instead; 0 drops it right after the
  200, before any event); a whole reply drops mid-body (a crashed host).

`POST /mock/fault` with `{}` clears it, and so does `POST /mock/reset`; `GET /mock/fault`
shows what is set. Nothing a fault refuses is billed; a dropped stream bills what it sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Any, Literal, TypeGuard

from starlette.requests import Request
from starlette.responses import Response

from hardcap_core.local.mock_plan import Plan

Mode = Literal["status", "hang", "disconnect"]
MODES: tuple[Mode, ...] = ("status", "hang", "disconnect")
DISCONNECT_AFTER = 3  # steps a stream sends before a "disconnect" fault drops it
DEFAULT_RETRY_AFTER_S = 1.0
HANG_LIMIT_S = 600.0  # a hung request still ends some day, so a test server can stop


@dataclasses.dataclass(frozen=True)
class Fault:
    """One injected fault, active until `until` (time.monotonic())."""

    mode: Mode
    status: int
    retry_after: float | None
    until: float
    after: int = DISCONNECT_AFTER  # steps a "disconnect" sends first

    def as_json(self) -> dict[str, Any]:
        left = max(0.0, self.until - time.monotonic())
        return {
            "mode": self.mode,
            "status": self.status,
            "retry_after": self.retry_after,
            "seconds_left": round(left, 3),
        }


def parse_fault(body: Any) -> Fault | None:
    """The fault `body` asks for, or None for `{}` (clear). Raises ValueError naming the bad
    field."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    if not body:
        return None
    unknown = set(body) - {"mode", "status", "seconds", "retry_after", "after"}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    mode = body.get("mode", "status")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}")
    seconds = body.get("seconds")
    if not _number(seconds) or seconds <= 0:
        raise ValueError("seconds must be a number > 0")
    status = body.get("status", 503)
    if type(status) is not int or not 400 <= status <= 599:
        raise ValueError("status must be an integer from 400 to 599")
    retry_after = body.get("retry_after")
    if retry_after is not None and (not _number(retry_after) or retry_after < 0):
        raise ValueError("retry_after must be a number >= 0")
    if status == 429 and retry_after is None:
        retry_after = DEFAULT_RETRY_AFTER_S
    after = body.get("after", DISCONNECT_AFTER)
    if type(after) is not int or after < 0:
        raise ValueError("after must be an integer >= 0")
    return Fault(mode, status, retry_after, time.monotonic() + seconds, after)


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Faults:
    """The fault currently set, if it has not run out."""

    def __init__(self) -> None:
        self._fault: Fault | None = None

    def set(self, fault: Fault | None) -> None:
        self._fault = fault

    def active(self) -> Fault | None:
        if self._fault is not None and time.monotonic() >= self._fault.until:
            self._fault = None
        return self._fault

    def as_json(self) -> dict[str, Any]:
        fault = self.active()
        return {"fault": None if fault is None else fault.as_json()}


def retry_headers(retry_after: float | None) -> dict[str, str]:
    """`Retry-After` in whole seconds (rounded up, as the header allows no fraction)."""
    if retry_after is None:
        return {}
    whole = int(retry_after) + (0 if float(retry_after).is_integer() else 1)
    return {"retry-after": str(whole)}


async def hang(request: Request) -> Response:
    """Never answer: wait until the client leaves (or :data:`HANG_LIMIT_S`), then return a
    response nobody receives. The body was read already, so the next message is the
    disconnect."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(HANG_LIMIT_S):
            while (await request.receive())["type"] != "http.disconnect":
                pass
    return Response(status_code=504)


def apply_fault(plan: Plan, fault: Fault | None) -> Plan:
    """``plan`` as the active ``fault`` changes it (a fault wins over the request's own
    directives: a provider outage does not care what the prompt asked for)."""
    if fault is None:
        return plan
    if fault.mode == "status":
        return dataclasses.replace(plan, status=fault.status, retry_after=fault.retry_after)
    if fault.mode == "hang":
        return dataclasses.replace(plan, hang=True)
    die = fault.after if plan.die_after is None else min(plan.die_after, fault.after)
    return dataclasses.replace(plan, die_after=die, drop=True)
