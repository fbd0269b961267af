"""The template's topologies: for each Egress and FrontDoor value, which resources CloudFormation
would create, that everything they reference exists under the same parameters, and what the
stack costs idle (the table in docs/deploy.md, "What it costs idle").

The template is rendered here the way CloudFormation resolves it: conditions evaluated with the
parameters, Fn::If branches taken, resources whose condition is false dropped.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.functional.test_infra_template import ROOT, function_env, load_template

TEMPLATE = load_template()
PSEUDO = {"AWS::Region", "AWS::AccountId", "AWS::Partition", "AWS::StackId", "AWS::StackName",
          "AWS::URLSuffix", "AWS::NoValue"}  # fmt: skip
NO_VALUE = object()


def parameters(**overrides: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, spec in TEMPLATE["Parameters"].items():
        default = spec.get("Default", "")
        if spec["Type"] == "CommaDelimitedList":
            default = [] if default == "" else default.split(",")
        values[name] = default
    values.update(overrides)
    return values


class Render:
    """The template under one set of parameter values."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self.conditions: dict[str, bool] = {}
        for name in TEMPLATE["Conditions"]:
            self.condition(name)
        self.resources = {
            name: self.value(res)
            for name, res in TEMPLATE["Resources"].items()
            if "Condition" not in res or self.conditions[res["Condition"]]
        }
        self.outputs = {
            name: self.value(out)
            for name, out in TEMPLATE["Outputs"].items()
            if "Condition" not in out or self.conditions[out["Condition"]]
        }
        self.globals = self.value(TEMPLATE["Globals"])

    def condition(self, name: str) -> bool:
        if name not in self.conditions:
            self.conditions[name] = self.truth(TEMPLATE["Conditions"][name])
        return self.conditions[name]

    def truth(self, expr: Any) -> bool:
        (fn, arg), = expr.items()  # fmt: skip
        if fn in ("Condition", "Fn::Condition"):  # the loader spells !Condition Fn::Condition
            return self.condition(arg)
        if fn == "Fn::Equals":
            a, b = (self.scalar(x) for x in arg)
            return bool(a == b)
        if fn == "Fn::Not":
            return not self.truth(arg[0])
        if fn == "Fn::And":
            return all(self.truth(x) for x in arg)
        if fn == "Fn::Or":
            return any(self.truth(x) for x in arg)
        if fn == "Fn::Contains":  # in Rules only
            items, item = arg
            return str(self.scalar(item)) in [str(self.scalar(i)) for i in items]
        raise AssertionError(f"condition function {fn}")

    def scalar(self, expr: Any) -> Any:
        if isinstance(expr, dict) and "Ref" in expr:
            # A pseudo parameter (AWS::AccountId) stays as it is: known only at deploy.
            return self.params.get(expr["Ref"], expr)
        if isinstance(expr, dict) and "Fn::Join" in expr:
            sep, items = expr["Fn::Join"]
            items = self.scalar(items)
            return sep.join(str(self.scalar(i)) for i in items)
        if isinstance(expr, dict) and "Fn::Split" in expr:
            sep, text = expr["Fn::Split"]
            return str(self.scalar(text)).split(sep)
        if isinstance(expr, dict) and "Fn::Select" in expr:
            index, items = expr["Fn::Select"]
            found = self.scalar(items)
            # CloudFormation fails the stack on an index out of range, and so does this.
            assert int(index) < len(found), f"Fn::Select {index} of {found}"
            return self.scalar(found[int(index)])
        return expr

    def value(self, node: Any) -> Any:
        """Fn::If resolved and AWS::NoValue dropped; other intrinsics left as they are."""
        if isinstance(node, dict):
            if set(node) == {"Fn::If"}:
                cond, yes, no = node["Fn::If"]
                return self.value(yes if self.condition(cond) else no)
            if node == {"Ref": "AWS::NoValue"}:
                return NO_VALUE
            out = {k: self.value(v) for k, v in node.items()}
            return {k: v for k, v in out.items() if v is not NO_VALUE}
        if isinstance(node, list):
            return [v for v in (self.value(x) for x in node) if v is not NO_VALUE]
        return node

    def references(self, node: Any) -> set[str]:
        """Logical ids a resolved node names (Ref, Fn::GetAtt, ${...} in Fn::Sub, DependsOn)."""
        found: set[str] = set()
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "Ref" and isinstance(v, str):
                    found.add(v)
                elif k == "Fn::GetAtt":
                    found.add(v[0] if isinstance(v, list) else v.split(".")[0])
                elif k == "Fn::Sub":
                    text, names = (v, {}) if isinstance(v, str) else (v[0], v[1])
                    for ref in re.findall(r"\$\{([^}!]+)\}", text):
                        if ref not in names:
                            found.add(ref.split(".")[0])
                    found |= self.references(names)
                elif k == "DependsOn":
                    found |= set([v] if isinstance(v, str) else v)
                else:
                    found |= self.references(v)
        elif isinstance(node, list):
            for x in node:
                found |= self.references(x)
        return found


TOPOLOGIES = ["nat", "ipv6", "none", "no-vpc"]
DOORS = ["api-gateway", "function-url"]


def render(**overrides: str) -> Render:
    return Render(parameters(**overrides))


def sam_generated() -> set[str]:
    """Logical ids SAM adds that the template may name: <function>Alias<name> for each
    AutoPublishAlias (SAM's "Generated CloudFormation resources"; hyphens and underscores in
    the name become D and U)."""
    return {
        f"{name}Alias{alias.replace('-', 'D').replace('_', 'U')}"
        for name, res in TEMPLATE["Resources"].items()
        if res["Type"] == "AWS::Serverless::Function"
        and isinstance(alias := res["Properties"].get("AutoPublishAlias"), str)
    }


def test_the_defaults() -> None:
    """The default front door is the function URL and the default egress no VPC: AWS says
    function URLs do not stream "within a VPC environment", and outside one they do. API
    Gateway and the VPC shapes stay parameters."""
    assert TEMPLATE["Parameters"]["FrontDoor"]["Default"] == "function-url"
    assert TEMPLATE["Parameters"]["Egress"]["Default"] == "no-vpc"
    assert set(TEMPLATE["Parameters"]["Egress"]["AllowedValues"]) == set(TOPOLOGIES)
    assert set(TEMPLATE["Parameters"]["FrontDoor"]["AllowedValues"]) == set(DOORS)


def test_a_default_deploy_streams_from_the_function_url_outside_any_vpc() -> None:
    """What `sam deploy` with no parameters gives: a public RESPONSE_STREAM URL on the alias, the
    adapter streaming behind it, no function in a VPC, no EC2 resource at all (no NAT), no API,
    the cache on its public endpoint; its URL is the first output, the admin URL beside it."""
    r = render()
    url = r.resources["GatewayFunctionUrl"]["Properties"]
    assert url["InvokeMode"] == "RESPONSE_STREAM"
    assert url["AuthType"] == {"Ref": "FunctionUrlAuthType"}
    assert r.params["FunctionUrlAuthType"] == "NONE"  # tenant keys authenticate
    assert {"GatewayUrlPublicInvokeUrl", "GatewayUrlPublicInvokeFunction"} <= set(r.resources)
    env = function_env(TEMPLATE, "GatewayFunction")
    assert env["AWS_LWA_INVOKE_MODE"] == "response_stream"
    assert "VpcConfig" not in r.globals["Function"]
    for name in created(r, "AWS::Serverless::Function"):
        assert "VpcConfig" not in r.resources[name]["Properties"], name
    assert not [n for n, res in r.resources.items() if res["Type"].startswith("AWS::EC2::")]
    assert not [n for n, res in r.resources.items() if res["Type"].startswith("AWS::ApiGateway")]
    assert r.resources["BudgetCache"]["Properties"]["ConnectionType"] == "public"
    outputs = list(r.outputs)
    assert outputs[0] == "GatewayUrl"
    assert r.outputs["GatewayUrl"]["Value"] == {"Fn::GetAtt": ["GatewayFunctionUrl", "FunctionUrl"]}
    assert r.outputs["AdminUrl"]["Value"] == {"Fn::GetAtt": ["AdminFunctionUrl", "FunctionUrl"]}
    assert idle_cost(r) == IDLE[("no-vpc", "")]


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("egress", TOPOLOGIES)
@pytest.mark.parametrize("vpc_id", ["", "vpc-0123456789abcdef0"], ids=["new-vpc", "own-vpc"])
@pytest.mark.parametrize("bedrock", ["", "arn:aws:bedrock:us-east-1::foundation-model/x"])
@pytest.mark.parametrize("cache", ["", "rediss://cache.example:6379"], ids=["new-cache", "own"])
def test_every_reference_exists(
    egress: str, door: str, vpc_id: str, bedrock: str, cache: str
) -> None:
    """Nothing created names something that is not: what CloudFormation would reject."""
    r = render(
        Egress=egress,
        FrontDoor=door,
        VpcId=vpc_id,
        PrivateSubnetIds=["subnet-0a", "subnet-0b"] if vpc_id else [],
        BedrockModelArns=[bedrock] if bedrock else [],
        ExistingRedisUrl=cache,
    )
    known = set(r.resources) | sam_generated() | set(TEMPLATE["Parameters"]) | PSEUDO
    for name, node in [*r.resources.items(), *r.outputs.items(), ("Globals", r.globals)]:
        missing = r.references(node) - known
        assert not missing, f"{egress}/{door}: {name} names {sorted(missing)}, not created"


def created(r: Render, *types: str) -> set[str]:
    return {n for n, res in r.resources.items() if res["Type"] in types}


def test_nat() -> None:
    r = render(Egress="nat")
    assert created(r, "AWS::EC2::NatGateway") == {"NatGatewayA"}
    assert created(r, "AWS::EC2::InternetGateway") == {"InternetGateway"}
    assert not created(r, "AWS::EC2::EgressOnlyInternetGateway")
    assert "SecretsManagerEndpoint" in r.resources
    vpc = r.globals["Function"]["VpcConfig"]
    assert vpc["Ipv6AllowedForDualStack"] is False
    assert (
        "AWS_ENDPOINT_URL_SECRETS_MANAGER" not in r.globals["Function"]["Environment"]["Variables"]
    )
    ha = render(Egress="nat", HighlyAvailableNat="true")
    assert created(ha, "AWS::EC2::NatGateway") == {"NatGatewayA", "NatGatewayB"}


def test_ipv6() -> None:
    r = render(Egress="ipv6", BedrockModelArns=["arn:aws:bedrock:us-east-1::foundation-model/x"])
    assert not created(r, "AWS::EC2::NatGateway", "AWS::EC2::EIP", "AWS::EC2::InternetGateway")
    assert created(r, "AWS::EC2::EgressOnlyInternetGateway") == {"EgressOnlyGateway"}
    # No interface endpoint: Secrets Manager and Bedrock over IPv6 at their dual-stack names.
    assert not created(r, "AWS::EC2::VPCEndpoint") - {"DynamoDbEndpoint"}
    routes = {
        n: res["Properties"] for n, res in r.resources.items() if res["Type"] == "AWS::EC2::Route"
    }
    assert {p.get("DestinationIpv6CidrBlock") for p in routes.values()} == {"::/0"}
    assert all(
        p["EgressOnlyInternetGatewayId"] == {"Ref": "EgressOnlyGateway"} for p in routes.values()
    )
    for subnet in ("PrivateSubnetA", "PrivateSubnetB"):
        assert "Ipv6CidrBlock" in r.resources[subnet]["Properties"]
    assert r.globals["Function"]["VpcConfig"]["Ipv6AllowedForDualStack"] is True
    env = r.globals["Function"]["Environment"]["Variables"]
    assert env["AWS_ENDPOINT_URL_SECRETS_MANAGER"] == {
        "Fn::Sub": "https://secretsmanager.${AWS::Region}.api.aws"
    }
    assert env["AWS_ENDPOINT_URL_BEDROCK_RUNTIME"] == {
        "Fn::Sub": "https://bedrock-runtime.${AWS::Region}.api.aws"
    }
    egress = r.resources["FunctionSecurityGroup"]["Properties"]["SecurityGroupEgress"]
    assert any(rule.get("CidrIpv6") == "::/0" for rule in egress)


def test_none() -> None:
    r = render(Egress="none", BedrockModelArns=["arn:aws:bedrock:us-east-1::foundation-model/x"])
    assert not created(
        r, "AWS::EC2::NatGateway", "AWS::EC2::EIP", "AWS::EC2::InternetGateway",
        "AWS::EC2::EgressOnlyInternetGateway",
    )  # fmt: skip
    assert not [n for n, res in r.resources.items() if res["Type"] == "AWS::EC2::Route"]
    assert created(r, "AWS::EC2::VPCEndpoint") == {
        "SecretsManagerEndpoint", "BedrockRuntimeEndpoint", "DynamoDbEndpoint",
    }  # fmt: skip


def test_no_vpc() -> None:
    r = render(Egress="no-vpc", VpcId="vpc-0123456789abcdef0")  # VpcId is ignored
    assert not [n for n, res in r.resources.items() if res["Type"].startswith("AWS::EC2::")]
    assert "VpcConfig" not in r.globals["Function"]
    cache = r.resources["BudgetCache"]["Properties"]
    assert cache["ConnectionType"] == "public"
    assert cache["MajorEngineVersion"] == "9"  # public endpoints: Valkey 9.0 or later
    assert "SubnetIds" not in cache and "SecurityGroupIds" not in cache
    assert "UserGroupId" in cache  # a public endpoint takes IAM-authenticated users only
    for role in ("GatewayRole", "RollupRole", "AdminRole"):
        names = [p["PolicyName"] for p in r.resources[role]["Properties"]["Policies"]]
        assert "vpc-network-interfaces" not in names and "budget-cache" in names
    vpc = render(Egress="nat")
    names = [p["PolicyName"] for p in vpc.resources["GatewayRole"]["Properties"]["Policies"]]
    assert "vpc-network-interfaces" in names


ROLES = ("GatewayRole", "RollupRole", "AdminRole")


@pytest.mark.parametrize("egress", TOPOLOGIES)
def test_the_cache_takes_iam_users_only(egress: str) -> None:
    r = render(Egress=egress)
    user = r.resources["CacheUser"]["Properties"]
    assert user["Engine"] == "valkey"
    assert user["AuthenticationMode"] == {"Type": "iam"}
    assert user["UserId"] == user["UserName"]  # IAM auth requires id == name
    group = r.resources["CacheUserGroup"]["Properties"]
    assert group["Engine"] == "valkey" and group["UserIds"] == [{"Ref": "CacheUser"}]
    assert r.resources["BudgetCache"]["Properties"]["UserGroupId"] == {"Ref": "CacheUserGroup"}
    for role in ROLES:
        statements = [
            st
            for pol in r.resources[role]["Properties"]["Policies"]
            for st in pol["PolicyDocument"]["Statement"]
        ]
        connect = [st for st in statements if st["Action"] == "elasticache:Connect"]
        assert connect == [
            {
                "Effect": "Allow",
                "Action": "elasticache:Connect",
                "Resource": [
                    {"Fn::GetAtt": ["BudgetCache", "ARN"]},
                    {"Fn::GetAtt": ["CacheUser", "Arn"]},
                ],
            }
        ], role
    env = r.globals["Function"]["Environment"]["Variables"]
    assert env["HARDCAP_REDIS_IAM_USER"] == {"Ref": "CacheUser"}
    assert env["HARDCAP_REDIS_IAM_CACHE_NAME"] == {"Ref": "BudgetCache"}
    assert env["HARDCAP_REDIS_IAM_SERVERLESS"] == "true"


def test_an_existing_cache_has_no_iam_user() -> None:
    r = render(ExistingRedisUrl="rediss://cache.example:6379")
    assert "CacheUser" not in r.resources and "BudgetCache" not in r.resources
    env = r.globals["Function"]["Environment"]["Variables"]
    assert env["HARDCAP_REDIS_IAM_USER"] == ""  # off: hardcap_core/ledger/iam_auth.py


def test_iam_variables_are_the_codes() -> None:
    """The names the template sets are the constants iam_auth.py reads."""
    from hardcap_core.ledger import iam_auth

    env = function_env(TEMPLATE, "GatewayFunction")
    for name in (iam_auth.IAM_USER, iam_auth.IAM_CACHE_NAME, iam_auth.IAM_SERVERLESS):
        assert name in env


@pytest.mark.parametrize("egress", TOPOLOGIES)
def test_api_gateway_front_door(egress: str) -> None:
    r = render(Egress=egress, FrontDoor="api-gateway")
    assert "GatewayFunctionUrl" not in r.resources
    assert created(r, "AWS::ApiGateway::RestApi") == {"GatewayApi"}
    api = r.resources["GatewayApi"]["Properties"]
    assert api["EndpointConfiguration"]["Types"] == ["REGIONAL"]
    methods = created(r, "AWS::ApiGateway::Method")
    assert methods == {"GatewayApiProxyMethod", "GatewayApiRootMethod"}
    for m in methods:
        props = r.resources[m]["Properties"]
        assert props["HttpMethod"] == "ANY"
        assert props["AuthorizationType"] == "NONE"
        integration = props["Integration"]
        assert integration["ResponseTransferMode"] == "STREAM"
        assert integration["TimeoutInMillis"] == 900_000  # streaming: up to 15 minutes
        assert "response-streaming-invocations" in integration["Uri"]["Fn::Sub"]
        assert "/functions/${GatewayFunctionAliaslive}/" in integration["Uri"]["Fn::Sub"]
    permission = r.resources["GatewayApiInvokePermission"]["Properties"]
    assert permission["FunctionName"] == {"Ref": "GatewayFunctionAliaslive"}
    assert permission["Principal"] == "apigateway.amazonaws.com"
    assert permission["Action"] == "lambda:InvokeFunction"
    base = r.outputs["OpenAIBaseUrl"]["Value"]["Fn::Sub"]
    assert base.startswith("https://${GatewayApi}.execute-api.") and base.endswith("/v1")
    assert "FunctionUrl" not in r.outputs
    signed = render(Egress=egress, FrontDoor="api-gateway", FunctionUrlAuthType="AWS_IAM")
    for m in methods:
        assert signed.resources[m]["Properties"]["AuthorizationType"] == "AWS_IAM"


def test_function_url_front_door() -> None:
    r = render(FrontDoor="function-url")
    assert not created(r, "AWS::ApiGateway::RestApi", "AWS::ApiGateway::Method")
    url = r.resources["GatewayFunctionUrl"]
    assert url["Properties"]["InvokeMode"] == "RESPONSE_STREAM"
    # The alias's URL, not $LATEST's: SnapStart serves published versions only.
    assert url["Properties"]["TargetFunctionArn"] == {"Ref": "GatewayFunction"}
    assert url["Properties"]["Qualifier"] == "live"
    assert url["DependsOn"] == "GatewayFunctionAliaslive"
    assert {"GatewayUrlPublicInvokeUrl", "GatewayUrlPublicInvokeFunction"} <= set(r.resources)
    for permission in ("GatewayUrlPublicInvokeUrl", "GatewayUrlPublicInvokeFunction"):
        props = r.resources[permission]["Properties"]
        assert props["FunctionName"] == {"Ref": "GatewayFunctionAliaslive"}, permission
    assert r.outputs["OpenAIBaseUrl"]["Value"] == {"Fn::Sub": "${GatewayFunctionUrl.FunctionUrl}v1"}
    signed = render(FrontDoor="function-url", FunctionUrlAuthType="AWS_IAM")
    assert "GatewayUrlPublicInvokeUrl" not in signed.resources


# ------------------------------------------------------------------ the admin function

ROLE_ARN = "arn:aws:iam::123456789012:role/hardcap-operator"
OTHER_ACCOUNT_ROLE = "arn:aws:iam::210987654321:role/platform-admin"
USER_ARN = "arn:aws:iam::123456789012:user/alice"
ADMIN_LISTS = {
    "none": [""],  # the parameter's default, as CloudFormation reads an empty list
    "one": [ROLE_ARN],
    "three": [ROLE_ARN, OTHER_ACCOUNT_ROLE, USER_ARN],
}


def admin_permissions(r: Render) -> dict[str, dict[str, Any]]:
    """Every permission on the admin function, by logical id."""
    return {
        name: res["Properties"]
        for name, res in r.resources.items()
        if res["Type"] == "AWS::Lambda::Permission"
        and res["Properties"]["FunctionName"] == {"Ref": "AdminFunction"}
    }


@pytest.mark.parametrize("admins", sorted(ADMIN_LISTS))
@pytest.mark.parametrize("auth", ["NONE", "AWS_IAM"])
@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("egress", TOPOLOGIES)
def test_the_admin_url_takes_signed_iam_calls_only(
    egress: str, door: str, auth: str, admins: str
) -> None:
    """Whatever the parameters, the admin URL is AWS_IAM (a literal in the template, not a
    parameter), buffered, with no CORS; no permission opens it to everyone or to unsigned
    calls, and no front door of the gateway reaches it."""
    declared = TEMPLATE["Resources"]["AdminFunctionUrl"]
    assert declared["Properties"]["AuthType"] == "AWS_IAM" and "Condition" not in declared
    r = render(
        Egress=egress,
        FrontDoor=door,
        FunctionUrlAuthType=auth,
        AdminPrincipalArns=ADMIN_LISTS[admins],
    )
    url = r.resources["AdminFunctionUrl"]["Properties"]
    assert url == {
        "TargetFunctionArn": {"Ref": "AdminFunction"},
        "AuthType": "AWS_IAM",
        "InvokeMode": "BUFFERED",
    }
    permissions = admin_permissions(r)
    assert permissions
    for name, permission in permissions.items():
        assert r.scalar(permission["Principal"]) not in ("*", ""), name
        if permission["Action"] == "lambda:InvokeFunctionUrl":
            assert permission["FunctionUrlAuthType"] == "AWS_IAM", name
        else:
            assert permission["Action"] == "lambda:InvokeFunction", name
            assert permission["InvokedViaFunctionUrl"] is True, name
    # The gateway's doors invoke the gateway's alias and nothing else.
    for name, res in r.resources.items():
        if res["Type"] == "AWS::ApiGateway::Method":
            assert "AdminFunction" not in str(res["Properties"]["Integration"]), name


@pytest.mark.parametrize(
    ("admins", "principals"),
    [
        ([""], [{"Ref": "AWS::AccountId"}]),
        ([ROLE_ARN], [ROLE_ARN]),
        ([ROLE_ARN, USER_ARN], [ROLE_ARN, USER_ARN]),
        ([ROLE_ARN, OTHER_ACCOUNT_ROLE, USER_ARN], [ROLE_ARN, OTHER_ACCOUNT_ROLE, USER_ARN]),
    ],
    ids=["default-the-account", "one", "two", "three"],
)
def test_admin_principals_each_get_both_permissions(
    admins: list[str], principals: list[Any]
) -> None:
    """Empty names the account (any of its principals whose IAM policies allow the calls);
    otherwise each ARN gets lambda:InvokeFunctionUrl and lambda:InvokeFunction, in order."""
    r = render(AdminPrincipalArns=admins)
    granted: dict[str, list[Any]] = {"lambda:InvokeFunctionUrl": [], "lambda:InvokeFunction": []}
    for name in sorted(admin_permissions(r)):
        permission = r.resources[name]["Properties"]
        granted[permission["Action"]].append(r.scalar(permission["Principal"]))
    assert granted == {"lambda:InvokeFunctionUrl": principals, "lambda:InvokeFunction": principals}
    assert "AdminPrincipalArnsTakeAtMostThree" not in r.resources


def test_a_fourth_admin_principal_fails_the_deploy() -> None:
    """A value without a slot would leave its principal without access and no one told: the
    stack gets a wait condition that is never signalled, so the deploy fails and rolls back."""
    r = render(AdminPrincipalArns=[ROLE_ARN, OTHER_ACCOUNT_ROLE, USER_ARN, ROLE_ARN + "-2"])
    guard = r.resources["AdminPrincipalArnsTakeAtMostThree"]
    assert guard["Type"] == "AWS::CloudFormation::WaitCondition"
    assert guard["Properties"]["Handle"] == {"Ref": "AdminPrincipalArnsTakeAtMostThreeHandle"}
    handle = r.resources["AdminPrincipalArnsTakeAtMostThreeHandle"]
    assert handle["Type"] == "AWS::CloudFormation::WaitConditionHandle"
    assert len(admin_permissions(r)) == 6  # the first three still render
    known = set(r.resources) | sam_generated() | set(TEMPLATE["Parameters"]) | PSEUDO
    for name, node in r.resources.items():
        assert not r.references(node) - known, name


def test_admin_principal_values_are_principals() -> None:
    """Account ids, account roots, IAM roles and users; not a wildcard or a service."""
    pattern = re.compile(TEMPLATE["Parameters"]["AdminPrincipalArns"]["AllowedPattern"])
    for good in ("", "123456789012", "arn:aws:iam::123456789012:root", ROLE_ARN, USER_ARN,
                 "arn:aws-us-gov:iam::123456789012:role/path/ops"):  # fmt: skip
        assert pattern.fullmatch(good), good
    for bad in ("*", "lambda.amazonaws.com", "arn:aws:iam::123456789012:group/admins",
                "arn:aws:sts::123456789012:assumed-role/ops/alice", "12345"):  # fmt: skip
        assert not pattern.fullmatch(bad), bad


def role_policy_names(r: Render, role: str) -> set[str]:
    return {p["PolicyName"] for p in r.resources[role]["Properties"]["Policies"]}


@pytest.mark.parametrize("cache", ["", "rediss://cache.example:6379"], ids=["new-cache", "own"])
@pytest.mark.parametrize("egress", TOPOLOGIES)
def test_the_admin_function_sits_where_the_gateway_does(egress: str, cache: str) -> None:
    """It writes each change's version into the cache, so it needs the gateway's network (the
    Globals' VpcConfig, no override), its cache settings and its elasticache:Connect grant."""
    r = render(Egress=egress, ExistingRedisUrl=cache)
    admin = r.resources["AdminFunction"]["Properties"]
    for function in ("AdminFunction", "GatewayFunction"):
        assert "VpcConfig" not in r.resources[function]["Properties"], function
    gateway_env = function_env(TEMPLATE, "GatewayFunction")
    admin_env = function_env(TEMPLATE, "AdminFunction")
    for name in ("HARDCAP_REDIS_URL", "HARDCAP_REDIS_CLUSTER", "HARDCAP_REDIS_IAM_USER",
                 "HARDCAP_REDIS_IAM_CACHE_NAME", "HARDCAP_REDIS_IAM_SERVERLESS",
                 "HARDCAP_USAGE_TABLE", "HARDCAP_CONFIG_TABLE", "HARDCAP_CONFIG"):  # fmt: skip
        assert admin_env[name] == gateway_env[name], name
    assert not [n for n in admin_env if n.startswith(("AWS_LWA_", "AWS_LAMBDA_EXEC"))]
    assert "Layers" not in admin  # a plain Python handler: no web adapter
    gateway_policies = role_policy_names(r, "GatewayRole")
    admin_policies = role_policy_names(r, "AdminRole")
    for shared in ("vpc-network-interfaces", "budget-cache"):
        assert (shared in admin_policies) == (shared in gateway_policies), shared
    assert ("vpc-network-interfaces" in admin_policies) == (egress != "no-vpc")
    assert ("budget-cache" in admin_policies) == (cache == "")


# ------------------------------------------------------------------ SnapStart

HOOKS = ("AWS_LWA_SNAPSTART_BEFORE_CHECKPOINT_PATH", "AWS_LWA_SNAPSTART_AFTER_RESTORE_PATH")


def gateway(r: Render) -> dict[str, Any]:
    props: dict[str, Any] = r.resources["GatewayFunction"]["Properties"]
    return props


def test_snapstart_is_off_by_default() -> None:
    assert TEMPLATE["Parameters"]["SnapStart"]["Default"] == "off"
    r = render()
    props = gateway(r)
    assert props["SnapStart"] == {"ApplyOn": "None"}
    assert not set(HOOKS) & set(props["Environment"]["Variables"])
    # The alias exists either way: the front doors invoke it whether SnapStart is on or off.
    assert props["AutoPublishAlias"] == "live"


@pytest.mark.parametrize("door", DOORS)
def test_snapstart_on_applies_to_published_versions_with_the_hooks(
    door: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hardcap_core.gateway import app

    r = render(SnapStart="on", LambdaAdapterLayerVersion="30", FrontDoor=door)
    props = gateway(r)
    assert props["SnapStart"] == {"ApplyOn": "PublishedVersions"}
    assert props["AutoPublishAlias"] == "live"
    env = props["Environment"]["Variables"]
    assert env["AWS_LWA_SNAPSTART_BEFORE_CHECKPOINT_PATH"] == "/_hardcap/snapstart/before"
    assert env["AWS_LWA_SNAPSTART_AFTER_RESTORE_PATH"] == "/_hardcap/snapstart/after"
    # The names are the ones the app reads, and it serves POST at exactly those paths.
    assert set(HOOKS) == set(app.SNAPSTART_HOOKS)
    for name in HOOKS:
        monkeypatch.setenv(name, env[name])
    routes = app.snapstart_routes(object())  # type: ignore[arg-type]
    assert {(route.path, tuple(sorted(route.methods or ()))) for route in routes} == {
        (env[name], ("POST",)) for name in HOOKS
    }
    # Nothing outside the gateway: the rollup runs no adapter.
    rollup = r.resources["RollupFunction"]["Properties"].get("Environment", {})
    assert not set(HOOKS) & set(rollup.get("Variables", {}))
    assert "SnapStart" not in r.resources["RollupFunction"]["Properties"]


def rule_holds(name: str, **overrides: str) -> bool:
    """Whether a rule's assertions hold under the parameters (true when its condition is not)."""
    rule = TEMPLATE["Rules"][name]
    r = render(**overrides)
    if "RuleCondition" in rule and not r.truth(rule["RuleCondition"]):
        return True
    return all(r.truth(a["Assert"]) for a in rule["Assertions"])


def test_snapstart_needs_adapter_1_1() -> None:
    """The Web Adapter's SnapStart hooks are in 1.1.0, public layer 30 (29 was a withdrawn
    release, 28 is 1.0.1, 27 1.0.0): "on" with an older public layer is refused at deploy."""
    name = "SnapStartNeedsAdapter110"
    for version in ("1", "27", "28", "29"):
        assert not rule_holds(name, SnapStart="on", LambdaAdapterLayerVersion=version), version
        assert rule_holds(name, SnapStart="off", LambdaAdapterLayerVersion=version), version
    for version in ("30", "31", "100"):
        assert rule_holds(name, SnapStart="on", LambdaAdapterLayerVersion=version), version
    # A layer ARN of one's own: the template cannot know its adapter version (docs/deploy.md).
    own = "arn:aws:lambda:us-east-1:123456789012:layer:lwa:3"
    assert rule_holds(
        name, SnapStart="on", LambdaAdapterLayerVersion="27", LambdaAdapterLayerArn=own
    )
    listed = TEMPLATE["Rules"][name]["Assertions"][0]["Assert"]["Fn::Not"][0]["Fn::Contains"][0]
    assert listed == [str(v) for v in range(1, 30)]


def test_a_parameter_change_publishes_a_version() -> None:
    """SAM names the version after the code and the template's text, not the parameter values
    (samtranslator's _construct_version): the version's description carries the parameters that
    set the gateway's configuration, so changing one replaces the version, which publishes one.
    A NoEcho value must not end up there (descriptions are readable)."""
    props = TEMPLATE["Resources"]["GatewayFunction"]["Properties"]
    text, names = props["VersionDescription"]["Fn::Sub"]
    used = set(re.findall(r"\$\{([^}!]+)\}", text))
    params = used - set(names)
    assert {"SnapStart", "MemorySize", "TimeoutSeconds", "LogLevel", "Architecture"} <= params
    assert params <= set(TEMPLATE["Parameters"])
    refs = Render(parameters()).references(names)
    assert {"LambdaAdapterLayerVersion", "LambdaAdapterLayerArn", "BudgetCache"} <= refs
    secret = {n for n, spec in TEMPLATE["Parameters"].items() if spec.get("NoEcho")}
    assert not (params | refs) & secret
    assert props["VersionDeletionPolicy"] == "Delete"


# ------------------------------------------------------------------ what it costs idle

HOURS = 730
# US East (N. Virginia) list prices (docs/deploy.md gives the sources).
NAT_HOUR = 0.045
PUBLIC_IPV4_HOUR = 0.005
ENDPOINT_AZ_HOUR = 0.01
CACHE_MIN_GB_MONTH = 0.1 * 0.084 * HOURS  # ElastiCache Serverless Valkey: 100 MB minimum
SECRET_MONTH = 0.40


def idle_cost(r: Render) -> float:
    """$ per month with no traffic: the resources billed by the hour, the cache's minimum and
    the secret (Lambda, API Gateway, DynamoDB on demand, logs and alarms without tenants: 0;
    the dashboard is free within an account's first three)."""
    res = r.resources
    cost = HOURS * NAT_HOUR * len(created(r, "AWS::EC2::NatGateway"))
    cost += HOURS * PUBLIC_IPV4_HOUR * len(created(r, "AWS::EC2::EIP"))
    for name in created(r, "AWS::EC2::VPCEndpoint"):
        if res[name]["Properties"]["VpcEndpointType"] == "Interface":
            cost += HOURS * ENDPOINT_AZ_HOUR * len(res[name]["Properties"]["SubnetIds"])
    if "BudgetCache" in res:
        cost += CACHE_MIN_GB_MONTH
    cost += SECRET_MONTH * len(created(r, "AWS::SecretsManager::Secret"))
    return round(cost, 2)


IDLE = {  # the table in docs/deploy.md
    ("nat", ""): 57.63,
    ("ipv6", ""): 6.53,
    ("none", ""): 21.13,
    ("no-vpc", ""): 6.53,
    ("nat", "bedrock"): 72.23,
    ("ipv6", "bedrock"): 6.53,
    ("none", "bedrock"): 35.73,
    ("no-vpc", "bedrock"): 6.53,
}


@pytest.mark.parametrize(("egress", "bedrock"), sorted(IDLE))
def test_idle_cost(egress: str, bedrock: str) -> None:
    arns = ["arn:aws:bedrock:us-east-1::foundation-model/x"] if bedrock else []
    cost = idle_cost(render(Egress=egress, BedrockModelArns=arns))
    assert cost == IDLE[(egress, bedrock)]
    if egress in ("ipv6", "no-vpc"):
        assert cost <= 10  # the goal (issue 13): with the $3 dashboard too, 9.53


def test_the_docs_table_is_this_one() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text.split("### What it costs idle", 1)[1].split("\n## ", 1)[0]
    for (egress, bedrock), cost in IDLE.items():
        if not bedrock:
            assert re.search(rf"\| `{re.escape(egress)}` \|.*\*\*{cost:.2f}\*\*", section), egress
