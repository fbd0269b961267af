"""How a request ended: one value per request, set by the one owner of its life.

The stream relay (:class:`hardcap_core.gateway.relay.Relay`) and the non-streamed path each
decide it once; the meter charges by it; the log line and, later, the usage record and the
rollup's metric dimensions carry it.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    COMPLETED = "completed"  # the provider finished (or closed the stream) by itself
    TRUNCATED = "truncated"  # the budget could not cover more: ended with finish "length"
    DEADLINE = "deadline"  # Lambda's timeout came near: ended early, settled in time
    CLIENT_GONE = "client_gone"  # the client disconnected: the provider was closed
    UPSTREAM_ERROR = "upstream_error"  # the provider failed after the response began
    INCOMPLETE = "incomplete"  # the provider's stream ended without saying it was complete
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"  # it refused or could not be reached
    GATEWAY_ERROR = "gateway_error"  # a bug in the gateway ended the stream (logged)

    @property
    def cut(self) -> bool:
        """The gateway stopped the provider before it finished: the charge is an estimate of
        what it generated, and the reply stays out of the output-length sample."""
        return self in _CUT

    @property
    def billed_nothing(self) -> bool:
        """The provider generated nothing it could bill (it answered an error status or
        could not be reached before any output)."""
        return self is Outcome.UPSTREAM_UNAVAILABLE


_CUT = frozenset({Outcome.TRUNCATED, Outcome.DEADLINE, Outcome.CLIENT_GONE, Outcome.UPSTREAM_ERROR})
