"""The template's live configuration and admin function: who may read and write the config
table, built from the roles' own statements under every network and cache shape; the table
kept like the usage table; the admin function built and wired like the rollup's.

A tenant key reaches the gateway only, and the gateway's role may read the configuration but
never change it: a bug in the request path cannot rewrite keys or budgets.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.functional.test_infra_template import MAKEFILE, function_env, load_template
from tests.functional.test_infra_topology import TOPOLOGIES, Render, render

TEMPLATE = load_template()
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
CONFIG_TABLE = {"Fn::GetAtt": ["ConfigTable", "Arn"]}
USAGE_TABLE = {"Fn::GetAtt": ["UsageTable", "Arn"]}
READS = {"dynamodb:GetItem", "dynamodb:Query", "dynamodb:Scan"}
# TransactWriteItems is authorized per item it holds: these four, no action of its own.
ADMIN_WRITES = {
    "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem",
    "dynamodb:ConditionCheckItem",
}  # fmt: skip
ROLES = sorted(name for name, res in RESOURCES.items() if res["Type"] == "AWS::IAM::Role")


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def policy(r: Render, role: str) -> list[dict[str, Any]]:
    """The role's effective statements under the rendered parameters (every Fn::If taken)."""
    found = []
    for document in r.resources[role]["Properties"]["Policies"]:
        for statement in document["PolicyDocument"]["Statement"]:
            assert set(statement) <= {"Effect", "Action", "Resource", "Condition"}, statement
            assert statement["Effect"] == "Allow"  # no NotAction / NotResource / Deny tricks
            found.append(statement)
    return found


def grants(r: Render, role: str, table: dict[str, Any]) -> set[str]:
    """Every action the role is allowed on ``table``, by a statement naming it or a wildcard."""
    allowed: set[str] = set()
    for statement in policy(r, role):
        actions = set(as_list(statement["Action"]))
        assert not {a for a in actions if "*" in a}, f"{role}: wildcard action {actions}"
        resources = as_list(statement["Resource"])
        dynamodb = {a for a in actions if a.startswith("dynamodb:")}
        if dynamodb:
            # Tables are named by their own ARN, never by a pattern that could cover another.
            assert all(r in (CONFIG_TABLE, USAGE_TABLE) for r in resources), statement
        if table in resources:
            allowed |= dynamodb
    return allowed


SHAPES = [
    {"Egress": egress, "ExistingRedisUrl": cache, "SsmParameterPath": ssm, "BedrockModelArns": b}
    for egress in TOPOLOGIES
    for cache in ("", "rediss://cache.example:6379")
    for ssm, b in (("", []), ("/hardcap/", ["arn:aws:bedrock:us-east-1::foundation-model/x"]))
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(str(v) or "0" for v in s.values()))
def test_only_the_admin_function_may_write_the_config_table(shape: dict[str, Any]) -> None:
    """The gateway and the rollup read the live configuration (a few hundred items at a cold
    start and on a version change); the admin function reads and writes it; no other role
    touches it. The usage table stays as it was for the gateway and the rollup, and the admin
    may only read it (usage, keys' last-used times)."""
    r = render(**shape)
    assert grants(r, "GatewayRole", CONFIG_TABLE) == READS
    assert grants(r, "RollupRole", CONFIG_TABLE) == READS
    assert grants(r, "AdminRole", CONFIG_TABLE) == READS | ADMIN_WRITES
    # Every other role this render creates (a conditional one, such as the notification
    # webhook's, only with its parameter set) has nothing on the config table.
    for role in set(ROLES) - {"GatewayRole", "RollupRole", "AdminRole"}:
        if role in r.resources:
            assert not grants(r, role, CONFIG_TABLE), role
    assert grants(r, "AdminRole", USAGE_TABLE) == {"dynamodb:GetItem", "dynamodb:Query"}
    # The admin role names no other table, and no statement of it is conditional.
    for statement in policy(r, "AdminRole"):
        if any(a.startswith("dynamodb:") for a in as_list(statement["Action"])):
            assert statement["Resource"] in (CONFIG_TABLE, USAGE_TABLE)
            assert "Condition" not in statement


def test_the_gateway_role_reads_the_whole_config_table_unconditioned() -> None:
    """It loads every item (no LeadingKeys condition could list them all), by Query and Scan,
    and looks a key up by its hash with GetItem; the statement says nothing else."""
    (statement,) = [
        s
        for document in RESOURCES["GatewayRole"]["Properties"]["Policies"]
        if "PolicyDocument" in document
        for s in document["PolicyDocument"]["Statement"]
        if s.get("Resource") == CONFIG_TABLE
    ]
    assert statement == {"Effect": "Allow", "Action": sorted(READS), "Resource": CONFIG_TABLE}


def test_config_table_is_the_one_the_code_creates() -> None:
    """Tests build their moto table from store.py's constants; the stack from the template."""
    from hardcap_core.control import store

    props = RESOURCES["ConfigTable"]["Properties"]
    assert props["KeySchema"] == store.KEY_SCHEMA
    assert props["AttributeDefinitions"] == store.ATTRIBUTE_DEFINITIONS
    # Temporary budgets expire: DynamoDB deletes them some time after expires_at.
    assert props["TimeToLiveSpecification"] == {
        "AttributeName": store.TTL_ATTRIBUTE,
        "Enabled": True,
    }
    assert function_env(TEMPLATE, "AdminFunction")[store.CONFIG_TABLE] == {"Ref": "ConfigTable"}


def test_config_table_is_kept_like_the_usage_table() -> None:
    """pk/sk strings, on demand, point-in-time recovery, the AWS managed key, retained on delete
    and on replacement, no fixed name (a retained table under one would block a redeploy)."""
    table = RESOURCES["ConfigTable"]
    usage = RESOURCES["UsageTable"]
    assert table["Type"] == "AWS::DynamoDB::Table"
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"
    props = table["Properties"]
    assert props["KeySchema"] == [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ]
    assert props["AttributeDefinitions"] == [
        {"AttributeName": "pk", "AttributeType": "S"},
        {"AttributeName": "sk", "AttributeType": "S"},
    ]
    for same in ("KeySchema", "AttributeDefinitions", "BillingMode",
                 "PointInTimeRecoverySpecification", "SSESpecification"):  # fmt: skip
        assert props[same] == usage["Properties"][same], same
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert "TableName" not in props
    assert "Condition" not in table  # every shape has one: the gateways read it


@pytest.mark.parametrize("logical_id", ["GatewayFunction", "RollupFunction", "AdminFunction"])
def test_functions_are_given_the_config_table(logical_id: str) -> None:
    variables = function_env(TEMPLATE, logical_id)
    assert variables["HARDCAP_CONFIG_TABLE"] == {"Ref": "ConfigTable"}
    assert variables["HARDCAP_USAGE_TABLE"] == {"Ref": "UsageTable"}


def test_the_admin_function_is_built_and_run_like_the_rollup() -> None:
    """A plain Python handler (functions/admin/app.handler) from the same Makefile recipe, its
    own role and log group; no adapter, no alias, no SnapStart, no schedule."""
    admin = RESOURCES["AdminFunction"]
    rollup = RESOURCES["RollupFunction"]
    assert admin["Type"] == "AWS::Serverless::Function"
    assert admin["Metadata"] == rollup["Metadata"]
    assert admin["Metadata"]["BuildMethod"] == "makefile"
    props = admin["Properties"]
    assert props["CodeUri"] == "../functions/admin"
    assert props["Handler"] == "app.handler"
    assert props["Role"] == {"Fn::GetAtt": ["AdminRole", "Arn"]}
    assert props["LoggingConfig"] == {"LogGroup": {"Ref": "AdminLogGroup"}}
    for absent in ("Layers", "AutoPublishAlias", "SnapStart", "Events", "FunctionUrlConfig",
                   "VpcConfig", "Environment"):  # fmt: skip
        assert absent not in props, absent
    assert props["Timeout"] <= 900  # a function URL's limit
    log_group = RESOURCES["AdminLogGroup"]["Properties"]
    assert log_group["LogGroupName"] == {"Fn::Sub": "/aws/lambda/${AWS::StackName}-admin"}
    assert log_group["RetentionInDays"] == {"Ref": "LogRetentionDays"}
    logs = [s for s in policy(render(), "AdminRole") if "logs:PutLogEvents" in as_list(s["Action"])]
    assert [s["Resource"] for s in logs] == [{"Fn::GetAtt": ["AdminLogGroup", "Arn"]}]
    text = MAKEFILE.read_text()
    assert "build-AdminFunction: HANDLER_FILES := functions/admin/app.py" in text


def test_no_role_but_the_gateways_reads_secrets_or_calls_bedrock() -> None:
    """The admin function validates configuration; it never calls an upstream."""
    text = str(RESOURCES["AdminRole"]["Properties"]).lower()
    for service in ("secretsmanager:", "ssm:", "bedrock:"):
        assert service not in text, service


def test_outputs_give_the_admin_url_and_the_table() -> None:
    outputs = TEMPLATE["Outputs"]
    assert list(outputs)[:2] == ["GatewayUrl", "OpenAIBaseUrl"]
    assert outputs["AdminUrl"]["Value"] == {"Fn::GetAtt": ["AdminFunctionUrl", "FunctionUrl"]}
    assert "Condition" not in outputs["AdminUrl"]
    assert outputs["AdminFunctionArn"]["Value"] == {"Fn::GetAtt": ["AdminFunction", "Arn"]}
    assert outputs["ConfigTableName"]["Value"] == {"Ref": "ConfigTable"}
