"""The YAML config: every error names its field, the examples load, scopes and secrets resolve."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hardcap_core.auth import hash_key
from hardcap_core.budgets import NANO_USD_PER_USD, Dimension, Level, LevelKind, Prices, Window
from hardcap_core.config import Config, load_config, parse_config
from hardcap_core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DEMO_CONFIG = ROOT / "hardcap_core" / "local" / "demo.yaml"
KEY_A, KEY_B = "sk-test-a", "sk-test-b"


def base() -> dict[str, Any]:
    """A small valid config that each bad case breaks in one place."""
    return {
        "upstreams": [{"name": "openai", "base_url": "https://api.openai.com/v1"}],
        "routes": [
            {
                "name": "gpt-4o-mini",
                "upstream": "openai",
                "price": {"input_per_million": 0.15, "output_per_million": 0.6},
            }
        ],
        "orgs": [{"id": "acme"}],
        "tenants": [
            {
                "id": "alpha",
                "org": "acme",
                "budgets": [{"dimension": "total_tokens", "limit": 1000, "window": "day"}],
                "keys": [{"id": "alpha-1", "hash": hash_key(KEY_A)}],
            },
            {
                "id": "beta",
                "budgets": [{"dimension": "cost_usd", "limit": 5, "window": "month"}],
                "keys": [{"id": "beta-1", "hash": hash_key(KEY_B)}],
            },
        ],
    }


def parse(data: dict[str, Any]) -> Config:
    return parse_config(data, "test.yaml", environ={})


def setter(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set ``path`` (like ``routes.0.policy``), append at a list's end, or with DELETE remove it."""

    def apply(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = data
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        key: Any = int(last) if last.isdigit() else last
        if value is DELETE:
            del node[key]
        elif isinstance(node, list) and key == len(node):
            node.append(value)
        else:
            node[key] = value

    return apply


class _Delete:
    """The value that deletes a field (a stable repr: the tests' ids must match across workers)."""

    def __repr__(self) -> str:
        return "DELETE"


DELETE = _Delete()
WINDOW_HELP = "window '7x': use day, month, or a length like 3600s, 60m, 24h, 7d"

BAD: list[tuple[str, Any, str]] = [
    ("tenants.1.budgets.0.window", "7x", f"tenants[1].budgets[0].window: {WINDOW_HELP}"),
    ("tenants.0.budgets.0.window", 3600, "tenants[0].budgets[0].window: window '3600'"),
    ("tenants.0.budgets.0.dimension", "tokens", "tenants[0].budgets[0].dimension: Input should"),
    ("tenants.0.budgets.0.limit", -1, "tenants[0].budgets[0].limit: Input should be greater"),
    ("tenants.0.budgets.0.limit", 1.5, "tenants[0].budgets[0].limit: a token limit is a whole"),
    ("tenants.1.budgets.0.limit", 1e7, "tenants[1].budgets[0].limit: at most 9007199 USD"),
    ("tenants.0.budgets.0.limit", 2**54, "tenants[0].budgets[0].limit: at most"),
    ("tenants.0.budgets.0.window", DELETE, "tenants[0].budgets[0].window: required"),
    ("tenants.0.id", "bad id!", "tenants[0].id: String should match pattern"),
    ("tenants.0.fail_mode", "maybe", "tenants[0].fail_mode: Input should be 'closed' or 'open'"),
    ("tenants.0.org", "acmee", "tenants[0].org: no org named 'acmee' (did you mean 'acme'?)"),
    ("tenants.0.routes", ["gpt-4o"], "tenants[0].routes[0]: no route named 'gpt-4o'"),
    ("tenants.1.id", "alpha", "tenants[1].id: duplicate tenant id 'alpha' (also at tenants[0])"),
    ("tenants.1.keys.0.id", "alpha-1", "tenants[1].keys[0].id: duplicate key id 'alpha-1'"),
    ("tenants.1.keys.0.hash", hash_key(KEY_A), "tenants[1].keys[0].hash: duplicate key hash"),
    ("tenants.0.keys.0.hash", "sha256:abc", "tenants[0].keys[0].hash: expected sha256: and 64"),
    ("tenants.0.keys.0.hash", "hc_plaintext", "tenants[0].keys[0].hash: store the key's hash"),
    (
        "tenants.0.keys.0.budgets",
        [{"dimension": "cost_usd", "limit": 1, "window": "9"}],
        "tenants[0].keys[0].budgets[0].window: window '9'",
    ),
    (
        "tenants.0.rate_limits",
        {"requests_per_minute": 0},
        "tenants[0].rate_limits.requests_per_minute: Input should be greater than 0",
    ),
    ("tenants.0.rate_limits", {"rpm": 5}, "tenants[0].rate_limits.rpm: unknown field"),
    (
        "tenants.0.budgets.1",
        {"dimension": "total_tokens", "limit": 5, "window": "DAY"},
        "tenants[0].budgets[1]: same dimension and window as budgets[0]",
    ),
    (
        "orgs.0.budgets",
        [{"dimension": "input_tokens", "limit": 1, "window": "1w"}],
        "orgs[0].budgets[0].window: window '1w'",
    ),
    ("orgs.0.id", "acme/x", "orgs[0].id: String should match pattern"),
    ("routes.0.upstream", "opena", "routes[0].upstream: no upstream named 'opena' (did you mean"),
    ("routes.0.upstream", DELETE, "routes[0].upstream: required"),
    ("routes.0.polcy", "allow", "routes[0].polcy: unknown field (did you mean 'policy'?)"),
    ("routes.0.policy", "cut", "routes[0].policy: Input should be 'truncate', 'allow' or"),
    ("routes.0.name", "gpt 4o", "routes[0].name: String should match pattern"),
    ("routes.0.estimator", {"kind": "p99"}, "routes[0].estimator.kind: Input should be"),
    ("routes.0.estimator", {"kind": "fixed"}, "routes[0].estimator: kind 'fixed' needs fixed_"),
    ("routes.0.estimator", {"kind": "p95", "fixed_tokens": 5}, "routes[0].estimator: fixed_tok"),
    (
        "routes.0.estimator",
        {"kind": "p95", "min_samples": 0},
        "routes[0].estimator.min_samples: Input should be greater than 0",
    ),
    ("routes.0.price", DELETE, "routes[0].price: required because tenants[1].budgets[0] is a"),
    (
        "routes.0.price",
        {"input_per_million": -1, "output_per_million": 0},
        "routes[0].price.input_per_million: Input should be greater than or equal to 0",
    ),
    ("routes.0.price", {"input_per_million": 1}, "routes[0].price.output_per_million: required"),
    ("routes.0.max_output_tokens", 0, "routes[0].max_output_tokens: Input should be greater"),
    (
        "routes.0.min_output_reservation",
        5000,
        "routes[0]: min_output_reservation (5000) is more than max_output_tokens (4096)",
    ),
    (
        "routes.1",
        {
            "name": "gpt-4o-mini",
            "upstream": "openai",
            "price": {"input_per_million": 0, "output_per_million": 0},
        },
        "routes[1].name: duplicate route name 'gpt-4o-mini' (also at routes[0])",
    ),
    ("upstreams.0.base_url", "ftp://x", "upstreams[0].base_url: 'ftp://x' is not an http(s) URL"),
    ("upstreams.0.timeout_seconds", 0, "upstreams[0].timeout_seconds: Input should be greater"),
    ("upstreams.0.api_key", "x", "upstreams[0].api_key: unknown field (did you mean"),
    ("upstreams.0.api_key_env", "sk-proj-SECRET", "upstreams[0].api_key_env: the name of an"),
    (
        "upstreams.1",
        {"name": "openai", "base_url": "http://x"},
        "upstreams[1].name: duplicate upstream name 'openai'",
    ),
    ("upstreams.0.api_key_secret", "", "upstreams[0].api_key_secret: String should have at"),
    ("gateway.redis_ur", "redis://x", "gateway.redis_ur: unknown field (did you mean 'redis_url'"),
    ("gateway.redis_url", "http://:pw@h", "gateway.redis_url: scheme 'http': use redis://"),
    ("gateway.max_body_bytes", 0, "gateway.max_body_bytes: Input should be greater than 0"),
    ("gateway.chars_per_token", "many", "gateway.chars_per_token: Input should be a valid number"),
    ("gateway.log_prompts", "maybe", "gateway.log_prompts: Input should be a valid boolean"),
    ("tenants", {"id": "x"}, "tenants: Input should be a valid list"),
    ("team", [], "team: unknown field"),
]


@pytest.mark.parametrize(("path", "value", "expected"), BAD, ids=[f"{p}={v!r}" for p, v, _ in BAD])
def test_every_error_names_its_field(path: str, value: Any, expected: str) -> None:
    data = base()
    setter(path, value)(data)
    with pytest.raises(ConfigError) as info:
        parse(data)
    assert expected in str(info.value)
    assert str(info.value).startswith("invalid config test.yaml:")


def test_two_key_sources_are_refused() -> None:
    data = base()
    data["upstreams"][0].update(api_key_env="OPENAI_API_KEY", api_key_secret="hardcap/openai")
    with pytest.raises(ConfigError, match=r"upstreams\[0\]: set at most one of api_key_env"):
        parse(data)


def test_all_field_errors_are_reported_at_once() -> None:
    data = base()
    data["routes"][0]["policy"] = "cut"
    data["tenants"][1]["budgets"][0]["window"] = "7x"
    with pytest.raises(ConfigError) as info:
        parse(data)
    message = str(info.value)
    assert "routes[0].policy" in message
    assert "tenants[1].budgets[0].window" in message


def test_errors_never_repeat_secret_looking_values() -> None:
    data = base()
    data["upstreams"][0]["api_key_env"] = "sk-proj-SECRET"
    data["tenants"][0]["keys"][0]["hash"] = "sk-alpha-SECRET"
    data["gateway"] = {"redis_url": "http://:SECRET@cache:6379"}
    with pytest.raises(ConfigError) as info:
        parse(data)
    message = str(info.value)
    assert "SECRET" not in message
    assert message.count("\n") == 3  # the header and one line per field


def test_base_config_builds() -> None:
    config = parse(base())
    route = config.routes["gpt-4o-mini"]
    assert route.model == "gpt-4o-mini"  # defaults to the public name
    assert route.upstream is config.upstreams["openai"]
    # An OpenAI-compatible API bills no cache writes: a write costs what input does.
    assert route.prices == Prices(150, 600, cache_write_nusd=150)
    assert (route.policy, route.estimator.kind) == ("truncate", "max_tokens")
    assert (route.max_output_tokens, route.min_output_reservation) == (4096, 16)
    assert config.upstreams["openai"].timeout_seconds == config.gateway.upstream_timeout_seconds
    assert config.upstreams["openai"].api_key() is None


def test_cost_limits_are_nano_usd_rounded_down() -> None:
    data = base()
    data["tenants"][1]["budgets"] = [
        {"dimension": "cost_usd", "limit": 0.29, "window": "day"},  # 0.29 * 1e9 is 289999999.99...
        {"dimension": "cost_usd", "limit": 1.0000000019, "window": "month"},
        {"dimension": "cost_usd", "limit": 1e-10, "window": "1h"},
    ]
    scope = parse(data).tenant_scope("beta")
    assert [b.limit for b in scope.budgets] == [290_000_000, 1_000_000_001, 0]


def test_token_limits_accept_yaml_spellings(tmp_path: Path) -> None:
    text = (DEMO_CONFIG).read_text().replace("limit: 20000,", "limit: 20_000.0,")
    (tmp_path / "c.yaml").write_text(text)
    budgets = load_config(tmp_path / "c.yaml").tenant_scope("alpha").budgets
    assert budgets[0].limit == 20_000


def test_local_example(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARDCAP_REDIS_URL", raising=False)
    monkeypatch.delenv("HARDCAP_REDIS_CLUSTER", raising=False)
    config = load_config(DEMO_CONFIG)
    assert config.gateway.redis_url is None
    assert list(config.routes) == ["demo", "demo-reason", "demo-allow"]
    assert config.routes["demo"].model == "mock-small"
    assert config.routes["demo"].estimator.kind == "p95"
    assert config.routes["demo-reason"].model == "mock-reason"
    assert config.routes["demo-allow"].policy == "allow"
    assert config.upstreams["mock"].base_url == "http://127.0.0.1:9001/v1"
    assert config.upstreams["mock"].api_key() is None

    alpha = config.authenticate("sk-alpha-demo")
    assert alpha is not None
    assert (alpha.key_id, alpha.tenant_id, alpha.org_id, alpha.fail_mode) == (
        "alpha-dev",
        "alpha",
        "acme",
        "closed",
    )
    assert alpha.allowed_routes is None
    assert alpha.allows("demo-allow")
    key, tenant, org = (
        Level(LevelKind.KEY, "alpha-dev"),
        Level(LevelKind.TENANT, "alpha"),
        Level(LevelKind.ORG, "acme"),
    )
    assert alpha.scope.levels == (key, tenant, org)
    assert alpha.scope.root == org
    assert [(b.level, b.dimension, b.limit, b.window) for b in alpha.scope.budgets] == [
        (tenant, Dimension.TOTAL_TOKENS, 20_000, Window("day")),
        (tenant, Dimension.COST_USD, 1 * NANO_USD_PER_USD, Window("month")),
        (org, Dimension.TOTAL_TOKENS, 100_000, Window("day")),
    ]
    assert [
        (r.level, r.requests_per_minute, r.tokens_per_minute) for r in alpha.scope.rate_limits
    ] == [
        (tenant, 600, 200_000),
        (org, 1200, None),
    ]

    ci = config.authenticate("sk-alpha-ci-demo")
    assert ci is not None
    assert ci.scope.budgets[0].level == Level(LevelKind.KEY, "alpha-ci")
    assert ci.scope.budgets[0].window == Window("fixed", 3600)

    beta = config.authenticate("sk-beta-demo")
    assert beta is not None
    assert beta.allowed_routes == frozenset({"demo", "demo-reason"})
    assert not beta.allows("demo-allow")

    gamma = config.authenticate("sk-gamma-demo")
    assert gamma is not None
    assert (gamma.org_id, gamma.fail_mode) == (None, "open")
    assert gamma.scope.levels == (
        Level(LevelKind.KEY, "gamma-dev"),
        Level(LevelKind.TENANT, "gamma"),
    )

    assert config.tenant_scope("alpha").levels == (tenant, org)
    assert config.tenant_scope("alpha").budgets == alpha.scope.budgets  # alpha-dev has none
    assert config.tenant_scope("alpha") is config.tenant_scope("alpha")  # built once
    assert config.authenticate("sk-alpha-demo") is alpha


def test_real_provider_example(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARDCAP_REDIS_URL", raising=False)
    monkeypatch.delenv("HARDCAP_REDIS_CLUSTER", raising=False)
    config = load_config(EXAMPLES / "config.yaml")
    assert config.gateway.redis_cluster is True
    sources = {
        n: u.key_source and (u.key_source.kind, u.key_source.name)
        for n, u in config.upstreams.items()
    }
    assert sources == {
        "openai": ("secret", "hardcap/openai"),
        "anthropic": ("parameter", "/hardcap/anthropic"),
        "groq": ("env", "GROQ_API_KEY"),
    }
    assert config.upstreams["anthropic"].timeout_seconds == 600
    assert config.routes["claude-sonnet"].model == "claude-sonnet-4-0"
    assert config.routes["claude-sonnet"].estimator.fixed_tokens == 1024
    assert config.routes["gpt-4o"].prices == Prices(2500, 10_000, cache_write_nusd=2500)
    scope = config.tenant_scope("acme-web")
    assert [(b.dimension, b.limit) for b in scope.budgets] == [
        (Dimension.TOTAL_TOKENS, 2_000_000),
        (Dimension.COST_USD, 50 * NANO_USD_PER_USD),
        (Dimension.COST_USD, 500 * NANO_USD_PER_USD),
    ]
    research = config.tenant_scope("research")
    assert research.levels == (Level(LevelKind.TENANT, "research"),)
    text = (EXAMPLES / "config.yaml").read_text()
    assert "sk-" not in text  # no plaintext keys
    assert "hc_" not in text


def test_example_keys_have_scopes_with_all_levels() -> None:
    config = load_config(EXAMPLES / "config.yaml")
    principals = {p.key_id: p for p in config.keys.principals()}
    ci = principals["acme-web-ci"]
    assert [lvl.kind for lvl in ci.scope.levels] == [LevelKind.KEY, LevelKind.TENANT, LevelKind.ORG]
    assert ci.scope.budgets[0].limit == 2 * NANO_USD_PER_USD
    assert ci.scope.budgets[0].level.kind == LevelKind.KEY
    assert [r.requests_per_minute for r in ci.scope.rate_limits] == [60, 600, 6000]


def test_env_overrides_redis_settings() -> None:
    env = {"HARDCAP_REDIS_URL": "rediss://cache:6379", "HARDCAP_REDIS_CLUSTER": "TRUE"}
    gateway = parse_config(base(), environ=env).gateway
    assert (gateway.redis_url, gateway.redis_cluster) == ("rediss://cache:6379", True)
    data = base()
    data["gateway"] = {"redis_url": "redis://file:6379", "redis_cluster": True}
    gateway = parse_config(data, environ={"HARDCAP_REDIS_CLUSTER": "false"}).gateway
    assert (gateway.redis_url, gateway.redis_cluster) == ("redis://file:6379", False)
    with pytest.raises(ConfigError, match="HARDCAP_REDIS_CLUSTER='sometimes'"):
        parse_config(base(), environ={"HARDCAP_REDIS_CLUSTER": "sometimes"})
    with pytest.raises(ConfigError, match="HARDCAP_REDIS_URL: scheme 'http'") as info:
        parse_config(base(), environ={"HARDCAP_REDIS_URL": "http://:SECRET@h"})
    assert "SECRET" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "the file is empty"),
        ("- 1\n- 2\n", "the top level must be a mapping"),
        ("tenants: [\n", "invalid YAML in"),
        ("tenants:\n  - id: a\n    budgets: []\n    budgets: []\n", "duplicate key 'budgets'"),
    ],
)
def test_file_level_errors(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=expected):
        load_config(path)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.yaml")


def test_yaml_merge_keys_still_work(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "upstreams: [{name: u, base_url: 'http://x'}]\n"
        "routes: [{name: a, upstream: u, policy: allow}, {<<: {upstream: u}, name: b}]\n"
    )
    assert load_config(path).routes["b"].upstream.name == "u"


# --- upstream API keys ------------------------------------------------------------------------


def with_key_source(**source: str) -> Config:
    data = base()
    data["upstreams"][0].update(source)
    return parse(data)


def test_api_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    config = with_key_source(api_key_env="HARDCAP_TEST_OPENAI_KEY")
    monkeypatch.setenv("HARDCAP_TEST_OPENAI_KEY", "sk-from-env\n")
    assert config.upstreams["openai"].api_key() == "sk-from-env"


def test_missing_env_var_names_the_upstream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARDCAP_TEST_OPENAI_KEY", raising=False)
    upstream = with_key_source(api_key_env="HARDCAP_TEST_OPENAI_KEY").upstreams["openai"]
    with pytest.raises(ConfigError, match="upstream 'openai': environment variable HARDCAP_TEST"):
        upstream.api_key()
    monkeypatch.setenv("HARDCAP_TEST_OPENAI_KEY", "  ")
    with pytest.raises(ConfigError, match="upstream 'openai'"):
        upstream.api_key()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from aws_lambda_powertools.utilities import parameters
    from moto import mock_aws

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("POWERTOOLS_PARAMETERS_MAX_AGE", raising=False)
    # Powertools keeps its clients and cached values per process: start each test clean.
    parameters.clear_caches()
    with mock_aws():
        yield
    parameters.clear_caches()


@pytest.mark.usefixtures("aws")
def test_api_key_from_secrets_manager_is_cached() -> None:
    import boto3

    client = boto3.client("secretsmanager")
    arn = client.create_secret(Name="hardcap/openai", SecretString="sk-from-secret")["ARN"]
    by_name = with_key_source(api_key_secret="hardcap/openai").upstreams["openai"]
    by_arn = with_key_source(api_key_secret=arn).upstreams["openai"]
    assert by_name.api_key() == "sk-from-secret"
    assert by_arn.api_key() == "sk-from-secret"
    client.put_secret_value(SecretId="hardcap/openai", SecretString="sk-rotated")
    assert by_name.api_key() == "sk-from-secret"  # cached for max_age, not fetched per request


@pytest.mark.usefixtures("aws")
def test_api_key_from_ssm_secure_string() -> None:
    import boto3

    boto3.client("ssm").put_parameter(
        Name="/hardcap/anthropic", Value="sk-ant-from-ssm", Type="SecureString"
    )
    upstream = with_key_source(api_key_parameter="/hardcap/anthropic").upstreams["openai"]
    assert upstream.api_key() == "sk-ant-from-ssm"


@pytest.mark.usefixtures("aws")
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            {"api_key_secret": "nope"},
            "upstream 'openai': cannot read api_key_secret 'nope' from AWS",
        ),
        (
            {"api_key_parameter": "/nope"},
            "upstream 'openai': cannot read api_key_parameter '/nope'",
        ),
    ],
)
def test_missing_aws_value_names_the_upstream(source: dict[str, str], expected: str) -> None:
    upstream = with_key_source(**source).upstreams["openai"]
    with pytest.raises(ConfigError, match=expected):
        upstream.api_key()


def test_loading_without_aws_keys_does_not_import_boto3() -> None:
    code = (
        "import sys, json; from hardcap_core.config import load_config;"
        f"c = load_config({str(DEMO_CONFIG)!r}); c.authenticate('sk-alpha-demo');"
        "c.upstreams['mock'].api_key();"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('boto3', 'botocore', 'aws_lambda_powertools'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_docs_describe_every_field() -> None:
    from pydantic import BaseModel

    from hardcap_core.config import schema as module

    docs = (ROOT / "docs" / "config.md").read_text()
    models = [m for m in vars(module).values() if isinstance(m, type) and issubclass(m, BaseModel)]
    fields = {
        name
        for m in models
        if m.__module__ == module.__name__ and m is not module.ConfigFile
        for name in m.model_fields
    }
    assert len(fields) > 30
    assert sorted(name for name in fields if f"| `{name}` |" not in docs) == []
    sections = module.ConfigFile.model_fields
    assert [name for name in sections if f"## `{name}`" not in docs] == []
