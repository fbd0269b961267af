"""Threshold notifications through EventBridge (moto): a rule matching ``source: hardcap``, as
the template's, delivers the event the rollup puts to its target (an SQS queue here, an SNS
topic or a webhook in a stack); an EventBridge that cannot be reached or refuses an entry is a
notification not delivered, never an exception out of the rollup."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig
from moto import mock_aws

from hardcap_core.budgets import Budget, Dimension, Level, LevelKind, Window
from hardcap_core.rollup.eventbridge import EventBridgeNotifier, notifications_from_env
from hardcap_core.rollup.notify import DETAIL_TYPE, SOURCE, Notice

ROOT = Level(LevelKind.ORG, "acme")
DAY_MS = 86_400_000


def notice(threshold: int = 80, used: int = 1_700_000_000) -> Notice:
    budget = Budget(Level(LevelKind.TENANT, "alpha"), Dimension.COST_USD, 2 * 10**9, Window("day"))
    at_ms = 20_000 * DAY_MS + 3_600_000
    return Notice(ROOT, budget, budget.window.bounds(at_ms), threshold, used, at_ms, "alpha")


@pytest.fixture
def aws() -> Iterator[tuple[Any, Any, str]]:
    """An events client, an SQS client and the URL of a queue the hardcap rule targets."""
    with mock_aws():
        events = boto3.client("events", region_name="us-east-1")
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="notifications")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        events.put_rule(Name="hardcap", EventPattern=json.dumps({"source": [SOURCE]}))
        events.put_targets(Rule="hardcap", Targets=[{"Id": "queue", "Arn": arn}])
        yield events, sqs, url


def test_the_rule_delivers_the_event_with_its_detail(aws: tuple[Any, Any, str]) -> None:
    events, sqs, url = aws
    notifier = EventBridgeNotifier(events)
    sent = asyncio.run(notifier.send([notice(50), notice(80)]))
    assert sent == [True, True]
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    bodies = [json.loads(m["Body"]) for m in messages]
    assert {(b["source"], b["detail-type"]) for b in bodies} == {(SOURCE, DETAIL_TYPE)}
    detail = next(b["detail"] for b in bodies if b["detail"]["threshold"] == 80)
    assert detail == {
        "event_id": f"o:acme#t:alpha:usd:d#{notice().window.id}#80",
        "tenant": "alpha", "level": "tenant", "id": "alpha", "dimension": "cost_usd",
        "window": "d", "window_id": notice().window.id,
        "window_start": "2024-10-04T00:00:00.000+00:00",
        "window_end": "2024-10-05T00:00:00.000+00:00", "threshold": 80,
        "used": 1.7, "limit": 2.0, "percent": 85.0, "at": "2024-10-04T01:00:00.000+00:00",
    }  # fmt: skip


def test_more_than_ten_go_out_in_batches(aws: tuple[Any, Any, str]) -> None:
    events, sqs, url = aws
    sent = asyncio.run(EventBridgeNotifier(events).send([notice(t) for t in range(1, 24)]))
    assert sent == [True] * 23
    got: set[int] = set()
    while batch := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages"):
        got |= {json.loads(m["Body"])["detail"]["threshold"] for m in batch}
        sqs.delete_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)
        ])  # fmt: skip
    assert got == set(range(1, 24))


def test_an_unreachable_eventbridge_delivers_nothing_and_raises_nothing() -> None:
    client = boto3.client(
        "events", region_name="us-east-1", endpoint_url="http://127.0.0.1:1",
        aws_access_key_id="x", aws_secret_access_key="x",
        config=BotoConfig(retries={"max_attempts": 1}, connect_timeout=1),
    )  # fmt: skip
    assert asyncio.run(EventBridgeNotifier(client).send([notice()])) == [False]


class Refusing:
    """An events client whose PutEvents refuses the second entry (as a throttled entry)."""

    def put_events(self, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "FailedEntryCount": 1,
            "Entries": [{"EventId": "1"}, {"ErrorCode": "ThrottlingException"}],
        }


def test_a_refused_entry_is_not_delivered() -> None:
    sent = asyncio.run(EventBridgeNotifier(Refusing()).send([notice(50), notice(80)]))
    assert sent == [True, False]


def test_the_bus_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARDCAP_EVENT_BUS", raising=False)
    assert notifications_from_env() is None  # no bus: no notifications, no claims
    monkeypatch.setenv("HARDCAP_EVENT_BUS", "default")
    made = notifications_from_env()
    assert made is not None and isinstance(made.notifier, EventBridgeNotifier)
    assert made.notifier.bus == "default"


async def test_the_rollup_function_sends_what_the_ledger_crossed(
    backend: tuple[str, bool], client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rollup as the Lambda handler builds it (HARDCAP_EVENT_BUS set, as the template
    does) puts each threshold reached on the bus; its second invocation sends nothing more."""
    from hardcap_core.config import parse_config
    from hardcap_core.ledger import Admitted, Ledger, ReservationMeta
    from hardcap_core.rollup.service import RollupService
    from hardcap_core.rollup.table import UsageTable, create_table
    from tests.functional.test_rollup import PRICES
    from tests.stack import config_data

    monkeypatch.setenv("HARDCAP_EVENT_BUS", "default")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    tokens = {"dimension": "total_tokens", "limit": 1000, "window": "day"}
    config = parse_config(config_data("http://127.0.0.1:9", backend[0], **{
        "orgs.0.budgets": [], "tenants.0.budgets": [{**tokens, "notify_at": [50, 80]}],
        "gateway.redis_cluster": backend[1],
    }))  # fmt: skip
    principal = config.principal_by_id("alpha-k")
    assert principal is not None
    ledger = Ledger(client)
    for i in range(11):  # 605 of 1,000 tokens
        meta = ReservationMeta("small", "mock-small", "alpha-k", f"rq-{i}", provider="mock")
        admitted = await ledger.admit(principal.scope, input_tokens=10, output_estimate=45,
                                      prices=PRICES, meta=meta)  # fmt: skip
        assert isinstance(admitted, Admitted)
        await ledger.settle(admitted.reservation, input_tokens=10, output_tokens=45)
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        create_table(dynamodb, "usage")
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="notifications")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        events = boto3.client("events", region_name="us-east-1")
        events.put_rule(Name="hardcap", EventPattern=json.dumps({"source": [SOURCE]}))
        events.put_targets(Rule="hardcap", Targets=[{"Id": "queue", "Arn": arn}])
        service = RollupService(config, UsageTable(dynamodb, "usage"))
        try:
            first = await service.run()
            second = await service.run()
        finally:
            await service.aclose()
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    details = [json.loads(m["Body"])["detail"] for m in messages]
    assert [(d["id"], d["threshold"], d["used"]) for d in details] == [("alpha", 50, 605)]
    assert (first.notified, second.notified) == (1, 0)
