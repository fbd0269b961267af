"""A pure-Python reference model of the leases' bookkeeping (lua/lib.lua: leases), for property
tests only, beside tests/ledger_model.py (which models the ledger without leases).

It follows what the scripts answered (how much output an admit or an extend granted, whether a
lease opened) and applies the same arithmetic: the envelope held on each budget field, the part
a request or a sub-lease draws out of its lease's hold, what a settle returns, what a close
returns to the parent or to the budgets. The property test compares it with the server's raw
keys after every step, and checks the bounds: used + reserved <= limit on every budget, and a
lease's spent + held <= its envelope.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hardcap_core.budgets import Budget, Prices
from tests.ledger_model import amount


@dataclass(slots=True)
class ModelLease:
    id: str
    tokens: int
    parent: str | None
    depth: int
    hold: dict[str, int] = field(default_factory=dict)  # h: held now per budget field
    opened: dict[str, int] = field(default_factory=dict)  # a: held when opened
    drawn: dict[str, int] = field(default_factory=dict)  # c: drawn from the parent
    spent: int = 0  # ut
    held: int = 0  # rt: its live requests' and sub-leases' holds


@dataclass(slots=True)
class ModelRequest:
    lease: str
    fields: tuple[str, ...]
    dims: tuple[str, ...]
    input_tokens: int
    output_tokens: int
    prices: Prices
    drawn: dict[str, int] = field(default_factory=dict)  # lc


class LeaseModel:
    """One scope's budgets, its leases (token envelopes) and the requests under them."""

    def __init__(self, budgets: tuple[Budget, ...]) -> None:
        self.budgets = budgets
        self.used: dict[str, int] = {b.field: 0 for b in budgets}
        self.reserved: dict[str, int] = {b.field: 0 for b in budgets}
        self.leases: dict[str, ModelLease] = {}
        self.requests: dict[str, ModelRequest] = {}

    def fits_open(self, tokens: int, parent: str | None) -> bool:
        """Whether lease_open.lua opens a ``tokens`` envelope (under ``parent``) now."""
        p = self.leases.get(parent) if parent else None
        if p is not None and tokens > p.tokens - p.spent - p.held:
            return False
        for b in self.budgets:
            if b.dimension.short in ("in", "out", "tot"):
                room = b.limit - self.used[b.field] - self.reserved[b.field]
                if tokens > room + (p.hold.get(b.field, 0) if p else 0):
                    return False
        return True

    def open(self, lid: str, tokens: int, parent: str | None) -> None:
        p = self.leases.get(parent) if parent else None
        lease = ModelLease(lid, tokens, parent, p.depth + 1 if p else 1)
        for b in self.budgets:
            if b.dimension.short not in ("in", "out", "tot"):
                continue
            c = self._draw(p, b.field, tokens) if p else 0
            self.reserved[b.field] += tokens - c
            lease.hold[b.field] = lease.opened[b.field] = tokens
            lease.drawn[b.field] = c
        if p:
            p.held += tokens
        self.leases[lid] = lease

    def admit(self, rid: str, lid: str, inp: int, out: int, prices: Prices) -> None:
        lease = self.leases[lid]
        req = ModelRequest(
            lid, tuple(b.field for b in self.budgets),
            tuple(b.dimension.short for b in self.budgets), inp, out, prices,
        )  # fmt: skip
        for b in self.budgets:
            a = amount(b.dimension.short, inp, out, prices)
            c = self._draw(lease, b.field, a)
            if c > 0:
                req.drawn[b.field] = c
            self.reserved[b.field] += a - c
        lease.held += inp + out
        self.requests[rid] = req

    def extend(self, rid: str, grant: int) -> None:
        req = self.requests[rid]
        lease = self.leases.get(req.lease)
        for b in self.budgets:
            a = grant * (1 if b.dimension.short in ("out", "tot") else 0)
            if b.dimension.short == "usd":
                a = grant * req.prices.output_nusd
            c = self._draw(lease, b.field, a) if lease else 0
            if c > 0:
                req.drawn[b.field] = req.drawn.get(b.field, 0) + c
            self.reserved[b.field] += a - c
        if lease:
            lease.held += grant
        req.output_tokens += grant

    def settle(self, rid: str, inp: int, out: int) -> None:
        req = self.requests.pop(rid)
        for f, d in zip(req.fields, req.dims, strict=True):
            self.reserved[f] -= amount(d, req.input_tokens, req.output_tokens, req.prices)
            self.used[f] += amount(d, inp, out, req.prices)
        lease = self.leases.get(req.lease)
        if lease is None:
            return
        for f, d in zip(req.fields, req.dims, strict=True):
            back = max(req.drawn.get(f, 0) - amount(d, inp, out, req.prices), 0)
            self.reserved[f] += back
            lease.hold[f] = lease.hold.get(f, 0) + back
        lease.held = max(lease.held - req.input_tokens - req.output_tokens, 0)
        lease.spent += inp + out

    def close(self, lid: str) -> None:
        lease = self.leases.pop(lid)
        p = self.leases.get(lease.parent) if lease.parent else None
        for f, h in lease.hold.items():
            back = 0
            if p:
                back = min(max(lease.drawn.get(f, 0) - (lease.opened.get(f, 0) - h), 0), h)
            self.reserved[f] -= h - back
            if p and back > 0:
                p.hold[f] = p.hold.get(f, 0) + back
        if p:
            p.held = max(p.held - lease.tokens, 0)
            p.spent += lease.spent + lease.held

    @staticmethod
    def _draw(lease: ModelLease | None, f: str, a: int) -> int:
        if lease is None:
            return 0
        h = lease.hold.get(f, 0)
        c = min(a, h)
        if c <= 0:
            return 0
        lease.hold[f] = h - c
        return c
