"""The mock upstream's ground truth: what it really generated and billed, per tenant.

Mutated only from the mock server's event loop, so no lock.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class TenantTruth:
    """What the mock really did for one tenant.

    `completion_tokens` counts reasoning and output tokens as they were handed to the server.
    `aborted`: answers that never reached their end (client gone, or `die_after`). `errors`:
    injected error statuses, which count as requests but bill nothing.
    """

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    completed: int = 0
    aborted: int = 0
    in_flight: int = 0
    errors: int = 0

    def as_json(self) -> dict[str, int]:
        """The counters plus `total_tokens`."""
        counters = dataclasses.asdict(self)
        counters["total_tokens"] = self.prompt_tokens + self.completion_tokens
        return counters


class GroundTruth:
    """Per-tenant counters, mutated only from the server's event loop (so no lock).

    A request holds on to its tenant's `TenantTruth`; after `reset()` requests still in flight
    update the discarded object, so they never leak into (or drive negative) the new counters.
    """

    def __init__(self) -> None:
        self._tenants: dict[str, TenantTruth] = {}

    def tenant(self, name: str) -> TenantTruth:
        """The live counters of `name`, created on first use."""
        return self._tenants.setdefault(name, TenantTruth())

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self._tenants = {}

    def as_json(self) -> dict[str, Any]:
        """The `GET /mock/ground-truth` body."""
        return {"tenants": {name: t.as_json() for name, t in self._tenants.items()}}


@dataclasses.dataclass
class Account:
    """One request's entry in the ground truth; `close` counts it as completed or aborted once."""

    truth: TenantTruth
    closed: bool = False

    def add_tokens(self, count: int) -> None:
        self.truth.completion_tokens += count

    def close(self, finished: bool) -> None:
        if self.closed:
            return
        self.closed = True
        self.truth.in_flight -= 1
        if finished:
            self.truth.completed += 1
        else:
            self.truth.aborted += 1
