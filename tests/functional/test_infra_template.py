"""The SAM template: it lints clean, and it agrees with the code it deploys.

Agreement is checked both ways: every environment variable the shipped code reads is set by the
template (or by Lambda itself), and every variable the template sets is read by the code or by
a component named here (Powertools, the Lambda Web Adapter). So a renamed constant in
``hardcap_core/env.py`` or a typo in the template fails here, not in a deployed function.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aws_lambda_powertools.shared.constants as powertools_constants
import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "infra" / "template.yaml"
MAKEFILE = ROOT / "infra" / "Makefile"

# The code each function runs besides the shipped part of hardcap_core. A function added to the
# template must be added here, or test_every_function_is_mapped fails.
FUNCTION_CODE = {
    "GatewayFunction": [ROOT / "functions" / "gateway"],
    "RollupFunction": [ROOT / "functions" / "rollup"],
    "AdminFunction": [ROOT / "functions" / "admin"],
}

# Variables the template sets that no Hardcap code reads, and who reads them instead.
READ_BY_COMPONENT = {
    # Powertools Logger (hardcap_core/logs.py): the log level of every function.
    "POWERTOOLS_LOG_LEVEL": "powertools",
    # The Lambda runtime runs this wrapper (the Web Adapter's bootstrap) instead of itself.
    "AWS_LAMBDA_EXEC_WRAPPER": "lambda-web-adapter",
    # Read by the Lambda Web Adapter: stream responses, and where its readiness check polls.
    "AWS_LWA_INVOKE_MODE": "lambda-web-adapter",
    "AWS_LWA_READINESS_CHECK_PATH": "lambda-web-adapter",
    # Read by the adapter too, not only by run.sh: both must use the same port.
    "AWS_LWA_PORT": "lambda-web-adapter",
    # Egress=ipv6: botocore's service-specific endpoints (the dual-stack ones), read by the
    # Secrets Manager client (Powertools) and the Bedrock client.
    "AWS_ENDPOINT_URL_SECRETS_MANAGER": "botocore:secretsmanager",
    "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": "botocore:bedrock-runtime",
    # ... and by the rollup's EventBridge client (budget threshold events).
    "AWS_ENDPOINT_URL_EVENTBRIDGE": "botocore:eventbridge",
}

# Variables the code reads that Lambda sets in every execution environment (the role's
# credentials and region: ledger/iam_auth.py signs the cache's IAM token with them).
SET_BY_LAMBDA = {
    "LAMBDA_TASK_ROOT",
    "LAMBDA_RUNTIME_DIR",
    "PYTHONPATH",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_LAMBDA_FUNCTION_NAME",  # gateway/loop_lag.py: no loop-lag monitor on Lambda
}

# Variables shared code reads whose absence is a setting: unset, the feature is off. The
# template sets them only where the feature is on (the gateway, SnapStart=on: the Web Adapter's
# hook paths, which gateway/app.py serves only when set).
OPTIONAL_READS = {
    "AWS_LWA_SNAPSTART_BEFORE_CHECKPOINT_PATH",
    "AWS_LWA_SNAPSTART_AFTER_RESTORE_PATH",
    # Only the rollup sends budget threshold events (rollup/eventbridge.py): set there alone.
    "HARDCAP_EVENT_BUS",
    # Traces (gateway/tracing.py): set on the gateway only when OtlpEndpoint is; the SDK's own
    # names are an operator's or a layer's (ADOT) to set, and read after Hardcap's.
    "HARDCAP_OTLP_ENDPOINT",
    "OTEL_SERVICE_NAME",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_SDK_DISABLED",
}

# Reads whose name is data, not code: the config's `api_key_env` names a variable the operator
# adds to the function (docs/deploy.md says how). (file, the expression holding the name)
DYNAMIC_READS = {("hardcap_core/config/secrets.py", "source.name")}


class _CfnLoader(yaml.SafeLoader):
    """Reads CloudFormation's short tags (!Ref, !Sub, ...) as their long ``Fn::`` forms."""


def _tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        assert isinstance(node, yaml.MappingNode)
        value = loader.construct_mapping(node, deep=True)
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


_CfnLoader.add_multi_constructor("!", _tag)


def load_template(path: Path = TEMPLATE) -> dict[str, Any]:
    """The template as a dict; intrinsic functions stay unevaluated."""
    data: dict[str, Any] = yaml.load(path.read_text(), Loader=_CfnLoader)
    return data


def dev_only_modules() -> set[str]:
    """Paths under hardcap_core/ (modules or folders) the Makefile leaves out of the artifact."""
    match = re.search(r"^DEV_ONLY := (.+)$", MAKEFILE.read_text(), re.MULTILINE)
    assert match, "infra/Makefile defines DEV_ONLY"
    return set(match.group(1).split())


def shipped_core_modules() -> list[Path]:
    """The hardcap_core modules that go into the artifact."""
    core = ROOT / "hardcap_core"
    dev = dev_only_modules()
    return sorted(p for p in core.rglob("*.py") if p.relative_to(core).parts[0] not in dev)


def function_env(template: dict[str, Any], logical_id: str) -> dict[str, Any]:
    """The environment of a function: Globals merged with its own, as SAM merges them."""
    merged: dict[str, Any] = {}
    globals_fn = template.get("Globals", {}).get("Function", {})
    merged.update(globals_fn.get("Environment", {}).get("Variables", {}))
    props = template["Resources"][logical_id]["Properties"]
    merged.update(props.get("Environment", {}).get("Variables", {}))
    return merged


# ------------------------------------------------------------------ reading the code


def _is_environ(node: ast.expr) -> bool:
    if isinstance(node, ast.IfExp):  # (os.environ if environ is None else environ).get(...)
        return _is_environ(node.body) or _is_environ(node.orelse)
    text = ast.unparse(node)
    return text in ("environ", "env", "os.environ") or text.endswith(".environ")


def _constants(tree: ast.Module) -> dict[str, str]:
    return {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        and isinstance(n.value.value, str)
        for t in n.targets
        if isinstance(t, ast.Name)
    }  # fmt: skip


ENV_CONSTANTS = _constants(ast.parse((ROOT / "hardcap_core" / "env.py").read_text()))


def _resolve(arg: ast.expr, local: dict[str, str]) -> str | None:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Name):
        return local.get(arg.id)
    if isinstance(arg, ast.Attribute) and ast.unparse(arg.value) == "env":
        return ENV_CONSTANTS.get(arg.attr)
    return None


def _env_name_argument(node: ast.AST) -> ast.expr | None:
    """The expression naming the variable, if ``node`` reads the environment."""
    if isinstance(node, ast.Call) and node.args:
        f = node.func
        is_get = isinstance(f, ast.Attribute) and f.attr in ("get", "pop") and _is_environ(f.value)
        if is_get or ast.unparse(f) in ("os.getenv", "getenv"):
            return node.args[0]
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        return node.slice if _is_environ(node.value) else None
    if isinstance(node, ast.Compare) and isinstance(node.ops[-1], ast.In):
        return node.left if _is_environ(node.comparators[-1]) else None
    return None


def _dicts_of_names(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level dicts keyed by string constants: ``NAMES = {"A_VAR": ..., "B_VAR": ...}``."""
    found: dict[str, list[str]] = {}
    for n in tree.body:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict):
            keys = n.value.keys
            if keys and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in keys):
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        found[t.id] = [k.value for k in keys]  # type: ignore[union-attr]
    return found


def _loop_names(tree: ast.Module) -> dict[str, list[str]]:
    """Loop variables that take the keys of such a dict: ``for name in NAMES`` (or ``.keys()``),
    ``for name, value in NAMES.items()`` (app.py's SnapStart hooks are read this way)."""
    dicts = _dicts_of_names(tree)
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.For, ast.AsyncFor)):
            continue
        it, target = node.iter, node.target
        method = None
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and not it.args:
            method, it = it.func.attr, it.func.value
        if not (isinstance(it, ast.Name) and it.id in dicts):
            continue
        if method in (None, "keys") and isinstance(target, ast.Name):
            found[target.id] = dicts[it.id]
        elif method == "items" and isinstance(target, ast.Tuple):
            first = target.elts[0]
            if isinstance(first, ast.Name):
                found[first.id] = dicts[it.id]
    return found


def python_env_reads(path: Path) -> tuple[set[str], set[str]]:
    """(names read, expressions that could not be resolved to a name) in one Python file."""
    tree = ast.parse(path.read_text())
    local = _constants(tree)
    looped = _loop_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("env", "hardcap_core.env"):
            local.update({a.asname or a.name: ENV_CONSTANTS[a.name] for a in node.names})
    names: set[str] = set()
    unresolved: set[str] = set()
    for node in ast.walk(tree):
        arg = _env_name_argument(node)
        if arg is None:
            continue
        name = _resolve(arg, local)
        if name is not None:
            names.add(name)
        elif isinstance(arg, ast.Name) and arg.id in looped:
            names.update(looped[arg.id])
        else:
            unresolved.add(ast.unparse(arg))
    return names, unresolved


def shell_env_reads(path: Path) -> set[str]:
    """Upper-case variables a shell script expands (its own variables are lower case)."""
    text = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())
    return set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", text))


def code_env_reads(logical_id: str) -> dict[str, list[str]]:
    """Every variable the function's code reads, with where it is read."""
    files = shipped_core_modules()
    for folder in FUNCTION_CODE[logical_id]:
        files += sorted(folder.rglob("*.py")) + sorted(folder.rglob("*.sh"))
    reads: dict[str, list[str]] = {}
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if path.suffix == ".sh":
            names = shell_env_reads(path)
        else:
            names, unresolved = python_env_reads(path)
            unknown = {(rel, expr) for expr in unresolved} - DYNAMIC_READS
            assert not unknown, f"environment reads the test cannot name: {sorted(unknown)}"
        for name in names:
            reads.setdefault(name, []).append(rel)
    return reads


# ------------------------------------------------------------------ the tests


def test_reader_finds_the_known_reads() -> None:
    """Guards the scanner itself: it must see the reads this test exists for."""
    reads = code_env_reads("GatewayFunction")
    for name in ENV_CONSTANTS.values():
        assert name in reads, f"{name} (hardcap_core/env.py) is not found read anywhere"
    assert "POWERTOOLS_PARAMETERS_MAX_AGE" in reads  # config/secrets.py, via a constant
    assert "AWS_LWA_PORT" in reads  # run.sh
    # gateway/app.py, through a loop over the SNAPSTART_HOOKS dict's names
    assert "AWS_LWA_SNAPSTART_BEFORE_CHECKPOINT_PATH" in reads
    assert "AWS_LWA_SNAPSTART_AFTER_RESTORE_PATH" in reads


def test_every_function_is_mapped() -> None:
    functions = {
        name
        for name, res in load_template()["Resources"].items()
        if res["Type"] in ("AWS::Serverless::Function", "AWS::Lambda::Function")
    }
    assert functions == set(FUNCTION_CODE)


@pytest.mark.parametrize("logical_id", sorted(FUNCTION_CODE))
def test_code_reads_only_what_the_template_sets(logical_id: str) -> None:
    env = function_env(load_template(), logical_id)
    reads = code_env_reads(logical_id)
    missing = {
        n: where
        for n, where in reads.items()
        if n not in env and n not in SET_BY_LAMBDA and n not in OPTIONAL_READS
    }
    assert not missing, f"read by the code but not set by the template: {missing}"


@pytest.mark.parametrize("logical_id", sorted(FUNCTION_CODE))
def test_template_sets_only_what_is_read(logical_id: str) -> None:
    env = function_env(load_template(), logical_id)
    reads = code_env_reads(logical_id)
    unread = sorted(n for n in env if n not in reads and n not in READ_BY_COMPONENT)
    assert not unread, f"set by the template but read by nothing: {unread}"


def test_component_variables_are_real() -> None:
    """The names credited to Powertools are Powertools' own, and those credited to botocore are
    the service-specific endpoint variables botocore reads for that client, so a typo fails."""
    from botocore.configprovider import ConfiguredEndpointProvider

    known = {v for v in vars(powertools_constants).values() if isinstance(v, str)}
    for name, component in READ_BY_COMPONENT.items():
        if component == "powertools":
            assert name in known, f"{name} is not a Powertools setting"
        elif component.startswith("botocore:"):
            client = component.split(":", 1)[1]
            found = ConfiguredEndpointProvider({}, {}, client, {name: "https://x.example"})
            assert found.provide() == "https://x.example", f"botocore's {client} ignores {name}"
        else:
            assert name.startswith(("AWS_LWA_", "AWS_LAMBDA_EXEC_WRAPPER")), name


def test_streaming_settings_agree() -> None:
    """Both front doors stream, the adapter streams, and the handler is the adapter's script."""
    template = load_template()
    env = function_env(template, "GatewayFunction")
    resources = template["Resources"]
    url = resources["GatewayFunctionUrl"]["Properties"]
    assert url["InvokeMode"] == "RESPONSE_STREAM"
    for method in ("GatewayApiProxyMethod", "GatewayApiRootMethod"):
        integration = resources[method]["Properties"]["Integration"]
        assert integration["Type"] == "AWS_PROXY"
        assert integration["ResponseTransferMode"] == "STREAM"
        # The alias SAM generates for AutoPublishAlias: live, never $LATEST (SnapStart).
        assert integration["Uri"]["Fn::Sub"].endswith(
            "/2021-11-15/functions/${GatewayFunctionAliaslive}/response-streaming-invocations"
        )
    assert env["AWS_LWA_INVOKE_MODE"] == "response_stream"
    assert env["AWS_LAMBDA_EXEC_WRAPPER"] == "/opt/bootstrap"
    props = template["Resources"]["GatewayFunction"]["Properties"]
    script = ROOT / "functions" / "gateway" / props["Handler"]
    assert script.is_file() and os.access(script, os.X_OK)
    assert template["Globals"]["Function"]["Runtime"] == "python3.13"


async def test_readiness_path_answers_without_a_key() -> None:
    """The adapter polls this path before the first invocation: it must answer 2xx unauthed."""
    from hardcap_core.config import parse_config
    from hardcap_core.gateway.app import create_app

    path = function_env(load_template(), "GatewayFunction")["AWS_LWA_READINESS_CHECK_PATH"]
    app = create_app(parse_config({"gateway": {"redis_url": "redis://127.0.0.1:1"}}))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        response = await client.get(path)
    assert response.status_code == 200


@pytest.mark.parametrize("logical_id", sorted(FUNCTION_CODE))
def test_config_path_is_in_the_artifact_root(logical_id: str) -> None:
    """HARDCAP_CONFIG names the file the Makefile copies to the artifact's root."""
    env = function_env(load_template(), logical_id)
    assert env["HARDCAP_CONFIG"] == "/var/task/config.yaml"
    assert '"$(ARTIFACTS_DIR)/config.yaml"' in MAKEFILE.read_text()


def test_lock_pins_every_dependency_with_hashes() -> None:
    """Two builds a month apart install the same files: == pins with hashes, nothing more."""
    pins = lock_pins()
    for name in ("redis", "hiredis", "pydantic", "pydantic-core", "pyyaml", "starlette",
                 "uvicorn", "httptools", "certifi", "orjson", "aws-lambda-powertools",
                 "mangum"):  # fmt: skip
        assert name in pins, f"{name} is missing from infra/requirements-lambda.txt"
    assert not {"boto3", "botocore"} & set(pins), "the Lambda runtime ships boto3"
    text = (ROOT / "infra" / "requirements-lambda.txt").read_text()
    for block in re.split(r"\n(?=[a-z])", text.split("\n", 1)[1]):
        assert "--hash=sha256:" in block, f"no hash for {block.splitlines()[0]}"


def lock_pins() -> dict[str, str]:
    """Normalized project name -> pinned version, from infra/requirements-lambda.txt."""
    text = (ROOT / "infra" / "requirements-lambda.txt").read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s\\]+)", text, re.MULTILINE))
    return {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in pins.items()}


def test_run_sh_uses_the_event_loop_and_parser_the_lock_ships() -> None:
    """A fast loop or parser in the lock is named in run.sh, and run.sh names none the lock
    lacks: shipped and unused is dead weight, named and missing fails every start."""
    script = (ROOT / "functions" / "gateway" / "run.sh").read_text()
    command = script.split("\nexec ", 1)[1]  # the uvicorn command line; comments are above it
    options = dict(re.findall(r"--(loop|http) (\S+)", command))
    pins = lock_pins()
    for option, package in {"loop": "uvloop", "http": "httptools"}.items():
        named = options.get(option) == package
        assert named == (package in pins), (
            f"run.sh: --{option} {options.get(option)}, and the lock "
            f"{'pins' if package in pins else 'lacks'} {package}"
        )


# ------------------------------------------------------------------ the real SAM CLI


def sam_cli() -> str:
    """The `sam` executable. Without it the test fails under `make test` (which installs it and
    sets HARDCAP_REQUIRE_SAM=1) and in CI, so neither can skip it silently; elsewhere, skips."""
    found = shutil.which("sam")
    if found is None:
        message = "SAM CLI not on PATH: `make test` installs it (infra/requirements-tools.txt)"
        if os.environ.get("HARDCAP_REQUIRE_SAM") == "1" or os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def test_a_missing_sam_cli_fails_where_it_is_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sam there
    monkeypatch.setenv("HARDCAP_REQUIRE_SAM", "1")
    with pytest.raises(BaseException) as outcome:  # noqa: PT011 - a skip must count as wrong
        sam_cli()
    assert isinstance(outcome.value, pytest.fail.Exception), "skipped instead of failed"


def test_make_test_installs_the_sam_cli_and_requires_it(tmp_path: Path) -> None:
    """`make test` (the README's command, and CI's) gives pytest the SAM CLI it installed."""
    sam_venv = tmp_path / "sam"
    plan = subprocess.run(
        ["make", "-n", "-B", "test", f"SAM_VENV={sam_venv}"], cwd=ROOT, capture_output=True,
        text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert f"{sam_venv}/bin/python -m pip install --quiet -r infra/requirements-tools.txt" in plan
    (pytest_line,) = [line for line in plan.splitlines() if "-m pytest" in line]
    assert f":{sam_venv}/bin" in pytest_line
    assert "HARDCAP_REQUIRE_SAM=1" in pytest_line


def sam_env(app_dir: Path) -> dict[str, str]:
    """An environment in which sam talks to nothing: no telemetry, no version check, fake
    credentials and region for commands that want them."""
    app_dir.mkdir(parents=True, exist_ok=True)
    # SAM CLI checks PyPI for a newer version once a week: tell it it just did.
    (app_dir / "metadata.json").write_text(
        f'{{"lastVersionCheck": {time.time()}, "telemetryEnabled": false}}'
    )
    return {
        **os.environ,
        "SAM_CLI_TELEMETRY": "0",
        "__SAM_CLI_APP_DIR": str(app_dir),
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.fixture
def sam(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    yield sam_cli(), sam_env(tmp_path / "sam-app")


def test_sam_validate_lint(sam: tuple[str, dict[str, str]]) -> None:
    exe, env = sam
    result = subprocess.run(
        [exe, "validate", "--lint", "--template", str(TEMPLATE)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def with_defaults(tag: str, **defaults: str) -> Path:
    """A copy of the template whose parameters default to ``defaults``, next to the original
    so its relative code paths still resolve (sam validate takes no parameter values)."""
    text = TEMPLATE.read_text()
    for name, value in defaults.items():
        block = re.compile(rf"^(  {name}:\n(?:    .*\n)*?    Default: ).*$", re.MULTILINE)
        quoted = json.dumps(value)
        text, found = block.subn(lambda m, v=quoted: m.group(1) + v, text, count=1)
        assert found == 1, f"no Default line for {name}"
    copy = TEMPLATE.with_name(f".lint-{tag}.yaml")
    copy.write_text(text)
    assert {n: str(load_template(copy)["Parameters"][n]["Default"]) for n in defaults} == defaults
    return copy


# The shapes kept working as they were, and the admin principals' slots filled (and overfilled:
# the guard resource must lint too).
LINTED_SHAPES = {
    "api-gateway-nat": {"FrontDoor": "api-gateway", "Egress": "nat"},
    "function-url-ipv6-iam": {"Egress": "ipv6", "FunctionUrlAuthType": "AWS_IAM"},
    "admins": {
        "AdminPrincipalArns": "arn:aws:iam::123456789012:role/ops,210987654321,"
        "arn:aws:iam::123456789012:user/alice,arn:aws:iam::123456789012:root"
    },
}


@pytest.mark.parametrize("shape", sorted(LINTED_SHAPES))
def test_sam_validate_lint_other_shapes(sam: tuple[str, dict[str, str]], shape: str) -> None:
    exe, env = sam
    copy = with_defaults(shape, **LINTED_SHAPES[shape])
    try:
        result = subprocess.run(
            [exe, "validate", "--lint", "--template", str(copy)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        copy.unlink()


# What SAM makes of the template, by its own translator (samtranslator, installed with the SAM
# CLI; CloudFormation runs the same transform at deploy). Parameters are given as sam deploy
# gives them; the code's location as sam deploy rewrites it (an S3 URI).
_TRANSLATE = """
import json, sys
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

class NoManagedPolicies:
    def load(self):
        return {}

template = yaml_parse(open(sys.argv[1]).read())
for resource in template["Resources"].values():
    if resource["Type"] == "AWS::Serverless::Function":
        resource["Properties"]["CodeUri"] = "s3://bucket/code.zip"
params = dict(arg.split("=", 1) for arg in sys.argv[2:])
print(json.dumps(transform(template, params, NoManagedPolicies())))
"""


def sam_python(exe: str) -> str:
    """The Python the SAM CLI runs on (its venv's, for a pip install): it has samtranslator."""
    first = Path(exe).read_bytes()[:500].split(b"\n", 1)[0]
    if first.startswith(b"#!") and b"python" in first:
        return first[2:].decode().split()[0]
    sibling = Path(exe).parent / "python"
    if sibling.exists():
        return str(sibling)
    pytest.skip(f"{exe} is not a Python entry point: no samtranslator to call")


def sam_translate(sam: tuple[str, dict[str, str]], **params: str) -> dict[str, Any]:
    exe, env = sam
    args = [f"{k}={v}" for k, v in params.items()]
    result = subprocess.run(
        [sam_python(exe), "-c", _TRANSLATE, str(TEMPLATE), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def test_sam_makes_the_alias_every_front_door_invokes(sam: tuple[str, dict[str, str]]) -> None:
    """AutoPublishAlias: live becomes an AWS::Lambda::Version and the AWS::Lambda::Alias
    GatewayFunctionAliaslive; the integrations, the URL and the permissions name that alias.
    And SAM's version id does not follow the parameters (the reason for VersionDescription)."""
    off = sam_translate(sam, SnapStart="off")
    on = sam_translate(sam, SnapStart="on", LambdaAdapterLayerVersion="30")
    for out in (off, on):
        res = out["Resources"]
        alias = res["GatewayFunctionAliaslive"]
        assert alias["Type"] == "AWS::Lambda::Alias" and alias["Properties"]["Name"] == "live"
        (version,) = [n for n, r in res.items() if r["Type"] == "AWS::Lambda::Version"]
        assert alias["Properties"]["FunctionVersion"] == {"Fn::GetAtt": [version, "Version"]}
        assert res[version]["DeletionPolicy"] == "Delete"  # VersionDeletionPolicy
        assert "Fn::Sub" in res[version]["Properties"]["Description"]
        for method in ("GatewayApiProxyMethod", "GatewayApiRootMethod"):
            uri = res[method]["Properties"]["Integration"]["Uri"]["Fn::Sub"]
            assert "/functions/${GatewayFunctionAliaslive}/response-streaming" in uri
        for permission in (
            "GatewayApiInvokePermission", "GatewayUrlPublicInvokeUrl",
            "GatewayUrlPublicInvokeFunction",
        ):  # fmt: skip
            assert res[permission]["Properties"]["FunctionName"] == {
                "Ref": "GatewayFunctionAliaslive"
            }
        assert res["GatewayFunctionUrl"]["Properties"]["Qualifier"] == "live"
        snap = res["GatewayFunction"]["Properties"]["SnapStart"]
        assert snap == {"ApplyOn": {"Fn::If": ["UseSnapStart", "PublishedVersions", "None"]}}
    versions = [
        {n for n, r in out["Resources"].items() if r["Type"] == "AWS::Lambda::Version"}
        for out in (off, on)
    ]
    assert versions[0] == versions[1], "SAM's version id now follows parameters: revisit"


@pytest.mark.parametrize(
    "params",
    [{}, {"FrontDoor": "api-gateway", "Egress": "nat"}],
    ids=["defaults", "api-gateway-nat"],
)
def test_sam_translates_both_urls_as_written(
    sam: tuple[str, dict[str, str]], params: dict[str, str]
) -> None:
    """What CloudFormation's SAM transform makes of the template: the gateway's URL streams from
    the alias, the admin's takes IAM-signed calls only, and the admin function is a plain
    Python function with the gateway's network placement (the Globals' VpcConfig)."""
    res = sam_translate(sam, **params)["Resources"]
    gateway_url = res["GatewayFunctionUrl"]["Properties"]
    assert gateway_url["InvokeMode"] == "RESPONSE_STREAM" and gateway_url["Qualifier"] == "live"
    assert res["AdminFunctionUrl"]["Properties"] == {
        "TargetFunctionArn": {"Ref": "AdminFunction"},
        "AuthType": "AWS_IAM",
        "InvokeMode": "BUFFERED",
    }
    admin = res["AdminFunction"]
    assert admin["Type"] == "AWS::Lambda::Function"
    assert admin["Properties"]["Handler"] == "app.handler"
    assert admin["Properties"]["Runtime"] == "python3.13"
    assert "Layers" not in admin["Properties"]
    gateway = res["GatewayFunction"]["Properties"]
    assert admin["Properties"]["VpcConfig"] == gateway["VpcConfig"]
    assert not [n for n in res if n.startswith("AdminFunctionAlias")]  # $LATEST, no alias


def test_every_parameter_is_in_the_deploy_guide() -> None:
    """docs/deploy.md's Parameters table has a row for each parameter, with its default."""
    section = (ROOT / "docs" / "deploy.md").read_text().split("\n## Parameters\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    for name, spec in load_template()["Parameters"].items():
        default = str(spec.get("Default", ""))
        shown = f"`{default}`" if default else "empty"
        assert f"| `{name}` | {shown} |" in section, name
