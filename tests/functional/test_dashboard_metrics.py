"""What the dashboard and the alarms read is what the code writes.

Every metric reference in the template (each dashboard SEARCH expression and metric array,
each alarm's Metrics Insights query) is parsed into (namespace, dimension names, metric name)
and must be among the metrics the EMF lines on stdout declare, when the rollup's metrics are
fed sample usage records and the gateway records a request. A renamed metric or dimension on
either side fails here rather than leaving a deployed widget empty.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from hardcap_core.gateway.metrics import record_request
from hardcap_core.rollup.metrics import NAMESPACE, RollupMetrics
from hardcap_core.rollup.records import RecordKind, UsageRecord
from tests.functional.test_infra_template import load_template

Ref = tuple[str, frozenset[str], str]  # namespace, dimension names, metric name

MINUTE = 60_000
NOW = int(time.time() * 1000)
START = NOW // MINUTE * MINUTE - 5 * MINUTE  # the bucket the sample records fall in

RECORD = UsageRecord(
    entry_id=f"{START + 1_234}-0", kind=RecordKind.SETTLE, reservation_id="r1", tenant="acme",
    org="", key_id="k1", route="chat", model="gpt-4o-mini", provider="openai", request_id="q1",
    outcome="completed", estimate=False, requests=1, input_tokens=120, output_tokens=30,
    reasoning_tokens=0, cached_input_tokens=0, cost_nusd=45_000, admitted_ms=START,
)  # fmt: skip


def refused(reason: str, tenant: str = "acme") -> UsageRecord:
    return replace(
        RECORD, kind=RecordKind.REFUSAL, outcome=reason, tenant=tenant, requests=1,
        input_tokens=0, output_tokens=0, cost_nusd=0, model="", provider="",
    )  # fmt: skip


SAMPLE = [
    RECORD,
    replace(RECORD, outcome="truncated", estimate=True, output_tokens=64, cost_nusd=70_000),
    replace(RECORD, tenant="beta", model="claude-haiku", cost_nusd=1_000_000_000),
    *(refused(r) for r in ("busy", "exceeded", "never", "rate")),
    refused("busy", tenant="beta"),
]

# The contract (docs/architecture.md and the issue): nothing more, nothing less.
CONTRACT: set[Ref] = {
    *((NAMESPACE, frozenset({"Tenant"}), m) for m in (
        "InputTokens", "OutputTokens", "Tokens", "CostUSD", "Requests", "Truncations",
        "EstimatedCharges", "BudgetUsedPercent")),
    *((NAMESPACE, frozenset({"Tenant", "Model"}), m) for m in ("Tokens", "CostUSD", "Requests")),
    *((NAMESPACE, frozenset({"Route"}), m) for m in (
        "Tokens", "CostUSD", "Requests", "Truncations")),
    (NAMESPACE, frozenset({"Reason"}), "Rejections"),
    (NAMESPACE, frozenset({"Tenant", "Reason"}), "Rejections"),
    (NAMESPACE, frozenset(), "RollupLagSeconds"),
    (NAMESPACE, frozenset(), "RecordsApplied"),
    (NAMESPACE, frozenset({"Outcome"}), "Requests"),
    (NAMESPACE, frozenset({"Outcome"}), "QueueWait"),
    (NAMESPACE, frozenset({"Upstream"}), "Requests"),
    (NAMESPACE, frozenset({"Upstream"}), "AddedLatency"),
}  # fmt: skip


# ------------------------------------------------------------------ the template's references

SEARCH = re.compile(r"SEARCH\('\{(?P<schema>[^}]*)\}\s+MetricName=\"(?P<name>[^\"]+)\"'")
INSIGHTS = re.compile(
    r"SELECT \w+\((?P<name>\w+)\) FROM SCHEMA\((?P<schema>[^)]*)\)", re.IGNORECASE
)


def _schema(text: str) -> tuple[str, frozenset[str]]:
    namespace, *dims = (part.strip().strip('"') for part in text.split(","))
    return namespace, frozenset(dims)


# What the dashboard's !Sub may name: the region, and the gateway's log group (a log widget).
SUBSTITUTIONS = {"${AWS::Region}": "us-east-1", "${GatewayLogGroup}": "/aws/lambda/hc-gateway"}


def dashboard_widgets() -> list[dict[str, Any]]:
    """The dashboard's widgets, with the template's substitutions made."""
    body = load_template()["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    for name, value in SUBSTITUTIONS.items():
        body = body.replace(name, value)
    assert "${" not in body, "an unresolved substitution"
    widgets: list[dict[str, Any]] = json.loads(body)["widgets"]
    return widgets


def dashboard_refs() -> Iterator[Ref]:
    """Every metric the dashboard plots, from its SEARCH expressions and metric arrays."""
    for widget in dashboard_widgets():
        if widget["type"] != "metric":  # a log widget's query: tests/functional/test_user_metrics
            continue
        for row in widget["properties"]["metrics"]:
            if isinstance(row[0], dict):  # [{"expression": "SEARCH(...)"}]
                match = SEARCH.match(row[0]["expression"])
                assert match, f"not a SEARCH the test can read: {row[0]['expression']}"
                namespace, dims = _schema(match["schema"])
                yield namespace, dims, match["name"]
            else:  # ["Namespace", "Metric", "Dim1", "Value1", ..., {options}]
                plain = [x for x in row if isinstance(x, str)]
                yield plain[0], frozenset(plain[2::2]), plain[1]


def alarm_refs() -> Iterator[Ref]:
    for resource in load_template()["Resources"].values():
        if resource["Type"] == "AWS::CloudWatch::Alarm":
            for query in resource["Properties"]["Metrics"]:
                match = INSIGHTS.search(query["Expression"])
                assert match, query["Expression"]
                namespace, dims = _schema(match["schema"])
                yield namespace, dims, match["name"]


# ------------------------------------------------------------------ what the code writes


def emf_blobs(out: str) -> list[dict[str, Any]]:
    """The EMF objects among stdout's lines (log lines are not EMF)."""
    blobs = [json.loads(line) for line in out.splitlines() if line.startswith('{"_aws"')]
    assert blobs, "no EMF line on stdout"
    return blobs


def declared(blob: dict[str, Any]) -> Iterator[Ref]:
    for directive in blob["_aws"]["CloudWatchMetrics"]:
        for dims in directive["Dimensions"]:
            for metric in directive["Metrics"]:
                yield directive["Namespace"], frozenset(dims), metric["Name"]


def emit_everything() -> None:
    metrics = RollupMetrics()
    metrics.add_records(SAMPLE)
    metrics.add_budget_used("acme", 82.5)
    metrics.add_run(lag_s=4.2, applied=len(SAMPLE))
    metrics.flush()
    record_request(outcome="completed", upstream="openai", added_latency_ms=3.25)


@pytest.fixture
def emitted(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    emit_everything()
    return emf_blobs(capsys.readouterr().out)


def test_every_dashboard_and_alarm_reference_is_emitted(emitted: list[dict[str, Any]]) -> None:
    refs = [*dashboard_refs(), *alarm_refs()]
    assert len(refs) >= 9  # spend, budget, tokens, rejections, truncations, latency x2, ...
    available = {ref for blob in emitted for ref in declared(blob)}
    missing = [ref for ref in refs if ref not in available]
    assert not missing, f"the template reads metrics nothing emits: {missing}"


def test_emitted_metrics_are_exactly_the_contract(emitted: list[dict[str, Any]]) -> None:
    assert {ref for blob in emitted for ref in declared(blob)} == CONTRACT


def test_no_service_dimension_even_when_powertools_is_told_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "hardcap")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "Elsewhere")
    emit_everything()
    blobs = emf_blobs(capsys.readouterr().out)
    for blob in blobs:
        assert "service" not in blob
        for namespace, dims, _ in declared(blob):
            assert namespace == NAMESPACE
            assert "service" not in dims
    assert {ref for blob in blobs for ref in declared(blob)} == CONTRACT


def test_every_object_respects_emf_limits_and_carries_its_dimensions(
    emitted: list[dict[str, Any]],
) -> None:
    for blob in emitted:
        for directive in blob["_aws"]["CloudWatchMetrics"]:
            assert len(directive["Metrics"]) <= 100
            for dims in directive["Dimensions"]:
                assert len(dims) <= 30
                assert all(isinstance(blob[d], str) and blob[d] for d in dims)
            for metric in directive["Metrics"]:
                value = blob[metric["Name"]]
                assert len(value) <= 100 if isinstance(value, list) else float(value) >= 0


def values(blobs: list[dict[str, Any]], dims: dict[str, str], name: str) -> list[float]:
    """The values of one metric for one exact set of dimension values."""
    found = []
    for blob in blobs:
        for namespace, names, metric in declared(blob):
            wanted = (namespace, names, metric) == (NAMESPACE, frozenset(dims), name)
            if wanted and all(blob[k] == v for k, v in dims.items()):
                value = blob[name]
                found += value if isinstance(value, list) else [value]
    return found


def test_record_metrics_add_up(emitted: list[dict[str, Any]]) -> None:
    acme = {"Tenant": "acme"}
    assert values(emitted, acme, "InputTokens") == [240]
    assert values(emitted, acme, "OutputTokens") == [94]
    assert values(emitted, acme, "Tokens") == [334]
    assert values(emitted, acme, "CostUSD") == [pytest.approx(115_000 / 1e9)]
    assert values(emitted, acme, "Requests") == [2]  # the refusals are not requests served
    assert values(emitted, acme, "Truncations") == [1]
    assert values(emitted, acme, "EstimatedCharges") == [1]
    assert values(emitted, {"Tenant": "beta"}, "CostUSD") == [1.0]
    assert values(emitted, {"Tenant": "beta", "Model": "claude-haiku"}, "Tokens") == [150]
    assert values(emitted, {"Tenant": "acme", "Model": "gpt-4o-mini"}, "Requests") == [2]
    assert values(emitted, {"Route": "chat"}, "Requests") == [3]
    assert values(emitted, {"Route": "chat"}, "Truncations") == [1]
    assert sum(values(emitted, {"Reason": "busy"}, "Rejections")) == 2  # acme and beta
    assert values(emitted, {"Tenant": "beta", "Reason": "busy"}, "Rejections") == [1]
    for reason in ("exceeded", "never", "rate"):
        assert values(emitted, {"Tenant": "acme", "Reason": reason}, "Rejections") == [1]
    assert values(emitted, acme, "BudgetUsedPercent") == [82.5]
    assert values(emitted, {}, "RollupLagSeconds") == [4.2]
    assert values(emitted, {"Upstream": "openai"}, "AddedLatency") == [3.25]
    assert values(emitted, {"Outcome": "completed"}, "Requests") == [1]


def test_records_are_timestamped_by_their_minute(capsys: pytest.CaptureFixture[str]) -> None:
    metrics = RollupMetrics()
    later = replace(RECORD, entry_id=f"{START + MINUTE + 59_999}-3")
    metrics.add_records([RECORD, later])
    before = int(time.time() * 1000)
    metrics.add_run(lag_s=1.0, applied=2)
    metrics.flush()
    blobs = emf_blobs(capsys.readouterr().out)
    by_minute = {b["_aws"]["Timestamp"]: b for b in blobs if b.get("Tenant") == "acme"}
    assert sorted(by_minute) == [START, START + MINUTE]
    assert all(b["Tokens"] == [150] for b in by_minute.values())
    (run,) = [b for b in blobs if "RollupLagSeconds" in b]
    assert before <= run["_aws"]["Timestamp"] <= int(time.time() * 1000)


def test_flush_empties_and_out_of_range_minutes_are_left_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    metrics = RollupMetrics()
    stale = replace(RECORD, entry_id=f"{NOW - 15 * 86_400_000}-0")  # CloudWatch drops these
    metrics.add_records([stale, replace(RECORD, model="")])
    metrics.flush()
    blobs = emf_blobs(capsys.readouterr().out)
    assert {b["_aws"]["Timestamp"] for b in blobs} == {START}
    assert [b["Model"] for b in blobs if "Model" in b] == ["none"]  # counted, not dropped
    metrics.flush()
    assert '"_aws"' not in capsys.readouterr().out


def test_gateway_writes_one_line_per_request(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    record_request(outcome="truncated", upstream="", added_latency_ms=0.5)
    (line,) = capsys.readouterr().out.splitlines()
    blob = json.loads(line)
    assert (blob["Outcome"], blob["Upstream"], blob["Requests"]) == ("truncated", "none", 1)
    with pytest.raises(ValueError, match="finite"):
        record_request(outcome="completed", upstream="openai", added_latency_ms=float("nan"))
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    record_request(outcome="completed", upstream="openai", added_latency_ms=1.0)
    assert capsys.readouterr().out == ""


def test_the_metrics_line_is_also_the_requests_log_line(capsys: pytest.CaptureFixture[str]) -> None:
    """One write per request: the log fields ride in the EMF line, which Logs Insights reads
    as JSON, and they neither add a metric nor change one."""
    context = {"route": "small", "request_id": "r-1", "tenant": "acme", "output_tokens": 7}
    record_request(outcome="completed", upstream="openai", added_latency_ms=1.5, context=context)
    (line,) = capsys.readouterr().out.splitlines()
    blob = json.loads(line)
    assert {k: blob[k] for k in context} == context
    assert (blob["level"], blob["message"]) == ("INFO", "request settled")
    assert set(declared(blob)) == {
        ("Hardcap", frozenset({"Outcome"}), "Requests"),
        ("Hardcap", frozenset({"Outcome"}), "QueueWait"),
        ("Hardcap", frozenset({"Upstream"}), "Requests"),
        ("Hardcap", frozenset({"Upstream"}), "AddedLatency"),
    }
    assert (blob["Outcome"], blob["AddedLatency"], blob["QueueWait"]) == ("completed", 1.5, 0.0)
