"""A request's live hold on budget: grow it while output flows, decide when to stop, settle once.

The relay asks :meth:`Meter.make_room` before forwarding each chunk. Near the end of the
reservation the meter extends it; when the budget refuses, truncate mode stops short of the
reservation by a guard, because a provider keeps generating after the gateway stops reading:
tokens in flight and in buffers, which the provider bills too. The guard is the configured
minimum plus the gateway's recent read lag (how many events arrived per network read: a busy
instance reads behind the provider). A cut stream is charged for ``seen + guard`` (at most the
reservation): the ledger errs high, never low.
"""

from __future__ import annotations

import collections
import contextlib
import math
import time
import uuid
from dataclasses import dataclass

from .budgets import Prices, Scope
from .errors import LedgerUnavailable
from .estimators import Estimator
from .ledger import (
    BudgetState,
    Extended,
    ExtendResult,
    Ledger,
    Reservation,
    ReservationGone,
)
from .logs import logger

LAG_WINDOW = 32  # network reads over which the read lag is remembered


@dataclass(frozen=True, slots=True)
class MeterSettings:
    step: int = 64  # ask for this many more output tokens ...
    within: int = 32  # ... when within this many of the reservation
    guard: int = 4  # least tokens a provider may generate after we close
    guard_s: float = 0.05  # how long a provider may take to notice; times its speed, more guard
    heartbeat_s: float = 40.0  # refresh a slow stream's reservation this often
    truncate: bool = True  # False: the `allow` policy, never cut
    extend: bool = True  # False: the `count_after` baseline, which holds nothing while streaming


class Meter:
    """Budget accounting for one request. ``reservation`` is None when the tenant fails open."""

    def __init__(
        self,
        ledger: Ledger,
        scope: Scope,
        reservation: Reservation | None,
        settings: MeterSettings,
        *,
        input_estimate: int,
        estimator: Estimator,
        route: str,
        prices: Prices,
    ) -> None:
        self.ledger = ledger
        self.scope = scope
        self.reservation = reservation
        self.settings = settings
        self.input_estimate = input_estimate
        self.estimator = estimator
        self.route = route
        self.prices = prices
        self.reserved = reservation.output_reserved if reservation else 0
        self.seen = 0
        self.exhausted = False  # the budget refused to grow the reservation
        self.cut = False  # the gateway stopped the stream early
        self.settled = False
        self.final_budgets: tuple[BudgetState, ...] = ()
        self.charged_output = 0
        self.charged_input = 0
        self._refreshed = time.monotonic()
        self._batches: collections.deque[int] = collections.deque(maxlen=LAG_WINDOW)
        self._first_read: float | None = None

    def note_read(self, events: int) -> None:
        """The relay read ``events`` events in one network read (more than one: it lags)."""
        if self._first_read is None:
            self._first_read = time.monotonic()
        self._batches.append(events)

    @property
    def guard(self) -> int:
        """Tokens the provider may generate after we stop reading: the configured least, the
        events we read in one go lately (how far behind the provider we are), and the
        provider's speed times how long it may take to notice the close."""
        lag = max(self._batches, default=1) - 1
        speed = 0.0
        if self._first_read is not None:
            elapsed = time.monotonic() - self._first_read
            speed = self.seen / elapsed if elapsed > 0.05 else 0.0
        return self.settings.guard + max(lag, 0) + math.ceil(speed * self.settings.guard_s)

    @property
    def ceiling(self) -> int:
        """Most output tokens that may be forwarded now."""
        if not self.exhausted:
            return self.reserved
        return max(self.reserved - self.guard, 0)

    async def make_room(self, tokens: int) -> bool:
        """Account ``tokens`` more output; False if truncate mode must stop before them."""
        need = self.seen + tokens
        if self.reservation is None:
            self.seen = need
            return True
        while (
            self.settings.extend
            and not self.exhausted
            and self.reserved - need < self.settings.within
        ):
            want = max(self.settings.step, need + self.settings.within - self.reserved)
            try:
                result: ExtendResult | None = await self.ledger.extend(self.reservation, want)
            except LedgerUnavailable:
                # Cannot grow the hold: finish within what is reserved (still a hard cap).
                logger.warning("budget server lost mid-stream", extra={"route": self.route})
                result = None
            self._refreshed = time.monotonic()
            if isinstance(result, Extended):
                self.reserved = result.output_reserved
            else:
                self.exhausted = True
                if isinstance(result, ReservationGone):
                    logger.warning("reservation expired mid-stream", extra={"route": self.route})
        if self.settings.extend and time.monotonic() - self._refreshed > self.settings.heartbeat_s:
            await self.heartbeat()
        if need <= self.ceiling or not self.settings.truncate:
            self.seen = need
            return True
        self.cut = True
        return False

    async def heartbeat(self) -> None:
        """Keep a slow stream's reservation from expiring."""
        if self.reservation is None:
            return
        try:
            result = await self.ledger.extend(self.reservation, 0)
        except LedgerUnavailable:
            return
        self._refreshed = time.monotonic()
        if isinstance(result, ReservationGone):
            self.exhausted = True

    def cut_charge(self) -> int:
        """Output to charge for a stream that was cut (truncated, client gone, deadline)."""
        charge = self.seen + self.guard
        return min(charge, self.reserved) if self.reservation else charge

    async def settle(
        self, *, input_tokens: int | None, output_tokens: int, truncated: bool
    ) -> None:
        """Charge the real counts once; feed the estimator unless the reply was cut short."""
        if self.settled:
            return
        self.settled = True
        self.charged_input = self.input_estimate if input_tokens is None else input_tokens
        self.charged_output = output_tokens
        if self.reservation is not None:
            try:
                result = await self.ledger.settle(
                    self.reservation, input_tokens=self.charged_input, output_tokens=output_tokens
                )
                self.final_budgets = result.budgets
            except LedgerUnavailable:
                # The hold expires by itself; this request's usage is lost (see docs/design.md).
                logger.error(
                    "settle failed: budget server unreachable", extra={"route": self.route}
                )
                return
        else:
            await self._settle_unguarded()
        if not truncated:
            # One lost sample is harmless: the estimate is advisory.
            with contextlib.suppress(LedgerUnavailable):
                await self.estimator.observe(self.route, output_tokens, truncated=False)

    async def _settle_unguarded(self) -> None:
        """A fail-open request still charges its usage if the server is back by now."""
        orphan = Reservation(uuid.uuid4().hex, self.scope, self.prices, 0, 0)
        try:
            await self.ledger.settle(
                orphan, input_tokens=self.charged_input, output_tokens=self.charged_output
            )
        except LedgerUnavailable:
            logger.warning(
                "fail-open usage not charged: budget server still down", extra={"route": self.route}
            )
