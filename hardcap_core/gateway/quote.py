"""A quote: what a request would cost and whether it would be admitted now, without calling the
upstream, reserving, or writing a usage record (`POST /v1/hardcap/quote` with an OpenAI chat
or Responses body, `POST /v1/messages/quote` with an Anthropic Messages body,
`POST /v1/embeddings/quote` with an embeddings body).

The request is parsed, authenticated, routed and priced exactly as a chat request is; its input
is the route's tokenizer count where it has one better than the bound. The budgets are read
with the usage script (which reserves nothing), and :func:`decide` replays ``lua/admit.lua``'s
decision on those numbers in Python. The answer is advisory: the admit is the authority. It can
differ from a quote when other requests change the counters in between, when others wait in the
tenant's queue (the quote does not see the queue: it answers as the first in line), and for a
lease's envelope or a cross-tenant row's allowance, which the usage script does not read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal

from hardcap_core.budgets import Dimension
from hardcap_core.chat import ChatRequest
from hardcap_core.config import Principal, Route
from hardcap_core.errors import LedgerUnavailable, ServiceUnavailable
from hardcap_core.gateway.answers import usage_row
from hardcap_core.gateway.money import Hold, output_cap, policy_for, request_prices, tool_hold
from hardcap_core.ledger.replies import RateState, Usage, UsageRow
from hardcap_core.wire.openai_input import check_pdf_pages

if TYPE_CHECKING:
    from hardcap_core.gateway.pipeline import Gateway

Action = Literal["admit", "queue", "refuse"]
HUGE = 2**53  # admit.lua's "no limit from this budget"
MINUTE_MS = 60_000
BUSY_RETRY_MS = 1000  # admit.lua: holds in flight settle within about a second


@dataclass(frozen=True, slots=True)
class RateNow:
    """One level's rate limits and what is left of them now (None: that limit is not set)."""

    tag: str
    requests_per_minute: int | None
    requests_remaining: int | None  # rpm less the sliding window's estimate, admit.lua's `est`
    requests_reset_ms: int
    tokens_per_minute: int | None
    tokens_room: int | None  # tpm less live holds and tokens ended in the last 60 s
    tokens_reset_ms: int


@dataclass(frozen=True, slots=True)
class Ask:
    """What admit.lua is called with, for one request."""

    input_tokens: int  # `i`
    output_estimate: int  # `o`
    min_output: int  # `mo`
    input_nusd: int  # `pi`: the hold's price per input token
    output_nusd: int  # `po`
    headroom: int  # `hr`: output tokens kept free per live reservation
    waits: bool  # `q` > 0: the request would queue where a plain one is refused 'busy'


@dataclass(frozen=True, slots=True)
class Decision:
    """What admit.lua would answer: ``admit`` (with the output it would reserve), ``queue``, or
    ``refuse`` with admit.lua's reason (busy, exceeded, never, rate) and what it names."""

    action: Action
    reason: str | None = None
    what: str | None = None  # a budget field, or '<level tag>:rpm|tpm'
    retry_after_ms: int | None = None
    output_reserved: int | None = None


def amount(dim: str, inp: int, out: int, pin: int, pout: int) -> int:
    """lib.lua's ``amount``: what ``inp`` input and ``out`` output tokens add to ``dim``."""
    if dim == "in":
        return inp
    if dim == "out":
        return out
    if dim == "tot":
        return inp + out
    return inp * pin + out * pout


def per_output(dim: str, pout: int) -> int:
    """lib.lua's ``per_output``: what one more output token adds to ``dim``."""
    if dim in ("out", "tot"):
        return 1
    return pout if dim == "usd" else 0


def decide(
    ask: Ask,
    rows: Sequence[UsageRow],
    live: dict[str, int],
    rates: Sequence[RateNow],
) -> Decision:
    """admit.lua's decision for ``ask`` against ``rows`` (used and reserved per budget), the
    live reservations per level tag and the levels' ``rates``; in admit.lua's order:
    requests per minute, the budgets (never, exceeded, wait, shrink at the tail), then tokens
    per minute. Advisory: the same numbers give the same answer, but the admit reads them
    again, atomically, and is the authority."""
    for r in rates:
        if r.requests_per_minute is not None and (r.requests_remaining or 0) < 1:
            return Decision("refuse", "rate", f"{r.tag}:rpm", max(r.requests_reset_ms, 1))
    est_in, est_out, min_out = ask.input_tokens, ask.output_estimate, ask.min_output
    pin, pout = ask.input_nusd, ask.output_nusd
    fit = fit_room = fit_idle = HUGE
    tight: UsageRow | None = None
    tight_idle = rows[0] if rows else None
    for row in rows:
        dim, limit = row.budget.dimension.short, row.budget.limit
        fixed = amount(dim, est_in, 0, pin, pout)
        per = per_output(dim, pout)
        free = limit - row.used - row.reserved - fixed
        idle = limit - row.used - fixed
        if per == 0:
            f = HUGE if free >= 0 else -1
            fr = f
            fi = HUGE if idle >= 0 else -1
        else:
            f = fr = free // per  # Lua's math.floor of the quotient
            if ask.headroom > 0 and row.reserved > 0:
                fr = f - ask.headroom * live.get(row.budget.level.tag, 0)
            fi = idle // per
        fit = min(fit, f)
        if fr < fit_room:
            fit_room, tight = fr, row
        if fi < fit_idle:
            fit_idle, tight_idle = fi, row
    tight = tight or (rows[0] if rows else None)

    def wait() -> Decision:
        what = tight.budget.field if tight else None
        if ask.waits:
            return Decision("queue", "busy", what)
        return Decision("refuse", "busy", what, BUSY_RETRY_MS)

    if fit_idle < min_out:
        for row in rows:
            dim = row.budget.dimension.short
            room = row.budget.limit - amount(dim, est_in, 0, pin, pout)
            per = per_output(dim, pout)
            if (per == 0 and room < 0) or (per > 0 and room // per < min_out):
                return Decision("refuse", "never", row.budget.field, 0)
        assert tight_idle is not None
        return Decision("refuse", "exceeded", tight_idle.budget.field, tight_idle.reset_ms)
    if fit_idle >= est_out:
        if fit_room < est_out:
            return wait()
        out = est_out
    else:
        if fit < fit_idle or fit < min_out:
            return wait()
        out = min(est_out, fit)
    for r in rates:
        if r.tokens_per_minute is not None and r.tokens_room is not None:
            need = min(est_in + out, r.tokens_per_minute)
            if r.tokens_room < need:
                return Decision("refuse", "rate", f"{r.tag}:tpm", max(r.tokens_reset_ms, 1))
            out = min(out, max(r.tokens_room - est_in, min_out))
    return Decision("admit", output_reserved=out)


def usd(nusd: int) -> str:
    """nano-USD as an exact decimal USD string, as the cost header writes it."""
    return f"{Decimal(nusd).scaleb(-9).normalize():f}"


async def quote(gw: Gateway, raw: bytes, principal: Principal, parse: Any) -> dict[str, Any]:
    """The quote of one request body (``parse``: the wire format's parser, so a bad body is
    the same 400 as on the chat endpoint). Reads the budgets; reserves and records nothing."""
    chat: ChatRequest = parse(raw)
    principal = gw.callers.for_request(principal, chat)
    route = gw.route_for(chat.model, principal)
    check_pdf_pages(chat.body, route.max_pdf_pages)
    max_tokens = output_cap(route, chat)  # or a 400, as the chat endpoint's
    tools = tool_hold(gw.config, route, chat)  # or a 400 naming the tool, as admission's
    counted = await gw.counts.count(route, chat)
    tokens = gw.counts.bound(route, chat) if counted is None else counted
    tokens += tools.input_tokens  # what the server tools' results add, as admission holds it
    held, prices = request_prices(gw.config, route, chat, tokens, tools)  # or a 400
    expected = await gw.estimators[route.name].estimate(
        route.name, max_tokens, tenant=principal.tenant_id
    )
    hold = policy_for(route.policy).hold(route, chat, max_tokens, expected)  # as admission's
    ask = _ask(gw, route, principal, tokens, hold, held)
    try:
        usage = await gw.ledger.usage(principal.scope, rates=True)
    except LedgerUnavailable as e:
        raise ServiceUnavailable("The budget server is unreachable; retry shortly.") from e
    decision = decide(ask, usage.rows, _live(usage), [_rate_now(r) for r in usage.rates])
    worst = tokens * held.input_nusd + max_tokens * held.output_nusd
    return {
        "object": "hardcap.quote",
        "model": route.name,
        "input_tokens": tokens,
        "input_counted": counted is not None,  # by the route's tokenizer; else the bound
        "max_tokens": max_tokens,
        "expected_output_tokens": min(expected, max_tokens),
        "worst_case_cost_usd": usd(worst),
        "expected_cost_usd": usd(prices.cost(tokens, min(expected, max_tokens)) + tools.nusd),
        "decision": _decision(decision),
        "budgets": [
            _budget(row, tokens, max_tokens, held.input_nusd, held.output_nusd)
            for row in usage.rows
        ],
        "rate_limits_checked": True,
        "advisory": True,
    }


def _rate_now(r: RateState) -> RateNow:
    """A rate limit's state as usage.lua read it, in the terms :func:`decide` checks."""
    limit = r.limit
    return RateNow(
        limit.level.tag, limit.requests_per_minute, r.requests_remaining,
        r.requests_reset_ms or 0, limit.tokens_per_minute, r.tokens_remaining,
        r.tokens_reset_ms or 0,
    )  # fmt: skip


def _ask(
    gw: Gateway, route: Route, principal: Principal, tokens: int, hold: Hold, held: Any
) -> Ask:
    """The admit's arguments: ``hold`` as :meth:`Gateway._admit` asks it of the route's policy
    (:meth:`.money.HoldPolicy.hold`), the rest as it sends them."""
    g = gw.config.gateway
    return Ask(
        input_tokens=tokens, output_estimate=hold.estimate, min_output=hold.least,
        input_nusd=held.input_nusd, output_nusd=held.output_nusd,
        headroom=g.extend_headroom_tokens,
        waits=principal.queue_wait_s(route, g.queue_wait_seconds) > 0,
    )  # fmt: skip


def _live(usage: Usage) -> dict[str, int]:
    return {level.tag: n for level, n in usage.live_by_level}


def _budget(row: UsageRow, tokens: int, max_tokens: int, pin: int, pout: int) -> dict[str, Any]:
    """A budget's row as ``/v1/hardcap/usage`` shows it, with what the worst case takes."""
    out = usage_row(row)
    b = row.budget
    worst = amount(b.dimension.short, tokens, max_tokens, pin, pout)
    out["field"] = b.field
    out["worst_case"] = worst
    if b.dimension is Dimension.COST_USD:
        out["worst_case_usd"] = worst / 1e9
    return out


def _decision(d: Decision) -> dict[str, Any]:
    out: dict[str, Any] = {"action": d.action, "reason": d.reason, "budget": d.what}
    if d.retry_after_ms is not None:
        out["retry_after_seconds"] = round(d.retry_after_ms / 1000, 3)
    if d.output_reserved is not None:
        out["output_tokens_reserved"] = d.output_reserved
    out["message"] = _message(d)
    return out


def _message(d: Decision) -> str:
    if d.action == "admit":
        return "Would be admitted now."
    if d.action == "queue":
        return f"Would wait in the admission queue until holds in flight on {d.what} settle."
    return {
        "busy": f"Would be refused until holds in flight on {d.what} settle.",
        "exceeded": f"Would be refused: {d.what} has too little left in this window.",
        "never": f"Would never be admitted: it is larger than {d.what}'s whole limit.",
        "rate": f"Would be refused by the rate limit {d.what}.",
    }.get(d.reason or "", "Would be refused.")
