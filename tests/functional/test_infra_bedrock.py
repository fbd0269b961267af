"""The template's Bedrock access: the gateway may invoke only the models BedrockModelArns names,
none when it is empty, and a created VPC reaches Bedrock through an endpoint, not the NAT.

The template lints clean both ways: ``sam validate --lint`` runs on it as shipped (parameter
empty) and on a copy whose parameter defaults to a foundation model and an inference profile.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.functional.test_infra_template import (
    ROOT,
    TEMPLATE,
    load_template,
    sam_cli,
    sam_env,
)

ARNS = [
    "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-sonnet-4-20250514-v1:0",
    "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-sonnet-4-20250514-v1:0",
]
INVOKE = {"bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream"}


def _actions(node: Any) -> list[str]:
    """Every IAM action named anywhere under ``node`` (statements inside an Fn::If too)."""
    if isinstance(node, dict):
        found = [a for k, v in node.items() if k == "Action" for a in _list(v)]
        return found + [a for k, v in node.items() if k != "Action" for a in _actions(v)]
    if isinstance(node, list):
        return [a for item in node for a in _actions(item)]
    return []


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _bedrock_statement(template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(its condition, the statement) of the one gateway statement granting a bedrock action:
    an Fn::If that is no statement at all when the condition is false."""
    policies = template["Resources"]["GatewayRole"]["Properties"]["Policies"]
    # A policy in an Fn::If (the VPC-only one) counts by its policy branch.
    documents = [p["Fn::If"][1] if "Fn::If" in p else p for p in policies]
    statements = [s for p in documents for s in p["PolicyDocument"]["Statement"]]
    bedrock = [s for s in statements if any(a.startswith("bedrock:") for a in _actions(s))]
    assert len(bedrock) == 1
    condition, granted, otherwise = bedrock[0]["Fn::If"]
    assert otherwise == {"Ref": "AWS::NoValue"}
    return condition, granted


def test_the_parameter_is_a_list_that_defaults_to_no_models() -> None:
    parameter = load_template()["Parameters"]["BedrockModelArns"]
    assert parameter["Type"] == "CommaDelimitedList"
    assert parameter["Default"] == ""


def test_invoke_is_granted_on_the_given_arns_only_and_only_when_set() -> None:
    template = load_template()
    condition, statement = _bedrock_statement(template)
    assert template["Conditions"][condition] == {
        "Fn::Not": [{"Fn::Equals": [{"Fn::Join": ["", {"Ref": "BedrockModelArns"}]}, ""]}]
    }
    assert statement["Effect"] == "Allow"
    assert set(statement["Action"]) == INVOKE  # Converse and ConverseStream, nothing else
    # The resource is the parameter itself: no wildcard, no other model.
    assert statement["Resource"] == {"Ref": "BedrockModelArns"}
    assert "Condition" not in statement and "NotResource" not in statement


def test_no_other_role_may_call_bedrock() -> None:
    for name, resource in load_template()["Resources"].items():
        if resource["Type"] != "AWS::IAM::Role" or name == "GatewayRole":
            continue
        text = str(resource["Properties"])
        assert "bedrock" not in text.lower(), name


def test_a_created_vpc_reaches_bedrock_through_an_endpoint() -> None:
    template = load_template()
    endpoint = template["Resources"]["BedrockRuntimeEndpoint"]
    props = endpoint["Properties"]
    assert props["ServiceName"] == {"Fn::Sub": "com.amazonaws.${AWS::Region}.bedrock-runtime"}
    assert props["VpcEndpointType"] == "Interface" and props["PrivateDnsEnabled"] is True
    assert props["SubnetIds"] == [{"Ref": "PrivateSubnetA"}, {"Ref": "PrivateSubnetB"}]
    assert props["SecurityGroupIds"] == [{"Ref": "EndpointSecurityGroup"}]
    conditions = template["Conditions"]
    condition = conditions[endpoint["Condition"]]
    assert condition == {
        "Fn::And": [{"Fn::Condition": "EndpointsForAws"}, {"Fn::Condition": "UseBedrock"}]
    }
    # A created VPC with Egress=nat or none; with ipv6 the dual-stack public endpoint instead.
    assert conditions["EndpointsForAws"] == {
        "Fn::And": [{"Fn::Condition": "CreateVpc"}, {"Fn::Not": [{"Fn::Condition": "Ipv6Egress"}]}]
    }


def with_arns(tmp: Path) -> Path:
    """A copy of the template whose BedrockModelArns defaults to :data:`ARNS`, next to the
    original so its relative code paths still resolve."""
    text = TEMPLATE.read_text()
    block = re.search(
        r"  BedrockModelArns:\n    Type: CommaDelimitedList\n    Default: \"\"\n", text
    )
    assert block, "the parameter's block as this test knows it"
    set_block = block.group(0).replace('Default: ""', f'Default: "{",".join(ARNS)}"')
    copy = TEMPLATE.with_name(f".bedrock-lint-{tmp.name}.yaml")
    copy.write_text(text.replace(block.group(0), set_block))
    return copy


@pytest.mark.parametrize("arns", ["unset", "set"])
def test_sam_validate_lint_with_and_without_models(tmp_path: Path, arns: str) -> None:
    exe, env = sam_cli(), sam_env(tmp_path / "sam-app")
    template = TEMPLATE if arns == "unset" else with_arns(tmp_path)
    try:
        if template != TEMPLATE:
            _bedrock_statement(load_template(template))
            assert load_template(template)["Parameters"]["BedrockModelArns"]["Default"]
        result = subprocess.run(
            [exe, "validate", "--lint", "--template", str(template)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        if template != TEMPLATE:
            template.unlink()
