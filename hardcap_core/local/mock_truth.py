"""The mock upstream's ground truth: what it really generated and billed, per tenant, and per
request for requests that carry a client-chosen id in `metadata.hardcap_bench_id`; and per
tenant a timeline of tokens in 100 ms slots (prompt tokens when a request is received,
completion tokens as they are generated), to measure any sliding window, e.g. what a
tokens-per-minute limit really let through.

Mutated only from the mock server's event loop, so no lock.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

MAX_REQUEST_RECORDS = 100_000  # per-request records kept (the most recent): bounded memory
SLOT_MS = 100  # the timeline's resolution
MAX_SLOTS = 36_000  # per tenant, the most recent: an hour of 100 ms slots (bounded memory)


class Timeline:
    """One tenant's tokens per time slot: slot start (epoch ms) -> [prompt, completion]. Slots
    with nothing are not kept; past `max_slots` kept the oldest are dropped."""

    def __init__(
        self, clock: Callable[[], float], slot_ms: int = SLOT_MS, max_slots: int = MAX_SLOTS
    ) -> None:
        self._clock = clock
        self.slot_ms = slot_ms
        self._max = max_slots
        self._slots: collections.OrderedDict[int, list[int]] = collections.OrderedDict()

    def _slot(self) -> list[int]:
        ms = int(self._clock() * 1000)
        start = ms - ms % self.slot_ms
        slot = self._slots.get(start)
        if slot is None:
            slot = self._slots[start] = [0, 0]
            while len(self._slots) > self._max:
                self._slots.popitem(last=False)
        return slot

    def add(self, prompt: int = 0, completion: int = 0) -> None:
        slot = self._slot()
        slot[0] += prompt
        slot[1] += completion

    def rows(self) -> list[list[int]]:
        """[slot start ms, prompt, completion], oldest first (the clock never goes back much;
        sorted all the same)."""
        return [[start, p, c] for start, (p, c) in sorted(self._slots.items())]


def worst_window(
    rows: Sequence[Sequence[int]], slot_ms: int = SLOT_MS, window_ms: int = 60_000
) -> dict[str, int]:
    """The most tokens (prompt + completion) in any `window_ms` of consecutive slots of a
    timeline's rows: `tokens` over windows that start on a slot boundary (each a window the
    timeline saw whole), with the window's start; `bound`, the same over one more slot, an upper
    bound for a window starting anywhere."""
    per = {int(r[0]): int(r[1]) + int(r[2]) for r in rows}
    best = {"tokens": 0, "start_ms": 0, "bound": 0}
    if not per:
        return best
    span = window_ms // slot_ms
    first, last = min(per), max(per)
    for n, key in ((span, "tokens"), (span + 1, "bound")):
        total, top, at = 0, 0, 0
        # Every window [start, start + n slots) with a slot of tokens in it, as a running sum
        # (the first one's earlier slots are all empty).
        for start in range(first - (n - 1) * slot_ms, last + slot_ms, slot_ms):
            total += per.get(start + (n - 1) * slot_ms, 0)
            if total > top:
                top, at = total, start
            total -= per.get(start, 0)
        best[key] = top
        if key == "tokens":
            best["start_ms"] = at
    return best


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

    def __init__(
        self, max_requests: int = MAX_REQUEST_RECORDS, clock: Callable[[], float] = time.time
    ) -> None:
        self._tenants: dict[str, TenantTruth] = {}
        self._timelines: dict[str, Timeline] = {}
        self._requests: collections.OrderedDict[str, RequestTruth] = collections.OrderedDict()
        self._max_requests = max_requests
        self._clock = clock

    def timeline(self, name: str) -> Timeline:
        """The timeline of `name`, created on first use."""
        line = self._timelines.get(name)
        if line is None:
            line = self._timelines[name] = Timeline(self._clock)
        return line

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
        line = self.timeline(tenant)
        line.add(prompt=prompt_tokens)
        account = Account(truth, timeline=line)
        if isinstance(request_id, str):
            account.record = self.request(request_id, tenant, prompt_tokens)
        return account

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self._tenants = {}
        self._timelines = {}
        self._requests = collections.OrderedDict()

    def as_json(self) -> dict[str, Any]:
        """The `GET /mock/ground-truth` body."""
        return {"tenants": {name: t.as_json() for name, t in self._tenants.items()}}

    def timeline_json(self, tenant: str) -> dict[str, Any]:
        """The `GET /mock/timeline?tenant=` body: slot_ms, rows [slot start ms, prompt,
        completion] oldest first (slots with no tokens left out), and the worst 60 s window."""
        line = self._timelines.get(tenant)
        rows = line.rows() if line else []
        return {
            "tenant": tenant,
            "slot_ms": SLOT_MS,
            "rows": rows,
            "worst_60s": worst_window(rows),
        }

    def requests_json(self) -> dict[str, Any]:
        """The `GET /mock/requests` body: id -> record, oldest first."""
        return {rid: r.as_json() for rid, r in self._requests.items()}


@dataclasses.dataclass
class Account:
    """One request's entry in the ground truth; `close` counts it as completed or aborted once."""

    truth: TenantTruth
    record: RequestTruth | None = None  # set when the request carried an id
    closed: bool = False
    timeline: Timeline | None = None

    def add_tokens(self, count: int) -> None:
        self.truth.completion_tokens += count
        if self.timeline is not None:
            self.timeline.add(completion=count)
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
