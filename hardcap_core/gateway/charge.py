"""What a request is charged when it ends, by how it ended (:meth:`.meter.Meter.settle`)."""

from __future__ import annotations

from collections.abc import Callable

from hardcap_core.events import Usage
from hardcap_core.outcome import Outcome


def settle_charge(
    outcome: Outcome,
    usage: Usage | None,
    *,
    final: Usage | None,
    input_estimate: int,
    received: int,
    cut_output: Callable[[], int],
) -> tuple[int, int, int, int]:
    """Input, output, cached-input and cache-written input tokens to charge.

    ``usage`` is the last usage report the provider sent, whenever it came; ``final`` is its
    final report (a whole reply's usage; in a stream, one read at or after its finish reason,
    :func:`.relay.tally`), after which nothing is generated. ``received`` is the output that
    arrived as the gateway counts it (forwarded and in hand; the count runs high, never low);
    ``cut_output()`` is the meter's estimate of what a stream it cut generated
    (:meth:`.meter.Meter.cut_charge`).

    - The provider refused or could not be reached: nothing.
    - A final report is the bill, whether the stream completed or was cut after it was read
      (docs/design.md, "Tokens in flight"): its counts, with the input estimate where it gave
      no input count and ``received`` where it gave no output count, or 0 with output
      received (what arrived proves that low). The lower bound of what streamed (a token a
      piece) is no such proof: it counts every piece of every field, some of which a provider
      does not bill (a field that repeats another's text).
    - Cut (truncated, deadline, client gone, a failure mid-stream) with no final report: the
      input estimate and ``cut_output()``.
    - Otherwise (the stream ended without a finish reason, or said it was done with no final
      report): the reported input, else the estimate, and ``received``.

    A report that is not final is a running count, and a floor, never a ceiling: Anthropic's
    ``message_start`` says ``output_tokens: 1`` before any text, and a stream that then
    dropped was charged that 1 however much had streamed. So without a final report the
    output charged is never less than the last reported output, nor the input less than the
    last reported input. Input not reported as billed may all have been a cache write, the
    dearest way to bill it, so it is charged as one.
    """
    if outcome.billed_nothing:
        return 0, 0, 0, 0
    reported_in = (usage.input_tokens if usage else None) or 0
    reported_out = (usage.output_tokens if usage else None) or 0
    report: Usage | None
    if final is not None:
        report = final
        charged_in = input_estimate if final.input_tokens is None else final.input_tokens
        charged_out = final.output_tokens or received
    elif outcome.cut:
        # A cut stream pays its prompt at the input estimate (docs/design.md, "Cut-stream
        # charge"); a running report of more input raises it.
        report = None
        charged_in = max(input_estimate, reported_in)
        charged_out = max(cut_output(), reported_out)
    else:
        report = usage
        charged_in = input_estimate if usage is None or usage.input_tokens is None else reported_in
        charged_out = max(reported_out, received)
    cached = (report.cached_input_tokens or 0) if report else 0
    written = (report.cache_write_input_tokens or 0) if report else 0
    if report is None or report.input_tokens is None:
        written = charged_in
    return charged_in, charged_out, cached, written
