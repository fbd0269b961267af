"""One ledger call made by whichever release of ``hardcap_core`` is importable: the mixed-version
test (test_mixed_versions.py) runs this file under the previous release's package (a subprocess
with that release on PYTHONPATH: its own client and its own scripts) and calls :func:`run` in
process under this one, so both releases make the same calls on one cache, as instances of
both do for the minutes a deploy takes.

Only the ledger's public API, as both releases have it, is used here. The call is a JSON object
(argv[1] in a subprocess); the answer is a JSON object on stdout.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import hardcap_core
from hardcap_core.budgets import Budget, Dimension, Level, LevelKind, Prices, Scope, Window
from hardcap_core.ledger import Admitted, Extended, Ledger, Reservation, ReservationMeta
from hardcap_core.ledger.connection import connect

PRICES = Prices(2, 5)  # nano-USD per input / output token
KEY = Level(LevelKind.KEY, "k1")
TENANT = Level(LevelKind.TENANT, "acme")
ORG = Level(LevelKind.ORG, "bigco")
# Rows in this order everywhere (usage, remaining): tenant tokens, key output, org cost.
LIMITS = (10_000, 5_000, 10**6)
SCOPE = Scope(
    (KEY, TENANT, ORG),
    (
        Budget(TENANT, Dimension.TOTAL_TOKENS, LIMITS[0], Window.parse("day")),
        Budget(KEY, Dimension.OUTPUT_TOKENS, LIMITS[1], Window.parse("month")),
        Budget(ORG, Dimension.COST_USD, LIMITS[2], Window.parse("month")),
    ),
)


def meta(rid: str) -> ReservationMeta:
    return ReservationMeta(
        route="chat", model="gpt-x", key_id="k1", request_id=f"rq-{rid}", provider="openai"
    )


def reservation(held: dict[str, Any]) -> Reservation:
    """The reservation another release's admit returned, as this release's client holds it."""
    return Reservation(
        id=held["id"],
        scope=SCOPE,
        prices=PRICES,
        input_tokens=held["input"],
        output_reserved=held["output_reserved"],
        meta=meta(held["id"]),
    )


async def call(ledger: Ledger, op: dict[str, Any]) -> dict[str, Any]:
    kind = op["op"]
    if kind == "admit":
        a = await ledger.admit(
            SCOPE,
            input_tokens=op["input"],
            output_estimate=op["estimate"],
            prices=PRICES,
            reservation_id=op["id"],
            meta=meta(op["id"]),
            charge_on_expiry=op.get("charge", False),
        )
        if not isinstance(a, Admitted):
            return {"result": type(a).__name__}
        r = a.reservation
        return {
            "result": "Admitted",
            "id": r.id,
            "input": r.input_tokens,
            "output_reserved": r.output_reserved,
            "at": a.server_time_ms,
        }
    if kind == "extend":
        e = await ledger.extend(reservation(op["held"]), op["tokens"])
        if not isinstance(e, Extended):
            return {"result": type(e).__name__}
        return {"result": "Extended", "granted": e.granted, "output_reserved": e.output_reserved}
    if kind == "settle":
        s = await ledger.settle(
            reservation(op["held"]), input_tokens=op["input"], output_tokens=op["output"]
        )
        return {
            "result": "Settled",
            "duplicate": s.duplicate,
            "had_reservation": s.had_reservation,
            "expiry_charged": s.expiry_charged,
            "remaining": [b.remaining for b in s.budgets],
        }
    if kind == "usage":
        u = await ledger.usage(SCOPE)
        return {
            "result": "Usage",
            "used": [row.used for row in u.rows],
            "reserved": [row.reserved for row in u.rows],
            "live": u.live_reservations,
        }
    raise ValueError(f"unknown op {kind!r}")


async def run(url: str, cluster: bool, ttl_s: float, op: dict[str, Any]) -> dict[str, Any]:
    """Make call ``op`` with a fresh client and ledger (as a new instance of a deploy would)."""
    client = await connect(url, cluster=cluster)
    try:
        out = await call(Ledger(client, reservation_ttl_s=ttl_s), op)
    finally:
        await client.aclose()
    out["package"] = hardcap_core.__file__
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(**json.loads(sys.argv[1])))))
