"""``hardcap usage --format focus``: the usage table as FOCUS 1.2 rows (CSV), so a FinOps tool
reads LLM spend next to the cloud bill.

One row per UTC day and per :class:`~hardcap_core.rollup.table.UsageRow` of that day: tenant,
key, user, route, model and upstream. The cost is what the ledger charged (list, contracted,
billed and effective are the same: the gateway applies no discount); the quantity is the
tokens charged, input + output. Columns: FOCUS 1.2's mandatory ones first (each row fills them,
null where a column does not apply), then the conditional and recommended ones Hardcap can
fill. Column ids, allowed values and formats are from the FOCUS_Spec repository at tag v1.2
(``specification/columns/*.md``: "Feature level: Mandatory").

Pure formatting, like :mod:`.report`: it imports nothing from AWS.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from hardcap_core.rollup.table import UsageRow

DAY_MS = 86_400_000

# FOCUS 1.2's mandatory columns, in the spec's (alphabetical) order.
MANDATORY = (
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ServiceCategory",
    "ServiceName",
)
# Conditional and recommended columns whose condition Hardcap meets (it measures usage, has
# SKUs and resources, sub-accounts and tags), or that it can fill.
OPTIONAL = (
    "ChargeFrequency",
    "ConsumedQuantity",
    "ConsumedUnit",
    "PricingCategory",
    "RegionId",
    "RegionName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceSubcategory",
    "SkuId",
    "SubAccountId",
    "SubAccountName",
    "SubAccountType",
    "Tags",
)
COLUMNS = (*MANDATORY, *OPTIONAL)
# Provider-defined tag keys carry a prefix of the provider's own (FOCUS 1.2, Tags).
TAG_PREFIX = "hardcap/"
UNIT = "Tokens"  # a count-based unit (FOCUS UnitFormat: "<plural-units>")


def days(start_ms: int, end_ms: int) -> list[tuple[int, int]]:
    """[start, end) cut at UTC midnights: one charge period per day, the first and last
    clipped to the window."""
    out = []
    lo = start_ms
    while lo < end_ms:
        hi = min((lo // DAY_MS + 1) * DAY_MS, end_ms)
        out.append((lo, hi))
        lo = hi
    return out


def rows(
    periods: Iterable[tuple[int, int, Sequence[UsageRow]]],
) -> list[dict[str, str]]:
    """The FOCUS rows of each charge period's usage rows (``(start_ms, end_ms, rows)``).
    A row that charged nothing (only refusals) is no charge and has no FOCUS row."""
    out = []
    for start_ms, end_ms, usage in periods:
        for row in usage:
            tokens = row.input_tokens + row.output_tokens
            if not tokens and not row.cost_nusd:
                continue
            out.append(_row(row, start_ms, end_ms, tokens))
    return out


def write_csv(out: TextIO, focus_rows: Iterable[dict[str, str]]) -> None:
    """The CSV: a header of :data:`COLUMNS`, then the rows; null is an empty field."""
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(focus_rows)


def usd(nusd: int) -> str:
    """nano-USD as an exact decimal (FOCUS NumericFormat: no exponent, no thousands marks)."""
    return f"{Decimal(nusd).scaleb(-9).normalize():f}"


def _row(row: UsageRow, start_ms: int, end_ms: int, tokens: int) -> dict[str, str]:
    cost = usd(row.cost_nusd)
    account = row.org or row.tenant  # who is invoiced: the org, or a tenant without one
    month, next_month = _month(start_ms)
    user = row.user.split("~", 1)[1] if "~" in row.user else row.user
    tags = {f"{TAG_PREFIX}tenant": row.tenant, f"{TAG_PREFIX}key": row.key_id}
    if user:
        tags[f"{TAG_PREFIX}user"] = user
    if row.org:
        tags[f"{TAG_PREFIX}org"] = row.org
    return {
        "BilledCost": cost,
        "BillingAccountId": account,
        "BillingAccountName": account,
        "BillingCurrency": "USD",
        "BillingPeriodEnd": next_month,
        "BillingPeriodStart": month,
        "ChargeCategory": "Usage",
        "ChargeClass": "",  # null: not a correction of an earlier billing period
        "ChargeDescription": (
            f"{row.input_tokens} input and {row.output_tokens} output tokens of {row.model} "
            f"through {row.provider}, route {row.route}, {row.requests} requests"
        ),
        "ChargePeriodEnd": _time(end_ms),
        "ChargePeriodStart": _time(start_ms),
        "ContractedCost": cost,
        "EffectiveCost": cost,
        "InvoiceIssuerName": row.provider,
        "ListCost": cost,
        "PricingQuantity": str(tokens),
        "PricingUnit": UNIT,
        "ProviderName": row.provider,
        "PublisherName": row.provider,
        "ServiceCategory": "AI and Machine Learning",
        "ServiceName": row.route,
        "ChargeFrequency": "Usage-Based",
        "ConsumedQuantity": str(tokens),
        "ConsumedUnit": UNIT,
        "PricingCategory": "Standard",
        "RegionId": "",
        "RegionName": "",
        "ResourceId": row.route,
        "ResourceName": row.route,
        "ResourceType": "Route",
        "ServiceSubcategory": "Generative AI",
        "SkuId": row.model,
        "SubAccountId": row.tenant,
        "SubAccountName": row.tenant,
        "SubAccountType": "Tenant",
        "Tags": json.dumps(tags, sort_keys=True, separators=(",", ":")),
    }


def _time(ms: int) -> str:
    """FOCUS DateTimeFormat: extended ISO 8601, UTC, 'YYYY-MM-DDTHH:mm:ssZ'."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _month(ms: int) -> tuple[str, str]:
    """The billing period of a charge at ``ms``: its calendar month, UTC."""
    day = datetime.fromtimestamp(ms / 1000, UTC)
    start = day.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return start.strftime("%Y-%m-%dT%H:%M:%SZ"), end.strftime("%Y-%m-%dT%H:%M:%SZ")
