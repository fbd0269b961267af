"""A request's live hold on budget: grow it while output flows, decide when to stop, settle once.

The relay asks :meth:`Meter.make_room` before forwarding each chunk. The meter's estimate of
what the provider has generated is what it forwarded, what it holds unforwarded (the rest of
the last network read, counted exactly) and what is still on its way (:mod:`.pace`). It asks
for more room before that estimate nears the reservation; once the budget refuses, truncate
mode stops as soon as the estimate would pass it, since a provider bills what it generates
after the gateway stops reading. A cut stream is charged that estimate
(:meth:`estimated_output`). Output the provider may bill without streaming it (:mod:`.unseen`)
counts from the start.

What differs between the route's policies, and for a tenant that failed open (nothing held),
is asked of one object picked when the meter is built (:mod:`.money`, which also works out
what an ended request is charged: the meter keeps the live counters and the ledger I/O). Only
this module writes a meter's state: the pipeline and the failover tell it what happened through
methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from hardcap_core.budgets import Prices, Scope
from hardcap_core.config import Policy, Route
from hardcap_core.config.settings import DEFAULT_GATEWAY, GatewaySettings
from hardcap_core.errors import LedgerUnavailable
from hardcap_core.events import Usage
from hardcap_core.gateway.metrics import record_request, record_usage_rejected
from hardcap_core.gateway.money import (
    NO_TOOLS,
    Ended,
    HoldPolicy,
    Implausible,
    ToolHold,
    failed_attempt,
    implausible,
    policy_for,
    reported_output_bound,
)
from hardcap_core.gateway.pace import Pace, RouteRate
from hardcap_core.gateway.unseen import SEEN, Unseen
from hardcap_core.ledger import (
    BudgetState,
    Extended,
    ExtendResult,
    Ledger,
    Reservation,
    ReservationGone,
    ReservationMeta,
)
from hardcap_core.ledger.estimators import Estimator
from hardcap_core.ledger.replies import SettleNote
from hardcap_core.logs import logger
from hardcap_core.outcome import Outcome

if TYPE_CHECKING:  # imported only when tracing is on
    from hardcap_core.gateway.tracing import RequestTrace

# A failed settle is tried again after these pauses: a lost settle loses the request's usage,
# which is worse than a reply that ends a little later.
SETTLE_RETRY_DELAYS_S = (0.1, 0.5)
# A heartbeat the budget server did not answer is tried again this soon, until the hold's TTL
# would have run out.
HEARTBEAT_RETRY_S = 1.0


class SettleFallback(Protocol):
    """Where a settle goes when the cache does not take it (:mod:`hardcap_core.rollup.durable`)."""

    async def keep(
        self,
        reservation: Reservation,
        input_tokens: int,
        output_tokens: int,
        note: SettleNote,
        cost_nusd: int,
    ) -> bool: ...


# A stream's hold is refreshed this many times per reservation TTL, tokens or not, so that a
# heartbeat or two the budget server misses does not let it expire.
HEARTBEATS_PER_TTL = 3
_G = DEFAULT_GATEWAY


@dataclass(frozen=True, slots=True)
class MeterSettings:
    """The ``gateway:`` settings a stream's meter reads (:meth:`of`); by default the config's
    defaults, which are written once (:mod:`hardcap_core.config.settings`)."""

    step: int = _G.extend_step_tokens  # ask for this many more output tokens ...
    within: int = _G.extend_when_within  # ... when within this many of the reservation
    guard: int = _G.truncate_guard_tokens  # least tokens a provider makes after we close
    guard_s: float = _G.truncate_guard_ms / 1000  # how long a provider takes to notice
    heartbeat_s: float = _G.reservation_ttl_seconds / HEARTBEATS_PER_TTL  # refresh this often
    ttl_s: float = _G.reservation_ttl_seconds  # a hold not refreshed this long is reclaimed

    @classmethod
    def of(cls, gateway: GatewaySettings) -> MeterSettings:
        """The meter's settings in a gateway run with ``gateway`` (the loaded config's)."""
        return cls(
            step=gateway.extend_step_tokens,
            within=gateway.extend_when_within,
            guard=gateway.truncate_guard_tokens,
            guard_s=gateway.truncate_guard_ms / 1000,
            heartbeat_s=gateway.reservation_ttl_seconds / HEARTBEATS_PER_TTL,
            ttl_s=gateway.reservation_ttl_seconds,
        )


class Meter:
    """Budget accounting for one request. ``reservation`` is None when the tenant fails open:
    the meter then holds nothing (:class:`.money.NoHold`); else ``policy`` (the route's, or
    its object) says how the hold behaves and what the request is charged."""

    def __init__(
        self,
        ledger: Ledger,
        scope: Scope,
        reservation: Reservation | None,
        settings: MeterSettings,
        *,
        policy: Policy | HoldPolicy = Policy.TRUNCATE,
        input_estimate: int,
        estimator: Estimator,
        route: str,
        prices: Prices,
        meta: ReservationMeta | None = None,
        cap: int | None = None,
        unguarded_id: str | None = None,
        fallback: SettleFallback | None = None,
        upstream: str = "",
        unseen: Unseen = SEEN,
        admitted_in_s: float = 0.0,
        queue_wait_s: float = 0.0,
        loop_lag: Callable[[], float] | None = None,
        route_rate: RouteRate | None = None,
        on_settled: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        tools: ToolHold = NO_TOOLS,
        trace: RequestTrace | None = None,
    ) -> None:
        self.ledger = ledger
        self.scope = scope
        self.reservation = reservation
        self.settings = settings
        # Picked once: the route's policy over a hold, or no hold when the tenant failed open.
        self.policy: HoldPolicy = policy_for(policy, reserved=reservation is not None)
        self.input_estimate = input_estimate
        self.tools = tools  # the server tools held, charged per use reported (money.py)
        self.estimator = estimator
        self.route = route
        self.prices = prices  # of the target that serves the request (a fallback may change it)
        self.charged_cost = 0
        self.served: Route | None = None  # the target that served it, once one was tried
        self.elsewhere_input = 0  # input of attempts that took the request and then failed
        self.elsewhere_output = 0
        self.elsewhere_cost = 0
        self.meta = meta or (reservation.meta if reservation else ReservationMeta(route=route))
        self._clock = clock
        self.fallback = fallback  # None: no durable store; a settle the cache misses is lost
        self.upstream = upstream  # the upstream's config name, for the per-request metric
        self.admitted_in_s = admitted_in_s  # the gateway's time before the upstream was called
        self.queue_wait_s = queue_wait_s  # of that, the time it waited in the admission queue
        # The longest recent stall of this process's event loop, in seconds (gateway/loop_lag).
        self._loop_lag = loop_lag or float  # float() is 0.0: no lag
        self._route_rate = route_rate or RouteRate()  # the route's provider speed, this process
        self._on_settled = on_settled  # budget was released: wake this process's waiters
        self.outcome: Outcome | None = None
        self.reserved = reservation.output_reserved if reservation else 0
        self.seen = 0
        self.floor = 0  # a lower bound of the output forwarded (one token per piece)
        self.exhausted = False  # the budget refused to grow the reservation
        self.hold_lost = False  # the reservation could not be kept alive: stop
        self.ledger_failed = False  # a call to grow or keep the hold got no answer
        self.cap = cap  # the most output tokens this request may have, whatever the provider does
        self.unguarded_id = unguarded_id  # fail open: the id the unanswered admit was sent with
        self.truncated = False  # the budget or the cap stopped the stream: it ends TRUNCATED
        self.settled = False
        self.final_budgets: tuple[BudgetState, ...] = ()
        self.expiry_charged = False  # the hold had expired and been charged before the settle
        self.estimated = False  # charged by our estimate: cut without the provider's report
        self.charged_output = 0
        self.charged_input = 0
        self.in_hand = 0  # tokens received from the provider and not yet forwarded
        # The most output tokens the provider was asked for (max_tokens upstream), once sent;
        # and a lower bound of the output received (one token per piece), which proves it
        # ignored that once past it.
        self.asked: int | None = None
        self.received_least = 0
        # The provider's final usage report, once a read in hand carries it: nothing more is
        # generated, and that is what it bills, cut or not.
        self.final: Usage | None = None
        self.whole = False  # a whole (non-streamed) reply: its usage is its final report
        # A report the provider could not have billed (.money.implausible): from then on no
        # report of this request is believed, and it is charged as one that reported nothing.
        self.disbelieved: Implausible | None = None
        self._refreshed = self._clock()
        self.pace = Pace(clock)
        self.unseen = unseen  # output it may bill without streaming it (.unseen)
        self.trace = trace  # the request's trace, while tracing is on (gateway/tracing.py)

    def billed_elsewhere(self, target: Route, input_tokens: int) -> None:
        """``target`` took the request (it answered 200) and failed before sending anything;
        another target serves it. The failed one may bill the input: it is charged too."""
        bill = failed_attempt(input_tokens, guard=self.settings.guard)
        self.elsewhere_input += bill.input
        self.elsewhere_output += bill.output
        self.elsewhere_cost += bill.cost(target.prices.with_terms(self.prices.terms))

    def asked_for(self, max_tokens: int) -> None:
        """The provider was sent ``max_tokens``: it bills no more unless what arrives proves
        it ignored them (:meth:`estimated_output`)."""
        self.asked = max_tokens

    def serve_with(self, target: Route) -> None:
        """``target`` (the route or one of its fallbacks) serves the request: its prices are
        the ones charged, its model and upstream the ones the usage record names."""
        self.prices = target.prices.with_terms(self.prices.terms)
        self.upstream = target.upstream.name
        self.served = target

    def note_read(self, tokens: int, least: int = 0, final: Usage | None = None) -> None:
        """The relay read ``tokens`` more output tokens (at least ``least``, one per piece)
        from the provider in one network read; ``final``: the provider's final usage report,
        if that read ends the reply with one. The rest of the reply may then go out if the
        reported output fits the hold and the cap, however the gateway's own count of the text
        (a tokenizer's estimate) compares."""
        self.pace.read(tokens)
        self.received_least += least
        self.in_hand += tokens
        final = self.believe(final)
        if final is not None and final.output_tokens is not None:
            self.final = final

    def believe(self, usage: Usage | None) -> Usage | None:
        """``usage`` if the provider could have billed it (:func:`.money.implausible`), else
        None: the request is then charged as one whose provider reported nothing, whatever it
        reports later. The first report disbelieved is logged with its raw value and counted
        (``UpstreamUsageRejected``)."""
        if usage is None or self.disbelieved is not None:
            return None
        asked = self.asked if self.asked is not None else self.cap
        received = self.unseen.tokens + self.seen + self.in_hand
        bad = implausible(
            usage, input_bound=self.input_estimate,
            output_bound=reported_output_bound(asked, received, self.received_least),
        )  # fmt: skip
        if bad is None:
            return usage
        self.disbelieved = bad
        self.final = None
        m = self.meta
        logger.warning(
            "upstream usage rejected: a count it could not have billed",
            extra={"route": self.route, "upstream": self.upstream, "field": bad.field,
                   "raw_value": str(bad.value), "most": bad.most,
                   "request_id": m.request_id, "tenant": m.tenant},
        )  # fmt: skip
        record_usage_rejected(
            upstream=self.upstream, field=bad.field, value=bad.value, most=bad.most
        )
        return None

    def _reported_fits(self) -> bool:
        final = self.final.output_tokens if self.final else None
        if final is None or (self.cap is not None and final > self.cap):
            return False
        return self.policy.fits(final, self.reserved)

    def in_flight(self) -> int:
        """Tokens the provider has generated past what we read, or will before it notices a
        close now (:meth:`.pace.Pace.in_flight`: its speed, the time behind, this process's
        recent stalls, the largest recent read, and the configured least)."""
        s = self.settings
        return self.pace.in_flight(s.guard, s.guard_s, self._loop_lag())

    def charged_in_flight(self) -> int:
        """Tokens a stream whose upstream is closed is charged past what was read
        (:meth:`.pace.Pace.charged`: the provider's rate times the time since its last read,
        the loop's lag not added again)."""
        s = self.settings
        return self.pace.charged(s.guard, s.guard_s, self._loop_lag(), self._route_rate.rate)

    def generated(self) -> int:
        """What the provider has generated by the time a close now would reach it (estimate),
        counting what it may have billed unseen (:mod:`.unseen`) from the start."""
        return self.unseen.tokens + self.seen + self.in_hand + self.in_flight()

    async def make_room(self, tokens: int, *, at_least: int = 1) -> bool:
        """Forward ``tokens`` more output (already received)? False if the stream must stop:
        past the request's cap (any policy), or in truncate mode past what is reserved or once
        the hold is lost.

        ``at_least`` is a lower bound of the same output (one token per streamed piece): the
        cap is checked against the lower bound, so a provider that obeys it is never cut by an
        over-count, and one that ignores it is cut once it is surely past it.
        """
        if self._reported_fits():
            self.floor += at_least
            self._forward(tokens)
            return True
        if self.cap is not None and self.floor + at_least > self.cap:
            self.truncated = True
            await self._cover_in_flight()
            return False
        self.floor += at_least
        policy = self.policy
        if not policy.extends and not policy.truncates:
            self._forward(tokens)  # nothing grows and nothing stops it but the cap
            return True
        if self.hold_lost and policy.truncates:
            self.truncated = True
            return False
        generated = self.generated()
        while (
            policy.extends
            and not self.exhausted
            and self.reserved - generated < self.settings.within
        ):
            want = max(self.settings.step, generated + self.settings.within - self.reserved)
            try:
                result: ExtendResult | None = await self.ledger.extend(self._held(), want)
            except LedgerUnavailable:
                # Cannot grow the hold: finish within what is reserved (still a hard cap).
                logger.warning("budget server lost mid-stream", extra={"route": self.route})
                self.ledger_failed = True
                result = None
            self._refreshed = self._clock()
            if isinstance(result, Extended):
                self.reserved = result.output_reserved
            else:
                self.exhausted = True
                if isinstance(result, ReservationGone):
                    logger.warning("reservation expired mid-stream", extra={"route": self.route})
                    self.hold_lost = True
            generated = self.generated()  # the call took time: the provider went on
        # A hold that cannot grow (the budget refused, or the policy never grows it) ends a
        # stream of a policy that cuts once the estimate would pass it.
        grows = policy.extends and not self.exhausted
        if not policy.truncates or grows or generated <= self.reserved:
            self._forward(tokens)
            return True
        self.truncated = True
        return False

    async def _cover_in_flight(self) -> None:
        """A provider that ignores max_tokens is cut at the request's cap, with budget to
        spare: grow the hold over what it generates before it notices the close, so the cut
        charge (which charges the in-flight guess only up to the hold) counts it too."""
        if not self.policy.extends or self.exhausted:
            return
        want = self.generated() - self.reserved
        if want <= 0:
            return
        try:
            result = await self.ledger.extend(self._held(), want, least=1)
        except LedgerUnavailable:
            return  # the cut charge then counts what the hold covers
        self._refreshed = self._clock()
        if isinstance(result, Extended):
            self.reserved = result.output_reserved

    def _held(self) -> Reservation:
        """The reservation, which a policy that holds, extends or settles a hold has."""
        assert self.reservation is not None, "a hold policy without a reservation called the ledger"
        return self.reservation

    def received_whole(self, tokens: int) -> None:
        """A whole (non-streamed) reply of ``tokens`` output tokens arrived and goes out."""
        self.whole = True
        self._forward(tokens)

    def _forward(self, tokens: int) -> None:
        self.seen += tokens
        self.in_hand = max(self.in_hand - tokens, 0)

    async def heartbeat(self) -> bool:
        """Refresh the reservation's expiry once; False if the budget server did not answer."""
        if not self.policy.holds:
            return True  # nothing held: nothing to refresh
        try:
            result = await self.ledger.extend(self._held(), 0)
        except LedgerUnavailable:
            self.ledger_failed = True
            return False
        self._refreshed = self._clock()
        if isinstance(result, ReservationGone):
            self.exhausted = self.hold_lost = True
        return True

    async def keep_alive(self) -> None:
        """Refresh the hold on a timer for as long as the stream lives (the caller cancels it),
        tokens or not: a provider that thinks silently must not lose its hold, or another
        request would spend it. A hold that cannot be kept is lost: the stream then stops."""
        if not self.policy.extends:
            return
        while not self.hold_lost:
            due = self._refreshed + self.settings.heartbeat_s
            await asyncio.sleep(max(due - self._clock(), 0.0))
            if self._clock() - self._refreshed < self.settings.heartbeat_s:
                continue  # an extend refreshed it meanwhile
            while not await self.heartbeat():
                if self._clock() - self._refreshed >= self.settings.ttl_s:
                    logger.warning("reservation lost: budget server unreachable",
                                   extra={"route": self.route})  # fmt: skip
                    self.exhausted = self.hold_lost = True
                    return
                await asyncio.sleep(HEARTBEAT_RETRY_S)

    def ended(self, usage: Usage | None = None) -> Ended:
        """What this meter knows of the request's output now, for its policy's charge
        (:meth:`.money.HoldPolicy.charge`); ``usage``: a whole reply's report."""
        return Ended(
            input_estimate=self.input_estimate,
            received=self.unseen.tokens + self.seen + self.in_hand,
            in_flight=self.charged_in_flight, reserved=self.reserved, unseen=self.unseen,
            final=usage if self.whole else self.final, ledger_failed=self.ledger_failed,
            asked=self.asked, received_least=self.received_least, tools=self.tools,
        )  # fmt: skip

    def estimated_output(self) -> int:
        """Output to charge for a stream the gateway cut (truncated, client gone, deadline,
        failed): what the provider generated by our estimate, as the hold policy charges it
        (:meth:`.money.HoldPolicy.ended_output`)."""
        return self.policy.ended_output(self.ended())

    async def settle(self, outcome: Outcome, usage: Usage | None = None) -> None:
        """Charge the request once, by how it ended.

        By its policy (:meth:`.money.HoldPolicy.charge`): ``usage`` is the provider's last
        report, the bill if final (a whole reply's, or read with the finish: :meth:`note_read`).
        Only completed replies feed the output-length estimator; the charge and the sample go
        out together."""
        if self.settled:
            return
        self.settled = True
        self.outcome = outcome
        self._route_rate.observe(self.pace)
        usage = self.believe(usage)
        bill = self.policy.charge(outcome, usage, self.ended(usage))
        self.charged_input, self.charged_output = bill.input, bill.output
        self.estimated = bill.estimated
        if outcome.cut:
            usage = self.final
        self.charged_cost = bill.cost(self.prices)  # at the tier and split it reports
        if self.elsewhere_input:
            self.charged_input += self.elsewhere_input
            self.charged_output += self.elsewhere_output
            self.charged_cost += self.elsewhere_cost
        note = SettleNote(
            outcome=outcome.value,
            estimate=bill.estimated,
            reasoning_tokens=(usage.reasoning_tokens or 0) if usage else 0,
            cached_input_tokens=(usage.cached_input_tokens or 0) if usage else 0,
            model=self.served.model if self.served else "",
            provider=self.served.upstream.name if self.served else "",
        )
        span = None if self.trace is None else self.trace.settle_span()
        began = self._clock()
        charge = self._settle_reserved(note) if self.policy.holds else self._settle_unguarded(note)
        if outcome is Outcome.COMPLETED:  # the sample goes out with the settle, in one task
            observed = asyncio.ensure_future(self._observe(self.charged_output))
            try:
                await charge
            finally:
                await observed
        else:
            await charge
        if self._on_settled is not None and self.policy.holds:
            self._on_settled()
        added_ms = (self.admitted_in_s - self.queue_wait_s + self._clock() - began) * 1000
        m = self.meta
        context = {
            "route": self.route, "request_id": m.request_id, "tenant": m.tenant,
            "key_id": m.key_id, "outcome": outcome.value,
            "input_tokens": self.charged_input, "output_tokens": self.charged_output,
            "expiry_charged": self.expiry_charged, "cost_nusd": self.charged_cost,
            "queue_wait_ms": round(self.queue_wait_s * 1000),
            **({"user": m.user} if m.user else {}),
        }  # fmt: skip
        record_request(
            outcome=outcome.value, upstream=self.upstream, added_latency_ms=added_ms,
            queue_wait_ms=self.queue_wait_s * 1000, context=context,
        )  # fmt: skip
        if self.trace is not None:  # the settle line's fields, read once for the trace too
            await self.trace.settled(span, outcome, self.served, context, estimated=self.estimated)

    async def _settle_reserved(self, note: SettleNote) -> None:
        reservation = self._held()
        for delay in (*SETTLE_RETRY_DELAYS_S, None):
            try:
                result = await self.ledger.settle(
                    reservation,
                    input_tokens=self.charged_input,
                    output_tokens=self.charged_output,
                    note=note,
                    cost_nusd=self.charged_cost,
                )
            except LedgerUnavailable as e:
                if delay is None:
                    logger.error(
                        "settle failed: budget server unreachable",
                        extra={"route": self.route, "error": str(e)},
                    )
                    await self._keep(reservation, note)
                    return
                logger.warning(
                    "settle failed, trying again", extra={"route": self.route, "error": str(e)}
                )
                await asyncio.sleep(delay)  # settle is idempotent: safe to send again
                continue
            self.final_budgets = result.budgets
            self.expiry_charged = result.expiry_charged
            return

    async def _observe(self, output_tokens: int) -> None:
        # One lost sample is harmless: the estimate is advisory.
        with contextlib.suppress(LedgerUnavailable):
            await self.estimator.observe(
                self.route, output_tokens, truncated=False, tenant=self.meta.tenant or None
            )

    async def _settle_unguarded(self, note: SettleNote) -> None:
        """A fail-open request still charges its usage: now if the server is back, else later
        from the durable store."""
        # The id the admit was sent with: if it did run after all (its reply was lost), this
        # settles that hold with the real counts instead of leaving it to be charged at expiry.
        rid = self.unguarded_id or uuid.uuid4().hex
        orphan = Reservation(rid, self.scope, self.prices, 0, 0, self.meta)
        try:
            await self.ledger.settle(
                orphan,
                input_tokens=self.charged_input,
                output_tokens=self.charged_output,
                note=note,
                cost_nusd=self.charged_cost,
            )
        except LedgerUnavailable:
            logger.warning(
                "fail-open usage not charged yet: budget server still down",
                extra={"route": self.route},
            )
            await self._keep(orphan, note)

    async def _keep(self, reservation: Reservation, note: SettleNote) -> None:
        """Hand a settle the cache did not take to the durable store, which charges it once
        the cache answers again (without one, the usage is lost: docs/design.md)."""
        if self.fallback is None:
            return
        kept = await self.fallback.keep(
            reservation, self.charged_input, self.charged_output, note, self.charged_cost
        )
        if kept:
            logger.warning("settle kept in the durable store", extra={"route": self.route,
                           "reservation_id": reservation.id})  # fmt: skip
