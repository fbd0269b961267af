"""Every default is written once: docs/config.md states the schema's, and the gateway's runtime
settings, the meter, the ledger and the providers run with them.

A default a user reads in the docs is the one the gateway applies: each table of
docs/config.md is read as written (a default in backticks is YAML, validated by its field's model
where it is a mapping), and compared with the field of the schema it documents.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
import yaml
from pydantic import BaseModel

from hardcap_core.config import parse_config, schema
from hardcap_core.config.settings import (
    DEFAULT_GATEWAY,
    BreakerSettings,
    EstimatorSettings,
    GatewaySettings,
)
from hardcap_core.config.validation import _issuer
from hardcap_core.config.yaml_strict import StrictLoader
from hardcap_core.gateway.meter import MeterSettings
from hardcap_core.ledger import Ledger
from hardcap_core.providers.anthropic import AnthropicMessages
from hardcap_core.providers.bedrock import BedrockConverse
from hardcap_core.providers.openai_compat import OpenAICompatible

DOCS = Path(__file__).resolve().parents[2] / "docs" / "config.md"

# The heading of each table in docs/config.md and the model whose fields it lists.
TABLES: dict[str, type[BaseModel]] = {
    "## `gateway`": schema.GatewayConfig,
    "### `gateway.breaker` (and `upstreams[].breaker`)": schema.BreakerConfig,
    "## `upstreams`": schema.UpstreamConfig,
    "## `routes`": schema.RouteConfig,
    "### `routes[].estimator`": schema.EstimatorConfig,
    "### `routes[].price`": schema.PriceConfig,
    "### `routes[].price.long_context`": schema.LongContextConfig,
    "### `routes[].image_costs`": schema.ImageCostsConfig,
    "## `orgs`": schema.OrgConfig,
    "## `tenants`": schema.TenantConfig,
    "### `tenants[].users`": schema.UsersConfig,
    "### `tenants[].jwt`": schema.TenantJwtConfig,
    "### `tenants[].keys`": schema.KeyConfig,
    "## `issuers`": schema.IssuerConfig,
    "## Budgets": schema.BudgetConfig,
    "## `rate_limits`": schema.RateLimitConfig,
}
HEADER = ["field", "type / unit", "default", "meaning"]
CODE = re.compile(r"`([^`]*)`")


def cells(line: str) -> list[str]:
    """A Markdown table row's cells (a ``\\|`` inside one is text, not a border)."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def table(heading: str) -> dict[str, str]:
    """Each field of the table under ``heading`` and its default cell, as written."""
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    assert heading in lines, f"docs/config.md has no heading {heading!r}"
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    rows = [cells(line) for line in lines[start:end] if line.startswith("|")]
    assert rows and rows[0] == HEADER, f"{heading}: no table of {HEADER}"
    found: dict[str, str] = {}
    for row in rows[2:]:
        name = CODE.fullmatch(row[0])
        assert name is not None, f"{heading}: a row's field is not one `name`: {row[0]!r}"
        assert name.group(1) not in found, f"{heading}: `{name.group(1)}` twice"
        found[name.group(1)] = row[2]
    return found


def names_a_field(text: str, model: type[BaseModel]) -> bool:
    """Whether ``text`` names a field (of ``model``, or a path from the file's top): such a
    default reads "that field's value", which the schema writes as None."""
    if text in model.model_fields:
        return True
    at: type[BaseModel] | None = schema.ConfigFile
    for part in text.split("."):
        if at is None or part not in at.model_fields:
            return False
        annotation = at.model_fields[part].annotation
        at = (
            annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel)
            else None
        )
    return True


def disagreement(model: type[BaseModel], name: str, cell: str) -> str | None:
    """Why the documented default ``cell`` of ``model.name`` is not the schema's, or None."""
    field = model.model_fields[name]
    if cell == "required":
        return None if field.is_required() else "documented required, has a default"
    if field.is_required():
        return f"required, documented {cell!r}"
    default = field.get_default(call_default_factory=True)
    code = CODE.fullmatch(cell)
    if code is None or names_a_field(code.group(1), model):
        # Words ("none", "the route's", "see below") or another field: a value the gateway
        # works out when the field is unset; or a section whose own table states its fields.
        if default is None or type(default) in TABLES.values():
            return None
        return f"documented {cell!r}, the schema's default is {default!r}"
    # Text as written (YAML would read `off` as false); anything else as YAML reads it.
    written = code.group(1) if isinstance(default, str) else yaml.safe_load(code.group(1))
    if isinstance(default, BaseModel):
        equal = type(default).model_validate(written) == default
    else:
        equal = written == default and isinstance(written, bool) == isinstance(default, bool)
    return None if equal else f"documented {cell}, the schema's default is {default!r}"


@pytest.mark.parametrize("heading", list(TABLES))
def test_each_table_documents_every_field_of_its_model_and_nothing_else(heading: str) -> None:
    assert sorted(table(heading)) == sorted(TABLES[heading].model_fields)


@pytest.mark.parametrize("heading", list(TABLES))
def test_each_documented_default_is_the_schemas(heading: str) -> None:
    model = TABLES[heading]
    wrong = {
        name: why
        for name, cell in table(heading).items()
        if (why := disagreement(model, name, cell)) is not None
    }
    assert wrong == {}


def test_every_model_of_the_schema_has_its_table() -> None:
    models = [
        m
        for m in vars(schema).values()
        if isinstance(m, type) and issubclass(m, schema._Model) and m is not schema._Model
    ]
    bases = {base for m in models for base in m.__mro__[1:]}
    untabled = {m.__name__ for m in models if m not in TABLES.values() and m not in bases}
    assert untabled == {"ConfigFile"}  # the file itself: a section per field, below
    assert set(PLACES) == set(TABLES.values())
    text = DOCS.read_text(encoding="utf-8")
    assert [s for s in schema.ConfigFile.model_fields if f"\n## `{s}`\n" not in text] == []


def test_a_wrong_default_in_the_docs_is_caught() -> None:
    """The comparison itself: a number, a word, a mapping or a list that differs is reported."""
    assert disagreement(schema.GatewayConfig, "reservation_ttl_seconds", "`120`") is None
    assert disagreement(schema.GatewayConfig, "reservation_ttl_seconds", "`60`") is not None
    assert disagreement(schema.GatewayConfig, "log_prompts", "`0`") is not None
    assert disagreement(schema.RouteConfig, "estimator", "`{kind: max_tokens}`") is None
    assert disagreement(schema.RouteConfig, "estimator", "`{kind: p95}`") is not None
    assert disagreement(schema.BudgetConfig, "notify_at", "`[50, 80]`") is not None
    assert disagreement(schema.RouteConfig, "policy", "none") is not None
    assert disagreement(schema.RouteConfig, "upstream", "`x`") is not None


# One of each model, with only its required fields, none in a list a default empties; PLACES
# says where each one sits.
FILE = f"""
gateway: {{breaker: {{}}}}
upstreams: [{{name: u, base_url: "https://u.example/v1"}}]
routes:
  - name: r
    upstream: u
    estimator: {{}}
    price:
      input_per_million: 1
      output_per_million: 1
      long_context: {{above_input_tokens: 10, input_multiplier: 2, output_multiplier: 2}}
  - {{name: v, upstream: u, image_rule: tile, image_costs: {{base_tokens: 85}}}}
issuers: [{{name: i, issuer: "https://i.example", jwks_url: "https://i.example/k", audiences: [a]}}]
orgs:
  - id: o
  - {{id: p, budgets: [{{dimension: total_tokens, limit: 1, window: day}}], rate_limits: {{}}}}
tenants:
  - {{id: t, users: {{}}, jwt: {{issuer: i, groups: [g]}}}}
  - {{id: u, keys: [{{id: k, hash: "sha256:{"0" * 64}"}}]}}
"""
PLACES: dict[type[BaseModel], tuple[str | int, ...]] = {
    schema.GatewayConfig: ("gateway",),
    schema.BreakerConfig: ("gateway", "breaker"),
    schema.UpstreamConfig: ("upstreams", 0),
    schema.RouteConfig: ("routes", 0),
    schema.EstimatorConfig: ("routes", 0, "estimator"),
    schema.PriceConfig: ("routes", 0, "price"),
    schema.LongContextConfig: ("routes", 0, "price", "long_context"),
    schema.ImageCostsConfig: ("routes", 1, "image_costs"),
    schema.OrgConfig: ("orgs", 0),
    schema.TenantConfig: ("tenants", 0),
    schema.UsersConfig: ("tenants", 0, "users"),
    schema.TenantJwtConfig: ("tenants", 0, "jwt"),
    schema.KeyConfig: ("tenants", 1, "keys", 0),
    schema.IssuerConfig: ("issuers", 0),
    schema.BudgetConfig: ("orgs", 1, "budgets", 0),
    schema.RateLimitConfig: ("orgs", 1, "rate_limits"),
}


def written_defaults() -> list[tuple[type[BaseModel], str, str]]:
    """Each default the docs give as a value to write: (model, field, text)."""
    return [
        (model, name, code.group(1))
        for heading, model in TABLES.items()
        for name, cell in table(heading).items()
        if (code := CODE.fullmatch(cell)) is not None and not names_a_field(code.group(1), model)
    ]


@pytest.mark.parametrize(
    ("model", "name", "text"),
    written_defaults(),
    ids=[f"{m.__name__}.{n}" for m, n, _ in written_defaults()],
)
def test_writing_a_documented_default_in_the_file_changes_nothing(
    model: type[BaseModel], name: str, text: str
) -> None:
    """A user who copies a default from the docs into the file gets what leaving it out gives
    (`end_users: off` once failed: YAML reads `off` as false)."""
    base = yaml.load(FILE, Loader=StrictLoader)
    data = yaml.load(FILE, Loader=StrictLoader)
    at = data
    for step in PLACES[model]:
        at = at[step]
    at.update(yaml.load(f"{name}: {text}", Loader=StrictLoader))
    assert schema.ConfigFile.model_validate(data) == schema.ConfigFile.model_validate(base)


def test_runtime_settings_are_the_schemas_defaults() -> None:
    """What the gateway runs with when the file leaves a field out, section by section."""
    assert schema.GatewayConfig().settings() == GatewaySettings() == DEFAULT_GATEWAY
    assert schema.BreakerConfig().settings() == BreakerSettings() == DEFAULT_GATEWAY.breaker
    assert schema.EstimatorConfig().settings() == EstimatorSettings()
    config = schema.IssuerConfig(
        name="sso", issuer="https://id", jwks_url="https://id/k", audiences=["a"]
    )
    issuer = _issuer(0, config)
    for name, field in schema.IssuerConfig.model_fields.items():
        if not field.is_required():
            want = field.default
            got = getattr(issuer, name)
            assert (list(got) if isinstance(got, tuple) else got) == want, name


def test_the_meter_runs_with_the_configs_settings() -> None:
    """The meter's defaults are the config's; a file that sets the fields steers it."""
    unset = parse_config({}, environ={}).gateway
    assert MeterSettings() == MeterSettings.of(unset) == MeterSettings.of(DEFAULT_GATEWAY)
    gateway = schema.GatewayConfig()
    assert MeterSettings().ttl_s == gateway.reservation_ttl_seconds
    assert MeterSettings().guard_s == gateway.truncate_guard_ms / 1000
    assert (MeterSettings().step, MeterSettings().within, MeterSettings().guard) == (
        gateway.extend_step_tokens,
        gateway.extend_when_within,
        gateway.truncate_guard_tokens,
    )
    fields = {
        "reservation_ttl_seconds": 30,
        "extend_step_tokens": 8,
        "extend_when_within": 2,
        "truncate_guard_tokens": 1,
        "truncate_guard_ms": 20,
    }
    set_ = MeterSettings.of(parse_config({"gateway": fields}, environ={}).gateway)
    assert dataclasses.astuple(set_) == (8, 2, 1, 0.02, 10.0, 30.0)


def test_the_ledger_and_providers_default_to_the_schemas_values() -> None:
    """A ledger built without a config (the rollup's, the admin's) holds a reservation as long
    as the gateway's does; a provider built without one counts output as the gateway does."""
    ttl = schema.GatewayConfig().reservation_ttl_seconds
    assert Ledger(redis.asyncio.Redis()).ttl_ms == int(ttl * 1000)  # no I/O until a call
    cpt = schema.GatewayConfig().chars_per_token
    defaults: dict[str, Any] = {
        cls.__name__: inspect.signature(cls).parameters["chars_per_token"].default
        for cls in (OpenAICompatible, AnthropicMessages, BedrockConverse)
    }
    assert defaults == dict.fromkeys(defaults, cpt)
