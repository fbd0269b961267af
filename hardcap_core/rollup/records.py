"""Usage records: what the ledger scripts append to a hierarchy's usage stream, one per charge.

``lua/lib.lua`` (``append_record``) writes them, in the same script that changes the counters,
so nothing is charged without its record. Field names are short because every settle writes
one; this module is the one place that knows them.

A record's token and cost fields are what it *adds* to the tenant's spend. A request is one
record, except a request whose hold expired before its settle came: the expiry writes a record
of the hold it charged (``estimate``), and the late settle a second one with the difference to
the real counts (``requests`` 0, amounts possibly negative). Their sum is what was billed.

Every record names its format, its version: the first integer of the packed field ``r``
(``lua/consts.lua``: ``USAGE_FORMAT*``, which must equal the ``FORMAT_VERSION*`` here), or the
field ``v`` of format 1. Formats only grow by strings appended at the end, and a script writes
the lowest format that holds what a record says:

====== ======================================================================== =============
format what the record holds                                                    written
====== ======================================================================== =============
1      a field per value (``v`` = 1, ``kind``, ``rid``, ``in``, ...)            no longer
2      ``r`` = ``2,est,n,in,out,rs,ci,usd,t0,`` + JSON [kind, rid, tn, org, k,   no user, no
       rt, md, pv, rq, oc]                                                      lease
3      format 2 + the user (tenant~user) as an 11th string                     with a user
4      format 3 (the user "" if none) + the lease id as a 12th string          under a lease
====== ======================================================================== =============

So a deploy that has no users and opens no leases writes format 2 exactly, which every rollup
since format 2 reads; this rollup reads all four, so streams written before an upgrade (and by
the previous release's scripts during a deploy) are read. A format this module does not know
is refused (ValueError), never guessed at: the rollup is deployed with (or before) a gateway
that writes a new one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

FORMAT_VERSION = "2"  # what lua/lib.lua writes for a request without a user
FORMAT_VERSION_USER = "3"  # ... and with one: format 2 plus the user as an 11th string
# ... and under a lease: format 3 (the user "" if none) plus the lease id as a 12th string.
# Written only under a lease, so a deploy that opens none writes what the release before reads.
FORMAT_VERSION_LEASE = "4"
FORMAT_VERSION_1 = "1"  # still read: a stream may hold them from before an upgrade
FORMATS = (FORMAT_VERSION_1, FORMAT_VERSION, FORMAT_VERSION_USER, FORMAT_VERSION_LEASE)
# Strings after the integers, per packed format: the user is last and only in format 3, so a
# deploy without users writes exactly what a rollup of the release before reads.
_STRINGS = {FORMAT_VERSION: 10, FORMAT_VERSION_USER: 11, FORMAT_VERSION_LEASE: 12}


class RecordKind(StrEnum):
    SETTLE = "s"  # a request settled: the real counts (or the gateway's estimate for a cut)
    EXPIRY = "x"  # a hold expired unsettled and was charged: an estimate
    REFUSAL = "r"  # not admitted: busy, exceeded, never fits, rate limited, client gone; free


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One entry of a usage stream, parsed."""

    entry_id: str  # the stream entry id, "<ms>-<seq>": also when the script ran (server time)
    kind: RecordKind
    reservation_id: str
    tenant: str
    org: str
    key_id: str
    route: str
    model: str  # the upstream model the request was sent to
    provider: str  # the upstream (config name) that served it
    request_id: str
    outcome: str  # an Outcome value, "expired", or a refusal: busy, exceeded, never, rate,
    # client_gone (its client left the admission queue: a rollup older than it fails on it, so
    # the rollup is deployed with the gateway; a reason a rollup does not know is counted as
    # refused_other from this version on)
    estimate: bool  # the charge is the gateway's estimate, not the provider's count
    requests: int  # 1, or 0 for a late settle's correction of an expiry charge
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cached_input_tokens: int
    cost_nusd: int
    admitted_ms: int  # server time of the admission (of the refusal, for a refusal)
    user: str = ""  # the user level's id (tenant~user); "" for a request without a user
    lease: str = ""  # the lease the request drew from (format 4); "" for none

    @property
    def at_ms(self) -> int:
        """Server time the record was written, from its entry id."""
        return int(self.entry_id.split("-", 1)[0])

    @property
    def refused(self) -> bool:
        return self.kind is RecordKind.REFUSAL


def parse_entry(entry_id: str | bytes, fields: Mapping[Any, Any]) -> UsageRecord:
    """A stream entry (as redis-py returns it) as a :class:`UsageRecord`.

    Reads format 2 (one field ``r``: ``2,est,n,in,out,rs,ci,usd,t0,`` then a JSON array of
    kind, rid, tn, org, k, rt, md, pv, rq, oc), format 3 (``3,...``: the same array with the
    user last), format 4 (``4,...``: the user, "" if none, then the lease id) and format 1 (a
    field per value, ``v`` = 1), which a stream may still hold from
    before an upgrade. Raises ValueError for an entry that is not a usage record of a known
    format."""
    f = {_text(k): _text(v) for k, v in fields.items()}
    packed = f.get("r")
    if packed is not None:
        return _parse_packed(_text(entry_id), packed)
    if f.get("v") != FORMAT_VERSION_1:
        raise ValueError(f"usage record {_text(entry_id)} has format {f.get('v')!r}")
    try:
        return UsageRecord(
            entry_id=_text(entry_id),
            kind=RecordKind(f["kind"]),
            reservation_id=f.get("rid", ""),
            tenant=f.get("tn", ""),
            org=f.get("org", ""),
            key_id=f.get("k", ""),
            route=f.get("rt", ""),
            model=f.get("md", ""),
            provider=f.get("pv", ""),
            request_id=f.get("rq", ""),
            outcome=f.get("oc", ""),
            estimate=f.get("est") == "1",
            requests=_int(f.get("n", "1")),
            input_tokens=_int(f.get("in", "0")),
            output_tokens=_int(f.get("out", "0")),
            reasoning_tokens=_int(f.get("rs", "0")),
            cached_input_tokens=_int(f.get("ci", "0")),
            cost_nusd=_int(f.get("usd", "0")),
            admitted_ms=_int(f.get("t0", "0")),
        )
    except KeyError as e:
        raise ValueError(f"usage record {_text(entry_id)} lacks {e}") from e


def _parse_packed(entry_id: str, packed: str) -> UsageRecord:
    parts = packed.split(",", 9)
    count = _STRINGS.get(parts[0])
    if len(parts) != 10 or count is None:
        raise ValueError(f"usage record {entry_id} has format {parts[0]!r}")
    try:
        est, n, inp, out, rs, ci, usd, t0 = (_int(x) for x in parts[1:9])
        strings = json.loads(parts[9])
        if not isinstance(strings, list) or len(strings) != count:
            raise ValueError(f"{count} strings expected in format {parts[0]}")
        kind, rid, tn, org, k, rt, md, pv, rq, oc, *rest = (str(x) for x in strings)
        user, lease = [*rest, "", ""][:2]
        return UsageRecord(
            entry_id=entry_id, kind=RecordKind(kind), reservation_id=rid, tenant=tn, org=org,
            key_id=k, route=rt, model=md, provider=pv, request_id=rq, outcome=oc,
            estimate=est == 1, requests=n, input_tokens=inp, output_tokens=out,
            reasoning_tokens=rs, cached_input_tokens=ci, cost_nusd=usd, admitted_ms=t0,
            user=user, lease=lease,
        )  # fmt: skip
    except (ValueError, TypeError) as e:
        raise ValueError(f"usage record {entry_id} is malformed: {e}") from e


def _text(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _int(x: str) -> int:
    # Lua writes integers, but a number past 2^53 or a float from cjson may come as "1e+15".
    return int(float(x)) if ("e" in x or "." in x) else int(x)
