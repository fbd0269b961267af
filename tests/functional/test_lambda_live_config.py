"""The live config through the Lambda entry point (``functions/gateway/buffered.py``): a warm
execution environment, built once at init, serves a key the admin made after it started, sees a
lowered budget on its next request and refuses a revoked key — no new environment needed.

The handler is loaded as Lambda loads it (tests/functional/test_lambda_events.py), with a config
table in moto's DynamoDB and a real Valkey; the admin service runs in this process as the admin
function would, publishing each change's version to the cache.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hardcap_core.control.store import ConfigStore
from hardcap_core.local.admin_serve import admin_caller
from hardcap_core.local.aws import LocalAws
from hardcap_core.local.valkey import LocalValkey
from tests.functional.test_lambda_events import body_of, gateway_handler
from tests.functional.test_lambda_events import mock as mock
from tests.lambda_handler import demo_config, load_event
from tests.stack import Mock

WHO = "arn:aws:iam::123456789012:user/operator"


@pytest.fixture(scope="module")
def lambda_env(
    valkey: LocalValkey, mock: Mock, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[..., Any]]]:
    """An invoke of the warm handler, and an admin call runner."""
    path, config = demo_config(tmp_path_factory.mktemp("lambda-live"), mock.url)
    with (
        LocalAws(table="lambda-usage", config_table="lambda-config") as aws,
        gateway_handler(valkey, path, "live") as handler,
    ):
        yield (
            handler.invoke,
            admin_caller(valkey.url, ConfigStore(aws.config_table, aws.client()), config),
        )


def with_key(event: dict[str, Any], key: str) -> dict[str, Any]:
    event["headers"]["authorization"] = f"Bearer {key}"
    return event


def test_a_warm_environment_follows_the_admins_changes(
    lambda_env: tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[..., Any]],
) -> None:
    invoke, admin = lambda_env
    first = invoke(load_event("function-url-chat"))  # the environment is warm from here on
    assert first["statusCode"] == 200, body_of(first)
    made = admin(lambda a: a.create_key(WHO, {"tenant": "alpha", "id": "alpha-lambda"}))
    served = invoke(with_key(load_event("function-url-chat"), made["key"]))
    assert served["statusCode"] == 200, body_of(served)
    admin(lambda a: a.set_budget(WHO, {
        "level": "tenant", "id": "alpha", "dimension": "total_tokens", "window": "day",
        "limit": 1,
    }))  # fmt: skip
    refused = invoke(with_key(load_event("function-url-chat"), made["key"]))
    assert refused["statusCode"] == 429, body_of(refused)
    admin(lambda a: a.revoke_key(WHO, "alpha-lambda"))
    revoked = invoke(with_key(load_event("function-url-chat"), made["key"]))
    assert revoked["statusCode"] == 401, body_of(revoked)
    audit = admin(lambda a: a.audit())
    assert json.dumps(audit).count(WHO) >= 3  # every change names who made it
