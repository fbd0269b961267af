"""What a stream's hold does as it runs and how an ended stream is charged, one class per
route policy (:class:`hardcap_core.config.Policy`) and one for a tenant that failed open.

The meter (:class:`.meter.Meter`) picks one object when it is built, from the route's policy and
whether admission reserved anything, and asks it every question whose answer differs between
them: whether to grow the hold and keep it alive, whether to end a stream the budget no longer
covers, whether the provider's final report fits, and what output an ended stream without that
report is charged. The meter itself branches on none of those: a new policy is a new class here.
"""

from __future__ import annotations

from hardcap_core.config import Policy
from hardcap_core.gateway.charge import estimated_output
from hardcap_core.gateway.unseen import Unseen


class HoldPolicy:
    """The decisions a request's hold makes. This base is a hold admission reserved that grows
    as output nears it and never ends a stream on its own; each policy below changes only
    what it does differently."""

    holds = True  # admission reserved budget: the settle releases it (else: an orphan's settle)
    extends = True  # grow the hold near its end; refresh it on a timer while the stream lives
    truncates = False  # end the stream (finish "length") once the budget cannot cover it

    def fits(self, final_output: int, reserved: int) -> bool:
        """Whether the provider's final report of ``final_output`` tokens fits the hold, so the
        rest of the read may go out whatever the gateway's own count says."""
        return final_output <= reserved

    def upstream_cap(self, reserved: int, max_tokens: int) -> int:
        """The ``max_tokens`` a whole (non-streamed) reply is asked for: it cannot be cut."""
        return max_tokens

    def charge_bound(self, reserved: int, *, ledger_failed: bool) -> int | None:
        """The most of the in-flight guess a cut stream is charged (None: all of it). Past the
        hold the budget would have ended the stream; once a ledger call hung, the provider
        really generated for that long, so all of the guess counts."""
        return None if ledger_failed else reserved

    def ended_output(
        self,
        known: int,
        in_flight: int,
        reserved: int,
        *,
        ledger_failed: bool,
        asked: int | None,
        received_least: int,
    ) -> int:
        """Output to charge a stream the gateway cut: ``known`` (what arrived and what may be
        billed unseen) and the guess ``in_flight`` of what the provider generated past it,
        up to :meth:`charge_bound` (:func:`.charge.estimated_output`)."""
        bound = self.charge_bound(reserved, ledger_failed=ledger_failed)
        return estimated_output(known, in_flight, bound, asked, received_least)

    def least_output(
        self, unseen: Unseen, reserved: int, asked: int | None, received_least: int
    ) -> int:
        """The least output a stream that ended without the provider's final report is
        charged (:meth:`.unseen.Unseen.least_billed`: its hold, or without one the cap)."""
        held = self.charge_bound(reserved, ledger_failed=False)
        return unseen.least_billed(held, asked, received_least)


class Truncate(HoldPolicy):
    """``truncate``: the hold grows while the budget allows; the stream ends when it cannot,
    or when the hold is lost. A whole reply, which cannot be cut, is asked for the hold."""

    truncates = True

    def upstream_cap(self, reserved: int, max_tokens: int) -> int:
        return reserved


class Allow(HoldPolicy):
    """``allow``: the hold grows while the budget allows; past it the stream runs on and is
    charged all it made (the ledger shows the overshoot)."""


class CountAfter(HoldPolicy):
    """``count_after``: the benchmarks' baseline: it holds what admission reserved and nothing
    more, and the reply is counted when it ends."""

    extends = False


class NoHold(HoldPolicy):
    """The tenant fails open and the budget server did not answer the admission: nothing is
    held, so nothing grows, refreshes or stops the stream but the request's cap, any final
    report fits, a cut is charged all of the in-flight guess, and the settle charges an orphan
    hold (:meth:`.meter.Meter.settle`)."""

    holds = False
    extends = False

    def fits(self, final_output: int, reserved: int) -> bool:
        return True

    def charge_bound(self, reserved: int, *, ledger_failed: bool) -> int | None:
        return None


NO_HOLD = NoHold()
_BY_POLICY: dict[Policy, HoldPolicy] = {
    Policy.TRUNCATE: Truncate(),
    Policy.ALLOW: Allow(),
    Policy.COUNT_AFTER: CountAfter(),
}


def hold_policy(policy: Policy, *, reserved: bool) -> HoldPolicy:
    """The object a request's meter asks: the route's ``policy`` if admission ``reserved``
    budget, else :data:`NO_HOLD` (a fail-open tenant whose admission got no answer)."""
    return _BY_POLICY[policy] if reserved else NO_HOLD
