"""The rollup's CloudWatch metrics: spend per tenant, model and route, as EMF lines on stdout.

The rollup aggregates before it writes, so a minute of any traffic costs one EMF object per
tenant, tenant x model, route and tenant x refusal reason, each metric carrying one value: the
custom-metric bill grows with tenants and models, never with requests (docs/deploy.md).
Users are not a dimension by default: one metric per user per dimension set at $0.30 a month
would grow the bill with a tenant's end users. Spend per user is read from the gateway's
per-request log lines with Logs Insights instead (docs/deploy.md); ``per_user`` adds the
(Tenant, User) set for a deploy that wants it in CloudWatch metrics and pays for it.

Every object is timestamped with the start of the minute its records were written in, so a
rollup that runs late (or catches up after a failure) still puts spend in the minute it
happened. CloudWatch drops datapoints older than 14 days or more than 2 hours ahead; a bucket
out of that range is logged and left out instead of being sent to be dropped.

No object carries a ``service`` dimension: Powertools adds one whenever a service name is set
or ``POWERTOOLS_SERVICE_NAME`` is in the environment, and a metric with an extra dimension is
a different metric that the dashboard and the alarms would not see.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from aws_lambda_powertools.metrics.functions import is_metrics_disabled, validate_emf_timestamp
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import (
    AmazonCloudWatchEMFProvider,
)
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.constants import (
    MAX_DIMENSIONS,
    MAX_METRICS,
)

from hardcap_core.logs import logger
from hardcap_core.rollup.records import UsageRecord
from hardcap_core.rollup.table import Totals

NAMESPACE = "Hardcap"
MINUTE_MS = 60_000
NANO_USD = 1e9
# A dimension value CloudWatch would reject as empty (a record without a model, say) is
# counted under this one rather than dropped.
NO_VALUE = "none"

COUNT = "Count"
# CloudWatch has no currency unit: dollars are a plain number.
USD = "None"

# (dimension names, metrics with their units): one EMF object per group, minute and values.
TENANT = (("Tenant",), (
    ("InputTokens", COUNT), ("OutputTokens", COUNT), ("Tokens", COUNT), ("CostUSD", USD),
    ("Requests", COUNT), ("Truncations", COUNT), ("EstimatedCharges", COUNT),
))  # fmt: skip
TENANT_MODEL = (("Tenant", "Model"), (("Tokens", COUNT), ("CostUSD", USD), ("Requests", COUNT)))
ROUTE = (("Route",), (
    ("Tokens", COUNT), ("CostUSD", USD), ("Requests", COUNT), ("Truncations", COUNT),
))  # fmt: skip
# Only with per_user: three metrics per user that spent in a month, $0.90 a month each.
TENANT_USER = (("Tenant", "User"), (("Tokens", COUNT), ("CostUSD", USD), ("Requests", COUNT)))
# Both sets in one object: the same count, once per reason overall and once per tenant.
REJECTIONS = (("Tenant", "Reason"), ("Reason",))
RUN = (("RollupLagSeconds", "Seconds"), ("RecordsApplied", COUNT))
BUDGET = ("BudgetUsedPercent", "Percent")


def _values(t: Totals) -> dict[str, float]:
    """A minute's totals as the metrics that carry them."""
    return {
        "InputTokens": t.input_tokens,
        "OutputTokens": t.output_tokens,
        "Tokens": t.input_tokens + t.output_tokens,
        "CostUSD": t.cost_nusd / NANO_USD,
        "Requests": t.requests,
        "Truncations": t.truncated,
        "EstimatedCharges": t.estimated,
    }


@dataclass(slots=True)
class _Minute:
    tenants: dict[str, Totals] = field(default_factory=lambda: defaultdict(Totals))
    models: dict[tuple[str, str], Totals] = field(default_factory=lambda: defaultdict(Totals))
    routes: dict[str, Totals] = field(default_factory=lambda: defaultdict(Totals))
    users: dict[tuple[str, str], Totals] = field(default_factory=lambda: defaultdict(Totals))
    rejections: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))


@dataclass(frozen=True, slots=True)
class _Blob:
    timestamp_ms: int
    dimension_sets: tuple[tuple[tuple[str, str], ...], ...]  # first set, then extra ones
    metrics: tuple[tuple[str, str, float], ...]  # name, unit, value


class RollupMetrics:
    """Collects one rollup run's metrics and writes them as EMF with :meth:`flush`.

    Not thread-safe; one per run (or reused across runs: flush empties it). ``per_user``: also
    spend per (Tenant, User) for records with a user (a custom metric per user: off unless the
    config asks)."""

    def __init__(self, *, per_user: bool = False) -> None:
        self._minutes: dict[int, _Minute] = defaultdict(_Minute)
        self._now: list[_Blob] = []
        self.per_user = per_user

    def add_records(self, records: Iterable[UsageRecord]) -> None:
        """Add applied usage records to their minute buckets: tokens and cost summed, requests
        summed over charges, refusals counted by reason."""
        for r in records:
            minute = self._minutes[r.at_ms // MINUTE_MS * MINUTE_MS]
            tenant = r.tenant or NO_VALUE
            if r.refused:
                minute.rejections[(tenant, r.outcome or NO_VALUE)] += 1
                continue
            minute.tenants[tenant].add(r)
            minute.models[(tenant, r.model or NO_VALUE)].add(r)
            minute.routes[r.route or NO_VALUE].add(r)
            if self.per_user and r.user:
                minute.users[(tenant, r.user)].add(r)

    def add_budget_used(self, tenant: str, percent: float) -> None:
        """The tenant's most used budget, in percent of its limit (the alarms' metric)."""
        self._now.append(
            _Blob(_now_ms(), ((("Tenant", tenant or NO_VALUE),),), ((*BUDGET, percent),))
        )

    def add_run(self, lag_s: float, applied: int) -> None:
        """The run's lag (age of the oldest record it applied) and how many it applied."""
        values = (lag_s, applied)
        self._now.append(
            _Blob(_now_ms(), ((),), tuple((n, u, v) for (n, u), v in zip(RUN, values, strict=True)))
        )

    def flush(self) -> None:
        """Print every collected object as one EMF JSON line, then forget them."""
        blobs = [*self._record_blobs(), *self._now]
        self._minutes.clear()
        self._now.clear()
        if is_metrics_disabled():
            return
        for blob in blobs:
            if not validate_emf_timestamp(blob.timestamp_ms):
                logger.warning(
                    "metrics outside CloudWatch's timestamp range left out",
                    extra={"bucket_ms": blob.timestamp_ms, "dimensions": blob.dimension_sets},
                )
                continue
            print(_serialize(blob))

    def _record_blobs(self) -> Iterator[_Blob]:
        for start, m in sorted(self._minutes.items()):
            for tenant, spend in m.tenants.items():
                yield _spend_blob(start, TENANT, (tenant,), spend)
            for (tenant, model), spend in m.models.items():
                yield _spend_blob(start, TENANT_MODEL, (tenant, model), spend)
            for route, spend in m.routes.items():
                yield _spend_blob(start, ROUTE, (route,), spend)
            for (tenant, user), spend in m.users.items():
                yield _spend_blob(start, TENANT_USER, (tenant, user), spend)
            for (tenant, reason), count in m.rejections.items():
                values = {"Tenant": tenant, "Reason": reason}
                sets = tuple(tuple((d, values[d]) for d in names) for names in REJECTIONS)
                yield _Blob(start, sets, (("Rejections", COUNT, count),))


def _spend_blob(
    start_ms: int,
    group: tuple[tuple[str, ...], Sequence[tuple[str, str]]],
    values: tuple[str, ...],
    spend: Totals,
) -> _Blob:
    names, metrics = group
    amounts = _values(spend)
    return _Blob(
        start_ms,
        (tuple(zip(names, values, strict=True)),),
        tuple((name, unit, amounts[name]) for name, unit in metrics),
    )


def _serialize(blob: _Blob) -> str:
    # service="" rather than None: None would let POWERTOOLS_SERVICE_NAME fill it in.
    provider = AmazonCloudWatchEMFProvider(namespace=NAMESPACE, service="")
    first, *extra = blob.dimension_sets
    for dimension, label in first:
        provider.add_dimension(dimension, label)
    for dims in extra:
        provider.add_dimensions(**dict(dims))
    assert len(blob.metrics) < MAX_METRICS, "Powertools would flush a partial object itself"
    assert sum(len(d) for d in blob.dimension_sets) <= MAX_DIMENSIONS
    for metric, unit, amount in blob.metrics:
        provider.add_metric(name=metric, unit=unit, value=amount)
    provider.set_timestamp(blob.timestamp_ms)
    emf = provider.serialize_metric_set()
    return json.dumps(emf, separators=(",", ":"))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
