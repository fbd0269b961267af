"""The SAM template's durable ledger, rollup schedule, permissions and alarms agree with the code.

The table is declared with the key schema the code creates in moto, the schedule delivers the
sample event the handler is tested with, each role reaches only what its function does, and a
created VPC reaches DynamoDB without its NAT.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.functional.test_infra_template import MAKEFILE, ROOT, function_env, load_template

TEMPLATE = load_template()
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
TABLE_ARN = {"Fn::GetAtt": ["UsageTable", "Arn"]}


def statements(role: str) -> list[dict[str, Any]]:
    """Every unconditional statement of a role's unconditional inline policies (a policy in an
    Fn::If, such as the VPC-only network interface one, is left out)."""
    policies = RESOURCES[role]["Properties"]["Policies"]
    return [
        s
        for p in policies
        if "PolicyDocument" in p
        for s in p["PolicyDocument"]["Statement"]
        if "Effect" in s
    ]


def actions(statement: dict[str, Any]) -> set[str]:
    found = statement["Action"]
    return {found} if isinstance(found, str) else set(found)


def dynamodb_statements(role: str) -> list[dict[str, Any]]:
    """Its DynamoDB statements but those on the config table (tests/functional/test_infra_admin.py
    checks them)."""
    return [
        s
        for s in statements(role)
        if any(a.startswith("dynamodb:") for a in actions(s))
        and s["Resource"] != {"Fn::GetAtt": ["ConfigTable", "Arn"]}
    ]


def test_table_is_the_one_the_code_creates() -> None:
    """Tests build their moto table from table.py's constants; the stack from the template."""
    from hardcap_core.rollup import table

    table_res = RESOURCES["UsageTable"]
    props = table_res["Properties"]
    assert props["KeySchema"] == table.KEY_SCHEMA
    assert props["AttributeDefinitions"] == table.ATTRIBUTE_DEFINITIONS
    assert props["TimeToLiveSpecification"] == {
        "AttributeName": table.TTL_ATTRIBUTE,
        "Enabled": True,
    }
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["SSESpecification"] == {"SSEEnabled": True}
    # The durable ledger survives the stack and a replacement of the table.
    assert table_res["DeletionPolicy"] == table_res["UpdateReplacePolicy"] == "Retain"
    assert "TableName" not in props, "a retained table with a fixed name blocks a redeploy"


@pytest.mark.parametrize("logical_id", ["GatewayFunction", "RollupFunction"])
def test_functions_are_given_the_table(logical_id: str) -> None:
    from hardcap_core import env

    variables = function_env(TEMPLATE, logical_id)
    assert variables[env.USAGE_TABLE] == {"Ref": "UsageTable"}


def test_schedule_runs_the_rollup_without_retries() -> None:
    """A run that is late or failed is replaced by the next one, never retried after it."""
    props = RESOURCES["RollupFunction"]["Properties"]
    assert props["Handler"] == "app.handler"
    assert props["CodeUri"] == "../functions/rollup"
    assert 256 <= props["MemorySize"] <= 512
    (event,) = props["Events"].values()
    assert event["Type"] == "ScheduleV2"
    schedule = event["Properties"]
    assert schedule["ScheduleExpression"] == {"Ref": "RollupSchedule"}
    assert TEMPLATE["Parameters"]["RollupSchedule"]["Default"] == "rate(1 minute)"
    assert schedule["RetryPolicy"]["MaximumRetryAttempts"] == 0
    assert schedule["RetryPolicy"]["MaximumEventAgeInSeconds"] <= 60
    assert props["EventInvokeConfig"]["MaximumRetryAttempts"] == 0  # Lambda's async retries
    # A run ends before the next one is due at the default rate.
    assert props["Timeout"] < 60


def test_an_invocation_rolls_up_every_few_seconds_for_most_of_its_minute() -> None:
    """What a lost cache forgets is what arrived since the last pass: passes every few
    seconds until shortly before the timeout, which leaves the slowest pass its budget."""
    from hardcap_core.rollup import run

    timeout = RESOURCES["RollupFunction"]["Properties"]["Timeout"]
    assert run.INTERVAL_S <= 10
    assert timeout - run.RESERVE_S >= 50  # the last pass starts at least 50 s in
    assert 60 - (timeout - run.RESERVE_S) + run.INTERVAL_S <= 15  # the longest gap, in s


def test_sample_event_is_what_the_schedule_sends() -> None:
    """events/scheduler-rollup.json is the schedule's Input with Scheduler's placeholders
    filled in (docs.aws.amazon.com/scheduler: managing-schedule-context-attributes)."""
    (event,) = RESOURCES["RollupFunction"]["Properties"]["Events"].values()
    template_input = json.loads(event["Properties"]["Input"])
    sample = json.loads((ROOT / "events" / "scheduler-rollup.json").read_text())
    assert sample.keys() == template_input.keys()
    placeholder = re.compile(r"<aws\.scheduler\.[a-z-]+>")
    for name, value in template_input.items():
        if placeholder.fullmatch(value):
            assert not placeholder.search(sample[name]), name
        else:
            assert sample[name] == value, name
    assert sample["schedule_arn"].startswith("arn:aws:scheduler:")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", sample["scheduled_time"])


def test_rollup_role_reaches_the_table_only() -> None:
    (table_access,) = dynamodb_statements("RollupRole")
    # TransactWriteItems is authorized per item: Put, Update, Delete and ConditionCheck.
    assert actions(table_access) == {
        "dynamodb:Query", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem",
        "dynamodb:DeleteItem", "dynamodb:ConditionCheckItem",
    }  # fmt: skip
    assert table_access["Resource"] == TABLE_ARN
    logs = [s for s in statements("RollupRole") if "logs:PutLogEvents" in actions(s)]
    assert [s["Resource"] for s in logs] == [{"Fn::GetAtt": ["RollupLogGroup", "Arn"]}]
    props = RESOURCES["RollupFunction"]["Properties"]
    assert props["LoggingConfig"] == {"LogGroup": {"Ref": "RollupLogGroup"}}
    assert props["Role"] == {"Fn::GetAtt": ["RollupRole", "Arn"]}


def test_gateway_reaches_its_own_partitions_only() -> None:
    """It keeps settles the cache missed and restores lost counters (the restore epoch, usage
    rows, the stream cursor, the kept settles, charged then deleted); the rollup alone writes
    usage and cursors. Each action is the one hardcap_core/rollup/table.py calls for that
    partition."""
    granted: dict[str, set[str]] = {}
    for statement in dynamodb_statements("GatewayRole"):
        assert statement["Resource"] == TABLE_ARN
        condition = statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
        for action in actions(statement):
            granted[action] = set(condition)
    assert granted == {
        "dynamodb:PutItem": {"pending#*"},
        "dynamodb:DeleteItem": {"pending#*"},
        "dynamodb:Query": {"usage#*", "pending#*"},
        "dynamodb:GetItem": {"cursor#*"},
        "dynamodb:UpdateItem": {"epoch#*"},
    }


def test_rollup_reaches_dynamodb_without_the_nat() -> None:
    """The functions' subnets route DynamoDB through the gateway endpoint of a created VPC."""
    # In a VPC, that is (Egress=no-vpc: none, and DynamoDB's public endpoint).
    in_vpc, vpc_config, no_vpc = TEMPLATE["Globals"]["Function"]["VpcConfig"]["Fn::If"]
    assert in_vpc == "UseVpc" and no_vpc == {"Ref": "AWS::NoValue"}
    subnets = vpc_config["SubnetIds"]["Fn::If"]
    assert subnets[0] == "CreateVpc"
    private = {ref["Ref"] for ref in subnets[1]}
    route_tables = {
        r["Properties"]["RouteTableId"]["Ref"]
        for r in RESOURCES.values()
        if r["Type"] == "AWS::EC2::SubnetRouteTableAssociation"
        and r["Properties"]["SubnetId"]["Ref"] in private
    }
    endpoint = RESOURCES["DynamoDbEndpoint"]["Properties"]
    assert endpoint["VpcEndpointType"] == "Gateway"
    assert endpoint["ServiceName"] == {"Fn::Sub": "com.amazonaws.${AWS::Region}.dynamodb"}
    assert {ref["Ref"] for ref in endpoint["RouteTableIds"]} == route_tables
    assert "VpcConfig" not in RESOURCES["RollupFunction"]["Properties"]  # the Globals' one


def test_budget_alarms_watch_every_tenant() -> None:
    alarms = [r["Properties"] for r in RESOURCES.values() if r["Type"] == "AWS::CloudWatch::Alarm"]
    assert sorted(a["Threshold"] for a in alarms) == [80, 100]
    for alarm in alarms:
        (query,) = alarm["Metrics"]
        assert query["ReturnData"] is True and query["Period"] >= 60
        assert re.fullmatch(
            r'SELECT MAX\(BudgetUsedPercent\) FROM SCHEMA\("Hardcap", Tenant\) '
            r"GROUP BY Tenant ORDER BY MAX\(\) DESC",
            query["Expression"],
        )
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["TreatMissingData"] == "notBreaching"
        assert alarm["AlarmActions"] == {
            "Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]
        }
    assert TEMPLATE["Parameters"]["AlarmTopicArn"]["Default"] == ""


def test_outputs_name_the_dashboard_and_the_table() -> None:
    outputs = TEMPLATE["Outputs"]
    assert outputs["UsageTableName"]["Value"] == {"Ref": "UsageTable"}
    url = outputs["DashboardUrl"]["Value"]["Fn::Sub"]
    assert url.startswith("https://") and "#dashboards:name=${Dashboard}" in url


def test_every_artifact_shares_one_recipe() -> None:
    """One rule builds every function: only the handler files at the root differ."""
    text = MAKEFILE.read_text()
    rules = re.findall(r"^(build-[A-Za-z]+(?: build-[A-Za-z]+)*):\s*$", text, re.MULTILINE)
    assert rules == ["build-GatewayFunction build-RollupFunction build-AdminFunction"]
    handlers = dict(re.findall(r"^(build-\w+): HANDLER_FILES := (.+)$", text, re.MULTILINE))
    assert handlers == {
        "build-GatewayFunction": "functions/gateway/run.sh functions/gateway/buffered.py",
        "build-RollupFunction": "functions/rollup/app.py",
        "build-AdminFunction": "functions/admin/app.py",
    }
    functions = {n for n, r in RESOURCES.items() if r["Type"] == "AWS::Serverless::Function"}
    assert {rule.removeprefix("build-") for rule in handlers} == functions
