"""The template's budget threshold events: the rollup may put events on the default bus and is
told to; a rule matches them and sends them to the SNS topic and the webhook the parameters
name (an API destination with its connection and a role EventBridge assumes); every Egress
reaches EventBridge, and Egress=none pays for an endpoint only when a target wants the events.
Rendered as CloudFormation resolves it (tests/functional/test_infra_topology.py)."""

from __future__ import annotations

from typing import Any

import pytest

from hardcap_core.rollup.eventbridge import EVENT_BUS_ENV
from hardcap_core.rollup.notify import DETAIL_TYPE, SOURCE
from tests.functional.test_infra_topology import (
    PSEUDO,
    TEMPLATE,
    TOPOLOGIES,
    Render,
    created,
    render,
    sam_generated,
)

TOPIC = "arn:aws:sns:us-east-1:123456789012:budget-events"
HOOK = "https://hooks.example.com/hardcap"
DEFAULT_BUS = {
    "Fn::Sub": "arn:${AWS::Partition}:events:${AWS::Region}:${AWS::AccountId}:event-bus/default"
}


def rollup_env(r: Render) -> dict[str, Any]:
    env: dict[str, Any] = r.globals["Function"]["Environment"]["Variables"]
    own = r.resources["RollupFunction"]["Properties"]["Environment"]["Variables"]
    return {**env, **own}


def test_the_rollup_puts_events_on_the_default_bus_only() -> None:
    r = render()
    (policy,) = [p for p in r.resources["RollupRole"]["Properties"]["Policies"]
                 if p["PolicyName"] == "threshold-events"]  # fmt: skip
    (statement,) = policy["PolicyDocument"]["Statement"]
    assert (statement["Action"], statement["Resource"]) == ("events:PutEvents", DEFAULT_BUS)
    assert rollup_env(r)[EVENT_BUS_ENV] == "default"
    rule = r.resources["NotificationRule"]["Properties"]
    assert rule["EventBusName"] == "default"
    assert rule["EventPattern"] == {"source": [SOURCE], "detail-type": [DETAIL_TYPE]}
    assert rule["Targets"] == []  # no target named: the rule matches, and sends nowhere
    for role in ("GatewayRole", "AdminRole"):  # no one else sends
        assert "threshold-events" not in str(r.resources[role])


def test_a_topic_is_a_target() -> None:
    r = render(NotificationTopicArn=TOPIC)
    assert r.resources["NotificationRule"]["Properties"]["Targets"] == [
        {"Id": "topic", "Arn": {"Ref": "NotificationTopicArn"}}
    ]
    assert not created(r, "AWS::Events::ApiDestination", "AWS::Events::Connection")


def test_a_webhook_is_an_api_destination_posting_the_detail() -> None:
    r = render(NotificationWebhookUrl=HOOK, NotificationTopicArn=TOPIC)
    topic, hook = r.resources["NotificationRule"]["Properties"]["Targets"]
    assert topic["Arn"] == {"Ref": "NotificationTopicArn"}
    assert hook == {
        "Id": "webhook", "Arn": {"Fn::GetAtt": ["NotificationWebhook", "Arn"]},
        "RoleArn": {"Fn::GetAtt": ["NotificationWebhookRole", "Arn"]}, "InputPath": "$.detail",
    }  # fmt: skip
    destination = r.resources["NotificationWebhook"]["Properties"]
    assert destination["InvocationEndpoint"] == {"Ref": "NotificationWebhookUrl"}
    assert destination["HttpMethod"] == "POST"
    auth = r.resources["NotificationConnection"]["Properties"]["AuthParameters"]
    # No secret given: the stack's name, so the header is never empty.
    assert auth["ApiKeyAuthParameters"]["ApiKeyValue"] == {"Ref": "AWS::StackName"}
    with_secret = render(NotificationWebhookUrl=HOOK, NotificationWebhookSecret="s3cret-value")
    auth = with_secret.resources["NotificationConnection"]["Properties"]["AuthParameters"]
    assert auth["ApiKeyAuthParameters"]["ApiKeyValue"] == {"Ref": "NotificationWebhookSecret"}
    assert TEMPLATE["Parameters"]["NotificationWebhookSecret"]["NoEcho"] is True
    role = r.resources["NotificationWebhookRole"]["Properties"]
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "events.amazonaws.com"}
    (invoke,) = role["Policies"][0]["PolicyDocument"]["Statement"]
    assert invoke["Action"] == "events:InvokeApiDestination"
    assert invoke["Resource"] == {"Fn::GetAtt": ["NotificationWebhook", "Arn"]}


@pytest.mark.parametrize("egress", TOPOLOGIES)
@pytest.mark.parametrize("target", ["", "topic", "webhook"])
def test_every_egress_reaches_eventbridge_or_sends_nothing(egress: str, target: str) -> None:
    params = {"topic": {"NotificationTopicArn": TOPIC}, "webhook": {"NotificationWebhookUrl": HOOK}}
    r = render(Egress=egress, **params.get(target, {}))
    known = set(r.resources) | sam_generated() | set(TEMPLATE["Parameters"]) | PSEUDO
    for name in ("NotificationRule", "NotificationConnection", "NotificationWebhook",
                 "NotificationWebhookRole", "EventsEndpoint", "RollupFunction"):  # fmt: skip
        if name in r.resources:
            assert not r.references(r.resources[name]) - known, name
    env = rollup_env(r)
    endpoint = r.resources.get("EventsEndpoint")
    if egress == "none" and not target:
        # No internet and no one to tell: no $0.02 an hour endpoint, and no events tried.
        assert endpoint is None and EVENT_BUS_ENV not in env
        return
    assert env[EVENT_BUS_ENV] == "default"
    if egress == "none":
        props = endpoint["Properties"] if endpoint else {}
        assert props["ServiceName"] == {"Fn::Sub": "com.amazonaws.${AWS::Region}.events"}
        assert props["PrivateDnsEnabled"] is True  # the SDK's default name resolves to it
    else:
        assert endpoint is None
    if egress == "ipv6":  # the dual-stack name, over the egress-only gateway
        assert env["AWS_ENDPOINT_URL_EVENTBRIDGE"] == {
            "Fn::Sub": "https://events.${AWS::Region}.api.aws"
        }
    else:
        assert "AWS_ENDPOINT_URL_EVENTBRIDGE" not in env
