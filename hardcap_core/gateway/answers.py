"""What the gateway answers besides a reply: how much output fits, a refusal, the usage view."""

from __future__ import annotations

from typing import Any

from hardcap_core.budgets import NANO_USD_PER_USD, Dimension, Prices
from hardcap_core.config import Config, Principal
from hardcap_core.config.settings import SDK_RETRY_AFTER_MAX_SECONDS
from hardcap_core.errors import TooManyRequests
from hardcap_core.ledger import Admitted, Refusal, Refused, UsageRow
from hardcap_core.ledger.breakers import Breakers
from hardcap_core.wire.base import WireFormat


def output_room(admitted: Admitted, prices: Prices) -> int | None:
    """The most output tokens the budgets could still give this request: its reservation
    plus what the tightest budget counting output had left after it (None: no budget counts
    output)."""
    held = admitted.reservation.output_reserved
    room: int | None = None
    for state in admitted.budgets:
        dimension = state.budget.dimension
        if dimension is Dimension.INPUT_TOKENS:
            continue
        left = max(state.remaining, 0)
        if dimension is Dimension.COST_USD:
            price = prices.output_nusd
            if price <= 0:
                continue
            left //= price
        room = left if room is None else min(room, left)
    return None if room is None else held + room


def usage_row(row: UsageRow) -> dict[str, Any]:
    b = row.budget
    cost = b.dimension is Dimension.COST_USD
    out: dict[str, Any] = {
        "level": b.level.kind.value,
        "id": b.level.id,
        "dimension": b.dimension.value,
        "window": b.window.spec,
        "unit": "nano_usd" if cost else "tokens",
        "limit": b.limit,
        "used": row.used,
        "reserved": row.reserved,
        "remaining": row.remaining,
        "reset_seconds": round(row.reset_ms / 1000, 3),
    }
    if cost:
        for name in ("limit", "used", "reserved", "remaining"):
            out[f"{name}_usd"] = out[name] / NANO_USD_PER_USD
    return out


def retry_headers(retry_after_ms: int) -> dict[str, str]:
    """``Retry-After`` (whole seconds, rounded up), ``retry-after-ms``, and ``x-should-retry``:
    ``true`` for a wait the official SDKs may sleep through inside one call, ``false`` above
    :data:`SDK_RETRY_AFTER_MAX_SECONDS` (the anthropic SDK would sleep for as long as it is
    told, a day included; the wait stays in Retry-After for the caller to schedule)."""
    ms = max(retry_after_ms, 1)
    retryable = ms <= SDK_RETRY_AFTER_MAX_SECONDS * 1000
    return {
        "retry-after": str(-(-ms // 1000)),
        "retry-after-ms": str(ms),
        "x-should-retry": "true" if retryable else "false",
    }


def refusal(r: Refused, wire: WireFormat) -> TooManyRequests:
    headers = wire.budget_headers(r.budgets, r.rates, r.server_time_ms)
    if r.never_fits or (r.lease and r.reason is Refusal.EXCEEDED):
        # Larger than the whole budget, or a lease spent (it never refills): no wait helps, so
        # no Retry-After, and the official SDKs are told not to retry (for a 429 without one
        # they would back off and retry).
        headers["x-should-retry"] = "false"
    else:
        # busy: the holds in flight settle within about a second (retry_after_ms is 1000).
        wait_ms = 1000 if r.reason is Refusal.BUSY else r.retry_after_ms
        headers.update(retry_headers(wait_ms))
    return TooManyRequests(r.message, code=r.reason.value, headers=headers)


async def upstream_states(
    config: Config, breakers: Breakers, principal: Principal
) -> list[dict[str, Any]]:
    """The breaker of every upstream this key's routes (and their fallbacks) may use."""
    upstreams = {
        t.upstream.name: t.upstream
        for name, route in config.routes.items()
        if principal.allows(name)
        for t in config.chain(route)
    }
    states = await breakers.states((u.name, u.breaker) for u in upstreams.values())
    return [
        {"name": name, "state": st.state, "consecutive_failures": st.failures}
        for name, st in sorted(states.items())
    ]
