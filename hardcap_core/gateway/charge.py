"""What a request is priced at when it is admitted (:func:`request_prices`), and what it is
charged when it ends, by how it ended (:meth:`.meter.Meter.settle`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from hardcap_core.budgets import Prices
from hardcap_core.config import Config, Route
from hardcap_core.errors import InvalidRequest
from hardcap_core.events import Usage
from hardcap_core.outcome import Outcome
from hardcap_core.wire.openai_request import price_terms


def request_prices(
    config: Config, route: Route, body: dict[str, Any], input_tokens: int
) -> tuple[Prices, Prices]:
    """The prices a request (its OpenAI-shaped ``body``, ``input_tokens`` its input estimate)
    on ``route`` is held at, and those it is charged at on ``route`` (the meter moves them to
    a fallback that serves it). A service tier that a target of the chain is sent and has no
    price for is a 400 naming ``service_tier``: it would be billed at a price no budget
    holds."""
    terms = price_terms(body)
    for target in config.chain(route) if terms.tier is not None else ():
        if not target.prices.prices_tier(terms.tier):
            listed = ", ".join(name for name, _ in target.prices.tiers)
            raise InvalidRequest(
                f"'service_tier' {terms.tier!r} has no price on the model '{target.name}' "
                f"here (priced: auto, default{', ' + listed if listed else ''}).",
                param="service_tier",
            )
    return config.hold_prices(route, terms, input_tokens), route.prices.with_terms(terms)


class Charge(NamedTuple):
    """The tokens a request is charged, with what the provider said of how it billed them."""

    input: int
    output: int
    cached: int = 0  # input read from the prompt cache
    written: int = 0  # input written to it
    written_1h: int | None = None  # of those, kept an hour (None: the provider did not say)
    tier: str | None = None  # the service tier the provider says it served

    def cost(self, prices: Prices) -> int:
        """What it costs at ``prices`` (the target that served it, with the request's terms)."""
        return prices.cost(
            self.input, self.output, self.cached, self.written, self.written_1h, self.tier
        )


def settle_charge(
    outcome: Outcome,
    usage: Usage | None,
    *,
    final: Usage | None,
    input_estimate: int,
    received: int,
    ended_output: Callable[[], int],
    least_output: int = 0,
) -> Charge:
    """Input, output, cached-input and cache-written input tokens to charge (and of those
    written, how many for an hour; the service tier), from the report they are read from.

    ``usage`` is the last usage report the provider sent, whenever it came; ``final`` is its
    final report (a whole reply's usage; in a stream, one read at or after its finish reason,
    :func:`.relay.tally`), after which nothing is generated. ``received`` is the output that
    arrived as the gateway counts it (forwarded and in hand; the count runs high, never low);
    ``ended_output()`` is the meter's estimate of what a stream the gateway cut generated
    (:meth:`.meter.Meter.estimated_output`, by its hold policy: :mod:`.holds`);
    ``least_output`` the least output a stream that ended without a final report is charged
    (its hold, on a route whose provider bills output it does not stream: :mod:`.unseen`).

    - The provider refused or could not be reached: nothing.
    - A final report is the bill, whether the stream completed or was cut after it was read
      (docs/design.md, "Tokens in flight"): its counts, with the input estimate where it gave
      no input count and ``received`` where it gave no output count, or 0 with output
      received (what arrived proves that low). The lower bound of what streamed (a token a
      piece) is no such proof: it counts every piece of every field, some of which a provider
      does not bill (a field that repeats another's text).
    - No final report: the input the provider reported (Anthropic counts the prompt, cache
      reads and writes apart, in ``message_start``, before any output), else the estimate;
      and ``ended_output()`` if the gateway cut the stream (truncated, deadline, client gone, a
      failure mid-stream), else (it ended without a finish reason, or said it was done with
      no final report) ``received``.

    A report that is not final is a running count, and a floor, never a ceiling: Anthropic's
    ``message_start`` says ``output_tokens: 1`` before any text, and a stream that then
    dropped was charged that 1 however much had streamed. So without a final report the
    output charged is never less than the last reported output, nor the input less than the
    last reported input. Input not reported as billed may all have been a cache write, the
    dearest way to bill it, so it is charged as one (an hour-long one if the request marked
    such writes, :meth:`~hardcap_core.budgets.Prices.cost`).
    """
    if outcome.billed_nothing:
        return Charge(0, 0)
    reported_in = (usage.input_tokens if usage else None) or 0
    reported_out = (usage.output_tokens if usage else None) or 0
    report: Usage | None
    if final is not None:
        report = final
        charged_in = input_estimate if final.input_tokens is None else final.input_tokens
        charged_out = final.output_tokens or received
    else:
        report = usage
        charged_in = input_estimate if usage is None or usage.input_tokens is None else reported_in
        counted = ended_output() if outcome.cut else received
        charged_out = max(counted, reported_out, least_output)
    if report is None:
        return Charge(charged_in, charged_out, 0, charged_in)
    cached = report.cached_input_tokens or 0
    if report.input_tokens is None:  # all of it may have been written, for an hour if marked
        return Charge(charged_in, charged_out, cached, charged_in, None, report.service_tier)
    return Charge(
        charged_in, charged_out, cached, report.cache_write_input_tokens or 0,
        report.cache_write_1h_input_tokens, report.service_tier,
    )  # fmt: skip


def estimated_output(
    known: int, in_flight: int, held: int | None, asked: int | None, least: int
) -> int:
    """Output to charge for a stream the gateway cut, by the meter's estimate of what the
    provider generated. ``known`` (what arrived, counted high; and what it may bill unseen,
    :mod:`.unseen`) is charged in full, even past the hold ``held`` (the ledger then shows
    the overshoot); the guess of the tokens ``in_flight`` only up to the hold, unless there
    is none: ``held`` None when the tenant fails open, or after a ledger call hung (the
    provider really generated for that long): then all of it (:mod:`.holds` decides which).

    A provider bills at most the ``max_tokens`` it was sent (``asked``) unless what arrived
    proves it ignored it (``least``, a token a piece, is past it): the count of the text,
    which must never be low and so runs high, is not charged past it."""
    charge = known + in_flight
    if asked is not None and least <= asked:
        known, charge = min(known, asked), min(charge, asked)
    return charge if held is None else max(known, min(charge, held))
