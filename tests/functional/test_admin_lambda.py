"""The admin function's handler (``functions/admin/app.py``) on the sample function URL events in
``events/``: moto's DynamoDB for the config and usage tables, a real Valkey for publishing.

The module is loaded as Lambda loads it, once, in one worker thread (Mangum drives that
thread's event loop, the one the cache client stays bound to between invocations). The caller
is the IAM principal in the event; an event without one (a URL without IAM auth) is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import pytest
import redis
import yaml
from moto import mock_aws

from hardcap_core.control.store import ConfigStore
from hardcap_core.local.valkey import LocalValkey
from hardcap_core.rollup.table import create_table
from tests.lambda_handler import ROOT, lambda_handler, load_event
from tests.stack import config_data

HANDLER = ROOT / "functions" / "admin" / "app.py"
CALLER = "arn:aws:sts::123456789012:assumed-role/HardcapOperators/alice"

Invoke = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass
class Context:
    """What Mangum reads of a Lambda context."""

    aws_request_id: str = "9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c6d"
    function_name: str = "hardcap-admin"
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:hardcap-admin"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


@dataclass
class Loaded:
    module: ModuleType
    invoke: Invoke
    store: ConfigStore
    cache: redis.Redis


@pytest.fixture
def loaded(
    valkey: LocalValkey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Loaded]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config_data("http://127.0.0.1:9", valkey.url)))
    cache = redis.Redis.from_url(valkey.url)
    cache.flushall()
    for name, value in {
        "HARDCAP_CONFIG": str(path),
        "HARDCAP_CONFIG_TABLE": "hardcap-config",
        "HARDCAP_USAGE_TABLE": "hardcap-usage",
        "HARDCAP_REDIS_URL": valkey.url,
        "HARDCAP_REDIS_CLUSTER": "false",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_DYNAMODB", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        store = ConfigStore("hardcap-config", client)
        store.create_table()
        create_table(client, "hardcap-usage")
        with lambda_handler(HANDLER, "hardcap_admin_under_test", Context) as handler:
            yield Loaded(handler.module, handler.invoke, store, cache)
            handler.run(handler.module.close)
    cache.close()


def body(reply: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(reply["body"])
    return data


def test_iam_caller_creates_a_tenant(loaded: Loaded) -> None:
    reply = loaded.invoke(load_event("admin-create-tenant"))
    assert reply["statusCode"] == 201, reply["body"]
    created = body(reply)
    assert created["tenant"]["id"] == "gamma"
    state = loaded.store.load()
    assert state.version == created["version"] and "gamma" in state.tenants
    assert {"alpha", "beta", "open"} <= set(state.tenants)  # the file's, imported first
    # The audit names the IAM principal that signed the request.
    (change,) = [e for e in loaded.store.audit() if e.action == "tenant.create"]
    assert change.who == CALLER and change.target == "gamma"
    # Gateways serving org acme (gamma's) learn of the version from the cache.
    assert int(loaded.cache.get("hc:{o:acme}:cfgv") or 0) == created["version"]

    listed = loaded.invoke(load_event("admin-list-keys"))
    assert listed["statusCode"] == 200, listed["body"]
    assert body(listed)["keys"] == []


def test_an_event_without_an_iam_principal_is_refused(loaded: Loaded) -> None:
    reply = loaded.invoke(load_event("admin-no-iam"))
    assert reply["statusCode"] == 403
    assert body(reply)["error"]["code"] == "iam_required"
    assert loaded.store.version() == 0 and loaded.store.audit() == []
    # Not a principal the handler would accept either: an ARN-less or malformed one.
    event = load_event("admin-create-tenant")
    event["requestContext"]["authorizer"]["iam"]["userArn"] = ""
    assert loaded.invoke(event)["statusCode"] == 403
    assert loaded.store.version() == 0


def test_a_bad_change_is_a_400_naming_the_field(loaded: Loaded) -> None:
    event = load_event("admin-create-tenant")
    event["body"] = json.dumps({"id": "delta", "routes": ["gpt-nope"]})
    reply = loaded.invoke(event)
    assert reply["statusCode"] == 400
    assert body(reply)["error"]["param"] == "tenants[delta].routes[0]"
    assert loaded.store.version() == 0
