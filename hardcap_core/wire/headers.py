"""Budget headers on every response: success, error or stream.

- OpenAI-style ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, so clients that
  already back off on OpenAI's headers back off here too;
- ``X-Token-Budget-{Limit,Remaining,Reset}`` for the tightest token budget (reset as an
  ISO 8601 UTC time, since budgets reset on calendar boundaries);
- ``X-Cost-Budget-{Limit,Remaining}-USD`` when a cost budget applies.
Each value comes from the same script reply that admitted or refused the request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from hardcap_core.budgets import NANO_USD_PER_USD, Dimension
from hardcap_core.ledger.replies import BudgetState, RateState

TOKEN_DIMENSIONS = (Dimension.TOTAL_TOKENS, Dimension.OUTPUT_TOKENS, Dimension.INPUT_TOKENS)


def duration(ms: int) -> str:
    """OpenAI's reset format: ``20ms``, ``1.5s``, ``6m0s``, ``1h2m3s``."""
    ms = max(ms, 0)
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:g}s"
    whole = int(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m}m{s}s" if h else f"{m}m{s}s"


def budget_headers(
    budgets: Sequence[BudgetState], rates: Sequence[RateState], now_ms: int
) -> dict[str, str]:
    """Headers describing the tightest budget and rate limit in these states."""
    headers: dict[str, str] = {}
    tokens = [b for b in budgets if b.budget.dimension in TOKEN_DIMENSIONS]
    if tokens:
        tight = min(tokens, key=lambda b: b.remaining)
        remaining = max(tight.remaining, 0)
        headers["x-token-budget-limit"] = str(tight.budget.limit)
        headers["x-token-budget-remaining"] = str(remaining)
        headers["x-token-budget-reset"] = _iso((now_ms + tight.reset_ms) // 1000)
        headers["x-token-budget-scope"] = (
            f"{tight.budget.level} {tight.budget.dimension.value} {tight.budget.window.spec}"
        )
        headers["x-ratelimit-limit-tokens"] = str(tight.budget.limit)
        headers["x-ratelimit-remaining-tokens"] = str(remaining)
        headers["x-ratelimit-reset-tokens"] = duration(tight.reset_ms)
    cost = [b for b in budgets if b.budget.dimension is Dimension.COST_USD]
    if cost:
        tight_cost = min(cost, key=lambda b: b.remaining)
        headers["x-cost-budget-limit-usd"] = _usd(tight_cost.budget.limit)
        headers["x-cost-budget-remaining-usd"] = _usd(max(tight_cost.remaining, 0))
    _rate_headers(headers, rates)
    return headers


def _rate_headers(headers: dict[str, str], rates: Sequence[RateState]) -> None:
    requests = [
        r for r in rates if r.limit.requests_per_minute and r.requests_remaining is not None
    ]
    if requests:
        tight = min(requests, key=lambda r: r.requests_remaining or 0)
        headers["x-ratelimit-limit-requests"] = str(tight.limit.requests_per_minute)
        headers["x-ratelimit-remaining-requests"] = str(tight.requests_remaining)
        headers["x-ratelimit-reset-requests"] = duration(tight.requests_reset_ms or 0)
    windows = [r for r in rates if r.limit.tokens_per_minute and r.tokens_remaining is not None]
    if windows:
        tb = min(windows, key=lambda r: r.tokens_remaining or 0)
        current = headers.get("x-ratelimit-remaining-tokens")
        # A tokens-per-minute window tighter than every budget is what the client should watch.
        if current is None or (tb.tokens_remaining or 0) < int(current):
            headers["x-ratelimit-limit-tokens"] = str(tb.limit.tokens_per_minute)
            headers["x-ratelimit-remaining-tokens"] = str(tb.tokens_remaining)
            headers["x-ratelimit-reset-tokens"] = duration(tb.tokens_reset_ms or 0)


_last_iso: tuple[int, str] = (-1, "")


def _iso(second: int) -> str:
    """``second`` (Unix time) as ISO 8601 UTC; the last one is kept, as every request on a
    budget resetting at the same boundary asks for the same."""
    global _last_iso
    if _last_iso[0] != second:
        _last_iso = (second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second)))
    return _last_iso[1]


def _usd(nano: int) -> str:
    return f"{nano / NANO_USD_PER_USD:.6f}"
