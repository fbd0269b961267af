"""Users in CloudWatch without a custom metric per user.

By default no EMF object has a User dimension (a metric per user per dimension set would be
$0.30 a user-month): the rollup's objects are the same with and without users, and the gateway's
per-request line carries the user as a plain property, which Logs Insights reads. The dashboard's
"top users by cost" log widget queries those lines; every field its query reads must be one the
line carries. ``RollupMetrics(per_user=True)`` adds a (Tenant, User) set for whoever pays for it.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest

from hardcap_core.gateway.metrics import record_request
from hardcap_core.rollup.metrics import RollupMetrics
from tests.functional.test_dashboard_metrics import (
    RECORD,
    SAMPLE,
    dashboard_widgets,
    declared,
    emf_blobs,
    values,
)

BOB = replace(RECORD, user="acme~bob", cost_nusd=300_000)
WITH_USERS = [*SAMPLE, BOB, replace(BOB, user="acme~ann", output_tokens=5)]

# The query of the dashboard's log widget (without its SOURCE): spend per tenant and user over
# the dashboard's window, dearest first, from the gateway's "request settled" lines.
TOP_USERS_QUERY = (
    'filter message = "request settled" and ispresent(user)'
    " | fields cost_nusd / 1000000000 as req_usd, input_tokens + output_tokens as req_tokens"
    " | stats sum(req_usd) as cost_usd, sum(req_tokens) as tokens, count(*) as requests"
    " by tenant, user"
    " | sort cost_usd desc"
    " | limit 100"
)
# Words of the Logs Insights language the query uses: everything else is a log field or alias.
_LANGUAGE = {"filter", "and", "or", "not", "ispresent", "fields", "as", "stats", "sum", "count",
             "by", "sort", "desc", "asc", "limit", "source"}  # fmt: skip


def settled_line(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The gateway's line for a settled request of a user, with the context the meter gives it."""
    context = {
        "route": "small", "request_id": "r-1", "tenant": "acme", "key_id": "k1",
        "user": "acme~bob", "outcome": "completed", "input_tokens": 120, "output_tokens": 30,
        "cost_nusd": 180_000, "expiry_charged": False, "queue_wait_ms": 0,
    }  # fmt: skip
    record_request(outcome="completed", upstream="openai", added_latency_ms=1.0, context=context)
    (line,) = capsys.readouterr().out.splitlines()
    blob: dict[str, Any] = json.loads(line)
    return blob


def fields_read(query: str) -> set[str]:
    """The log fields a Logs Insights query reads: its words, less the language's, the aliases it
    defines and string literals."""
    query = re.sub(r"SOURCE\s+'[^']*'\s*\|", "", query)
    query = re.sub(r'"[^"]*"', "", query)
    aliases = set(re.findall(r"\bas\s+(\w+)", query))
    words = set(re.findall(r"\b[a-z_][a-z0-9_]*\b", query))
    return words - _LANGUAGE - aliases


def test_no_user_dimension_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    metrics = RollupMetrics()
    metrics.add_records(SAMPLE)
    metrics.flush()
    without = sorted(json.dumps(b, sort_keys=True) for b in emf_blobs(capsys.readouterr().out))
    metrics.add_records(WITH_USERS)
    metrics.flush()
    blobs = emf_blobs(capsys.readouterr().out)
    assert not any("User" in dims for b in blobs for _, dims, _ in declared(b))
    # The users' spend is in the tenant's metrics, in the same objects as without users.
    assert len(blobs) == len(without)
    assert values(blobs, {"Tenant": "acme"}, "CostUSD") == [pytest.approx(715_000 / 1e9)]


def test_per_user_adds_tenant_and_user_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    metrics = RollupMetrics(per_user=True)
    metrics.add_records(WITH_USERS)
    metrics.flush()
    blobs = emf_blobs(capsys.readouterr().out)
    bob = {"Tenant": "acme", "User": "acme~bob"}
    assert values(blobs, bob, "CostUSD") == [pytest.approx(0.0003)]
    assert values(blobs, bob, "Tokens") == [150]
    assert values(blobs, {"Tenant": "acme", "User": "acme~ann"}, "Tokens") == [125]
    users = {frozenset(d) for b in blobs for _, d, _ in declared(b) if "User" in d}
    assert users == {frozenset({"Tenant", "User"})}  # requests without a user add none


def test_the_request_line_carries_the_user_as_a_property(
    capsys: pytest.CaptureFixture[str],
) -> None:
    blob = settled_line(capsys)
    assert (blob["user"], blob["cost_nusd"], blob["tenant"]) == ("acme~bob", 180_000, "acme")
    assert not any("user" in {d.lower() for d in dims} for _, dims, _ in declared(blob))


def test_the_top_users_query_reads_only_what_the_line_carries(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = settled_line(capsys)
    assert fields_read(TOP_USERS_QUERY) == {
        "message", "user", "cost_nusd", "input_tokens", "output_tokens", "tenant"
    }  # fmt: skip
    assert fields_read(TOP_USERS_QUERY) <= set(line)
    assert line["message"] == "request settled"
    # And every log widget on the dashboard, once the template has one.
    for widget in dashboard_widgets():
        if widget["type"] == "log":
            query = widget["properties"]["query"]
            assert fields_read(query) <= set(line), widget["properties"]["title"]
