"""The budget ledger: a typed client of the Lua scripts in ``lua/``, its replies, estimators
of output length, and the connection to the budget server."""

import sys

# redis-py (8.1 and later) imports the OpenTelemetry SDK's metrics whenever the SDK is installed,
# for metrics of its own that it records only once an application sets them up
# (redis.observability), which Hardcap never does. With the SDK in the Lambda artifact for
# traces (gateway/tracing.py, which use none of its metrics), that was ~30 ms of every cold
# start with tracing off. Marked absent before redis is first imported (this package is where
# hardcap_core first imports it), redis takes the SDK's metrics as not installed; a process that
# imported them already keeps them (tests/unit/test_cold_start_imports.py).
if "opentelemetry.sdk.metrics" not in sys.modules:
    sys.modules["opentelemetry.sdk.metrics"] = None  # type: ignore[assignment]
from hardcap_core.ledger.client import FREE, Ledger
from hardcap_core.ledger.replies import (
    AdmitResult,
    Admitted,
    BudgetState,
    Extended,
    ExtendRefused,
    ExtendResult,
    Queued,
    RateState,
    Refusal,
    Refused,
    Reservation,
    ReservationGone,
    ReservationMeta,
    Settled,
    SettleNote,
    Unguarded,
    UsageRow,
)

__all__ = [
    "FREE",
    "AdmitResult",
    "Admitted",
    "BudgetState",
    "ExtendRefused",
    "ExtendResult",
    "Extended",
    "Ledger",
    "Queued",
    "RateState",
    "Refusal",
    "Refused",
    "Reservation",
    "ReservationGone",
    "ReservationMeta",
    "SettleNote",
    "Settled",
    "Unguarded",
    "UsageRow",
]
