"""The usage record's formats as the rollup reads them: format 2 (one packed field, what
lua/lib.lua writes for a request without a user), format 3 (format 2 with the user as an 11th
string), format 4 (under a lease) and format 1 (a field per value, still in streams from before
an upgrade); the numbers the scripts write (lua/consts.lua) are the ones parsed."""

from __future__ import annotations

import dataclasses
import re

import pytest

from hardcap_core.ledger.scripts import lua_dir
from hardcap_core.rollup.records import (
    FORMAT_VERSION,
    FORMAT_VERSION_1,
    FORMAT_VERSION_LEASE,
    FORMAT_VERSION_USER,
    FORMATS,
    RecordKind,
    parse_entry,
)
from hardcap_core.rollup.table import Totals

STRINGS = '["s","r1","alpha","acme","key-1","chat","gpt-4o-mini","openai","req\\"1","completed"]'


def test_format_2_is_parsed_field_by_field() -> None:
    r = parse_entry(
        b"1700000000000-3", {b"r": f"2,1,0,200,-150,7,5,120000,1699999999000,{STRINGS}"}
    )
    assert (r.kind, r.reservation_id, r.tenant, r.org, r.key_id) == (
        RecordKind.SETTLE, "r1", "alpha", "acme", "key-1",
    )  # fmt: skip
    assert (r.route, r.model, r.provider, r.request_id, r.outcome) == (
        "chat", "gpt-4o-mini", "openai", 'req"1', "completed",
    )  # fmt: skip
    assert (r.estimate, r.requests, r.input_tokens, r.output_tokens) == (True, 0, 200, -150)
    assert (r.reasoning_tokens, r.cached_input_tokens, r.cost_nusd) == (7, 5, 120000)
    assert (r.admitted_ms, r.at_ms) == (1699999999000, 1700000000000)


def test_format_3_carries_the_user_and_reads_like_format_2() -> None:
    strings = STRINGS[:-1] + ',"alpha~bob@example.com"]'
    r = parse_entry(
        b"1700000000000-4", {b"r": f"3,1,0,200,-150,7,5,120000,1699999999000,{strings}"}
    )
    assert r.user == "alpha~bob@example.com"
    without = parse_entry(
        b"1700000000000-4", {b"r": f"2,1,0,200,-150,7,5,120000,1699999999000,{STRINGS}"}
    )
    assert without.user == ""
    assert dataclasses.replace(r, user="") == without  # nothing else differs


def test_format_1_is_still_read() -> None:
    fields = {
        "v": "1", "kind": "r", "rid": "r2", "tn": "alpha", "org": "", "k": "key-1", "rt": "chat",
        "md": "m", "pv": "p", "rq": "q", "oc": "busy", "est": "0", "n": "1", "in": "0",
        "out": "0", "rs": "0", "ci": "0", "usd": "0", "t0": "5",
    }  # fmt: skip
    r = parse_entry("7-0", fields)
    assert r.refused and r.outcome == "busy" and r.admitted_ms == 5 and r.requests == 1


@pytest.mark.parametrize(
    "fields",
    [
        {"r": "3,0,1,0,0,0,0,0,0,[]"},
        {"r": "4,0,1,0,0,0,0,0,0," + STRINGS},
        {"r": "3,0,1,0,0,0,0,0,0," + STRINGS},  # format 3 without its user
        {"r": "2,0,1,0,0,0,0,0,0," + STRINGS[:-1] + ',"alpha~bob"]'},  # format 2 with one
        {"r": '3,0,1,0,0,0,0,0,0,{"kind":"s"}'},
        {"r": "2,0,1,0,0"},
        {"r": '2,0,1,0,0,0,0,0,0,["s","r1"]'},
        {"r": "2,0,1,x,0,0,0,0,0," + STRINGS},
        {"r": '2,0,1,0,0,0,0,0,0,["?","r1","","","","","","","","oc"]'},
        {"v": "9"},
    ],
)
def test_unknown_or_malformed_records_are_refused(fields: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="usage record 1-0"):
        parse_entry("1-0", fields)


def test_a_client_that_left_the_queue_is_a_refusal_the_rollup_counts() -> None:
    strings = '["r","r3","alpha","acme","key-1","chat","m","p","q","client_gone"]'
    r = parse_entry("9-0", {"r": f"2,0,1,0,0,0,0,0,9,{strings}"})
    assert r.refused and r.outcome == "client_gone" and r.cost_nusd == 0
    totals = Totals()
    totals.add(r)  # a reader with a closed list of refusals failed here
    assert (totals.refused_client_gone, totals.refused) == (1, 1)
    assert (totals.requests, totals.input_tokens, totals.cost_nusd) == (0, 0, 0)


def test_a_refusal_reason_this_version_does_not_know_is_counted_not_fatal() -> None:
    """A newer gateway's refusal reason, read by this rollup during a deploy: one refusal under
    refused_other, instead of an AttributeError that failed every pass until the upgrade."""
    strings = '["r","r4","alpha","acme","key-1","chat","m","p","q","some_future_reason"]'
    r = parse_entry("10-0", {"r": f"2,0,1,0,0,0,0,0,9,{strings}"})
    totals = Totals()
    totals.add(r)
    assert (totals.refused_other, totals.refused, totals.requests) == (1, 1, 0)


def lua_constants() -> dict[str, int]:
    """The integer literals named in lua/consts.lua (``local NAME = 123``)."""
    text = (lua_dir() / "consts.lua").read_text(encoding="utf-8")
    return {m[1]: int(m[2]) for m in re.finditer(r"^local (\w+) = (\d+)\s*(?:--.*)?$", text, re.M)}


def test_the_scripts_write_the_formats_this_parser_names() -> None:
    """The one cross-language half of the format: lua/consts.lua's numbers are the ones read
    here, and every format written (2-4) parses."""
    c = lua_constants()
    written = (c["USAGE_FORMAT"], c["USAGE_FORMAT_USER"], c["USAGE_FORMAT_LEASE"])
    assert tuple(str(v) for v in written) == (
        FORMAT_VERSION, FORMAT_VERSION_USER, FORMAT_VERSION_LEASE,
    )  # fmt: skip
    assert set(FORMATS) == {FORMAT_VERSION_1, *(str(v) for v in written)}
    lease = STRINGS[:-1] + ',"","lease-1"]'
    r = parse_entry("1-0", {"r": f"{c['USAGE_FORMAT_LEASE']},0,1,5,6,0,0,40,3,{lease}"})
    assert (r.user, r.lease, r.input_tokens, r.output_tokens) == ("", "lease-1", 5, 6)
