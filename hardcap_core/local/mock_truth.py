"""The mock upstream's ground truth: what it really generated and billed, per tenant, and per
request for requests that carry a client-chosen id in `metadata.hardcap_bench_id`.

Mutated only from the mock server's event loop, so no lock.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Literal

MAX_REQUEST_RECORDS = 100_000  # per-request records kept (the most recent): bounded memory


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


@dataclasses.dataclass
class RequestTruth:
    """What the mock really did for one request that carried an id.

    `completion_tokens` is every output token generated and billed for it (hidden reasoning
    too), counted as it was handed to the server. `state` is "aborted" for an answer that never
    reached its end (the client or gateway closed the connection, or `die_after` / `eof_after`).
    """

    tenant: str
    prompt_tokens: int
    completion_tokens: int = 0
    state: Literal["in_flight", "finished", "aborted"] = "in_flight"

    def as_json(self) -> dict[str, Any]:
        """The record as `GET /mock/requests` shows it."""
        return dataclasses.asdict(self)


class GroundTruth:
    """Per-tenant counters and per-request records, mutated only from the server's event loop
    (so no lock).

    A request holds on to its tenant's `TenantTruth` (and its `RequestTruth`); after `reset()`
    requests still in flight update the discarded objects, so they never leak into (or drive
    negative) the new counters.
    """

    def __init__(self, max_requests: int = MAX_REQUEST_RECORDS) -> None:
        self._tenants: dict[str, TenantTruth] = {}
        self._requests: collections.OrderedDict[str, RequestTruth] = collections.OrderedDict()
        self._max_requests = max_requests

    def tenant(self, name: str) -> TenantTruth:
        """The live counters of `name`, created on first use."""
        return self._tenants.setdefault(name, TenantTruth())

    def request(self, request_id: str, tenant: str, prompt_tokens: int) -> RequestTruth:
        """A new record for `request_id` (an id used again replaces the older record); the
        oldest record is dropped once more than `max_requests` are kept."""
        record = RequestTruth(tenant, prompt_tokens)
        self._requests.pop(request_id, None)
        self._requests[request_id] = record
        while len(self._requests) > self._max_requests:
            self._requests.popitem(last=False)
        return record

    def receive(
        self, tenant: str, prompt_tokens: int, request_id: Any, *, refused: bool
    ) -> Account | None:
        """Count one request of ``tenant``: refused (an error status or a hang, which providers
        do not bill) only as an error, else billed its prompt and open until its account
        closes; recorded per request when ``request_id`` is a string. None when refused."""
        truth = self.tenant(tenant)
        truth.requests += 1
        if refused:
            truth.errors += 1
            return None
        truth.prompt_tokens += prompt_tokens
        truth.in_flight += 1
        account = Account(truth)
        if isinstance(request_id, str):
            account.record = self.request(request_id, tenant, prompt_tokens)
        return account

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self._tenants = {}
        self._requests = collections.OrderedDict()

    def as_json(self) -> dict[str, Any]:
        """The `GET /mock/ground-truth` body."""
        return {"tenants": {name: t.as_json() for name, t in self._tenants.items()}}

    def requests_json(self) -> dict[str, Any]:
        """The `GET /mock/requests` body: id -> record, oldest first."""
        return {rid: r.as_json() for rid, r in self._requests.items()}


@dataclasses.dataclass
class Account:
    """One request's entry in the ground truth; `close` counts it as completed or aborted once."""

    truth: TenantTruth
    record: RequestTruth | None = None  # set when the request carried an id
    closed: bool = False

    def add_tokens(self, count: int) -> None:
        self.truth.completion_tokens += count
        if self.record is not None:
            self.record.completion_tokens += count

    def close(self, finished: bool) -> None:
        if self.closed:
            return
        self.closed = True
        self.truth.in_flight -= 1
        if finished:
            self.truth.completed += 1
        else:
            self.truth.aborted += 1
        if self.record is not None:
            self.record.state = "finished" if finished else "aborted"
