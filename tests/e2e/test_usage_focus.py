"""`hardcap usage --format focus` against a usage table (moto's server), as an operator runs it:
the CSV's header is FOCUS 1.2's mandatory columns (then the optional ones it fills), one row per
UTC day, tenant, key, user, route, model and upstream, and each day's rows sum to what
`hardcap usage` totals for that day."""

from __future__ import annotations

import csv
import io
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from hardcap_core.local.aws import LocalAws
from hardcap_core.rollup import focus
from hardcap_core.rollup.records import RecordKind, UsageRecord
from hardcap_core.rollup.run import chunks
from hardcap_core.rollup.table import UsageTable, Write
from tests.e2e.test_local_rollup import hardcap_usage

# FOCUS 1.2's mandatory columns ("Feature level: Mandatory" in specification/columns/*.md of
# FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec at tag v1.2), written out here, not imported.
SPEC_MANDATORY = [
    "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency",
    "BillingPeriodEnd", "BillingPeriodStart", "ChargeCategory", "ChargeClass",
    "ChargeDescription", "ChargePeriodEnd", "ChargePeriodStart", "ContractedCost",
    "EffectiveCost", "InvoiceIssuerName", "ListCost", "PricingQuantity", "PricingUnit",
    "ProviderName", "PublisherName", "ServiceCategory", "ServiceName",
]  # fmt: skip
DAY_MS = 86_400_000
TODAY = int(time.time() * 1000) // DAY_MS * DAY_MS
DAY1, DAY2 = TODAY - 2 * DAY_MS, TODAY - DAY_MS  # two whole days in the past
RECORD = UsageRecord(
    entry_id=f"{DAY1 + 3_600_000}-0", kind=RecordKind.SETTLE, reservation_id="r", tenant="alpha",
    org="acme", key_id="alpha-k", route="small", model="mock-small", provider="mock",
    request_id="q", outcome="completed", estimate=False, requests=1, input_tokens=100,
    output_tokens=50, reasoning_tokens=0, cached_input_tokens=0, cost_nusd=200_123,
    admitted_ms=DAY1 + 3_599_000,
)  # fmt: skip
SPENT = [
    RECORD,
    replace(RECORD, entry_id=f"{DAY1 + 7_200_000}-0", user="alpha~ann", cost_nusd=1_000_001),
    replace(
        RECORD,
        entry_id=f"{DAY1 + 7_200_000}-1",
        route="big",
        model="mock-big",
        provider="claude",
        input_tokens=7,
        output_tokens=9,
        cost_nusd=3,
    ),
    replace(
        RECORD,
        entry_id=f"{DAY1 + 9_000_000}-0",
        kind=RecordKind.REFUSAL,
        requests=1,
        outcome="exceeded",
        input_tokens=0,
        output_tokens=0,
        cost_nusd=0,
        key_id="alpha-r",
    ),
    replace(RECORD, entry_id=f"{DAY2 + 60_000}-0", cost_nusd=55_555_555_555),
    replace(RECORD, entry_id=f"{DAY2 + 120_000}-0", tenant="beta", org="", key_id="beta-k"),
]


@pytest.fixture
def spent() -> Iterator[LocalAws]:
    """A usage table holding :data:`SPENT`, written as the rollup writes it."""
    with LocalAws(table=f"hardcap-usage-{uuid.uuid4().hex[:8]}") as aws:
        table = UsageTable(aws.client(), aws.table)
        for root, records in (("o:acme", SPENT[:5]), ("t:beta", SPENT[5:])):
            cursor = None
            for chunk in chunks(records):
                last = chunk.records[-1].entry_id
                applied = table.apply(root, "g", cursor, last, chunk.totals, len(chunk.records))
                assert applied is Write.APPLIED
                cursor = last
        yield aws


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def focus_rows(*args: str) -> tuple[list[str], list[dict[str, str]]]:
    out = hardcap_usage("--format", "focus", *args)
    assert out.returncode == 0, out.stderr
    reader = csv.DictReader(io.StringIO(out.stdout))
    return list(reader.fieldnames or []), list(reader)


def usage_total(since: int, until: int) -> int:
    out = hardcap_usage("--json", "--since", iso(since), "--until", iso(until))
    assert out.returncode == 0, out.stderr
    return sum(int(r["cost_nusd"]) for r in json.loads(out.stdout))


def test_the_header_is_focus_1_2s_mandatory_columns(spent: LocalAws) -> None:
    header, rows = focus_rows("--since", iso(DAY1), "--until", iso(TODAY))
    assert header[: len(SPEC_MANDATORY)] == SPEC_MANDATORY
    assert header == list(focus.COLUMNS)
    for row in rows:  # the mandatory columns that allow no null are filled
        for column in SPEC_MANDATORY:
            if column not in ("ChargeClass", "PricingQuantity", "PricingUnit"):
                assert row[column], (column, row)


def test_each_days_rows_sum_to_hardcap_usages_total(spent: LocalAws) -> None:
    _, rows = focus_rows("--since", iso(DAY1), "--until", iso(TODAY))
    by_day: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_day.setdefault(row["ChargePeriodStart"], []).append(row)
    assert sorted(by_day) == [iso(DAY1), iso(DAY2)]
    for start in (DAY1, DAY2):
        day = by_day[iso(start)]
        assert {r["ChargePeriodEnd"] for r in day} == {iso(start + DAY_MS)}
        billed = sum(Decimal(r["BilledCost"]) for r in day)
        assert billed == Decimal(usage_total(start, start + DAY_MS)) / 10**9
        for r in day:
            assert r["BilledCost"] == r["EffectiveCost"] == r["ListCost"] == r["ContractedCost"]
    assert sum(Decimal(r["BilledCost"]) for r in by_day[iso(DAY2)]) == Decimal("55.555755678")


def test_a_row_per_day_tenant_key_user_route_model_and_upstream(spent: LocalAws) -> None:
    _, rows = focus_rows("--since", iso(DAY1), "--until", iso(TODAY))
    # The refusal charged nothing: no row for alpha-r.
    seen = sorted(
        (r["ChargePeriodStart"], json.loads(r["Tags"]).get("hardcap/user", ""), r["SkuId"],
         r["ProviderName"], r["ServiceName"], r["ConsumedQuantity"], r["BilledCost"])
        for r in rows
    )  # fmt: skip
    assert seen == [
        (iso(DAY1), "", "mock-big", "claude", "big", "16", "0.000000003"),
        (iso(DAY1), "", "mock-small", "mock", "small", "150", "0.000200123"),
        (iso(DAY1), "ann", "mock-small", "mock", "small", "150", "0.001000001"),
        (iso(DAY2), "", "mock-small", "mock", "small", "150", "0.000200123"),
        (iso(DAY2), "", "mock-small", "mock", "small", "150", "55.555555555"),
    ]
    beta = next(r for r in rows if r["SubAccountId"] == "beta")
    assert json.loads(beta["Tags"]) == {"hardcap/tenant": "beta", "hardcap/key": "beta-k"}
    assert beta["BillingAccountId"] == "beta"  # a tenant without an org is its own account
    alpha = next(r for r in rows if r["SubAccountId"] == "alpha")
    assert alpha["BillingAccountId"] == "acme"
    assert (alpha["BillingCurrency"], alpha["ChargeCategory"], alpha["ServiceCategory"]) == (
        "USD", "Usage", "AI and Machine Learning")  # fmt: skip
    assert (alpha["PricingUnit"], alpha["ConsumedUnit"], alpha["RegionId"]) == (
        "Tokens", "Tokens", "")  # fmt: skip
    assert alpha["BillingPeriodStart"].endswith("-01T00:00:00Z")


def test_tenant_filter_and_a_window_inside_a_day(spent: LocalAws) -> None:
    _, rows = focus_rows("--tenant", "beta", "--since", iso(DAY2), "--until", iso(DAY2 + 3_600_000))
    assert [(r["SubAccountId"], r["ChargePeriodStart"], r["ChargePeriodEnd"]) for r in rows] == [
        ("beta", iso(DAY2), iso(DAY2 + 3_600_000))
    ]


def test_days_cut_a_window_at_utc_midnight() -> None:
    assert focus.days(DAY1 + 5, DAY2 + 7) == [(DAY1 + 5, DAY2), (DAY2, DAY2 + 7)]
    assert focus.days(DAY1, DAY1) == []
    assert focus.usd(55_555_555_555) == "55.555555555" and focus.usd(0) == "0"
