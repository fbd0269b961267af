"""What a request is charged when it ends, by how it ended (:meth:`.meter.Meter.settle`)."""

from __future__ import annotations

from collections.abc import Callable

from hardcap_core.events import Usage
from hardcap_core.outcome import Outcome


def settle_charge(
    outcome: Outcome,
    usage: Usage | None,
    *,
    input_estimate: int,
    received: int,
    cut_output: Callable[[], int],
) -> tuple[int, int, int, int]:
    """Input, output, cached-input and cache-written input tokens to charge.

    The provider refused or could not be reached: nothing. Cut short with no final report from
    the provider: the input estimate and ``cut_output()``, the meter's estimate. Otherwise the
    provider's report, with the input estimate where it gave no input count and the
    ``received`` output where it gave none (a reported 0 with output received is not
    believed). Input not reported as billed may all have been a cache write, the dearest way
    to bill it, so it is charged as one.
    """
    if outcome.billed_nothing:
        return 0, 0, 0, 0
    if outcome.cut and usage is None:
        charged_in, charged_out = input_estimate, cut_output()
    else:
        reported_in = usage.input_tokens if usage else None
        charged_in = input_estimate if reported_in is None else reported_in
        charged_out = (usage.output_tokens if usage else None) or received
    cached = (usage.cached_input_tokens or 0) if usage else 0
    written = (usage.cache_write_input_tokens or 0) if usage else 0
    if usage is None or usage.input_tokens is None:
        written = charged_in
    return charged_in, charged_out, cached, written
