"""The budget ledger: a typed client of the Lua scripts in ``lua/``, its replies, estimators
of output length, and the connection to the budget server."""

from hardcap_core.ledger.client import FREE, Ledger
from hardcap_core.ledger.replies import (
    AdmitResult,
    Admitted,
    BudgetState,
    Consensus,
    EstimatorStats,
    Extended,
    ExtendRefused,
    ExtendResult,
    RateState,
    Refusal,
    Refused,
    Reservation,
    ReservationGone,
    ReservationMeta,
    Settled,
    SettleNote,
    Unguarded,
    Usage,
    UsageRow,
)

__all__ = [
    "FREE",
    "AdmitResult",
    "Admitted",
    "BudgetState",
    "Consensus",
    "EstimatorStats",
    "ExtendRefused",
    "ExtendResult",
    "Extended",
    "Ledger",
    "RateState",
    "Refusal",
    "Refused",
    "Reservation",
    "ReservationGone",
    "ReservationMeta",
    "SettleNote",
    "Settled",
    "Unguarded",
    "Usage",
    "UsageRow",
]
