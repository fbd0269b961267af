"""The live config through the Lambda entry point (``functions/gateway/buffered.py``): a warm
execution environment, built once at init, serves a key the admin made after it started, sees a
lowered budget on its next request and refuses a revoked key — no new environment needed.

The handler is loaded as Lambda loads it (tests/functional/test_lambda_events.py), with a config
table in moto's DynamoDB and a real Valkey; the admin service runs in this process as the admin
function would, publishing each change's version to the cache.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import pytest
import redis
import yaml

from hardcap_core.control.store import ConfigStore
from hardcap_core.local.admin_serve import admin_caller
from hardcap_core.local.aws import LocalAws
from hardcap_core.local.valkey import LocalValkey
from tests.functional.test_lambda_events import (
    HANDLER,
    ROOT,
    FakeContext,
    body_of,
    load_event,
)
from tests.functional.test_lambda_events import mock as mock
from tests.stack import Mock

WHO = "arn:aws:iam::123456789012:user/operator"


@pytest.fixture(scope="module")
def lambda_env(
    valkey: LocalValkey, mock: Mock, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[..., Any]]]:
    """An invoke of the warm handler, and an admin call runner."""
    config = yaml.safe_load((ROOT / "hardcap_core" / "local" / "demo.yaml").read_text())
    config["upstreams"][0]["base_url"] = f"{mock.url}/v1"
    path = tmp_path_factory.mktemp("lambda-live") / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()

    def load() -> ModuleType:
        spec = importlib.util.spec_from_file_location("hardcap_buffered_live", HANDLER)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lambda")
    with (
        LocalAws(table="lambda-usage", config_table="lambda-config") as aws,
        pytest.MonkeyPatch.context() as env,
    ):
        env.setenv("HARDCAP_CONFIG", str(path))
        env.setenv("HARDCAP_REDIS_URL", valkey.url)
        env.setenv("HARDCAP_REDIS_CLUSTER", "false")
        env.setenv("POWERTOOLS_LOG_LEVEL", "WARNING")
        module = worker.submit(load).result(timeout=60)
        admin = admin_caller(valkey.url, ConfigStore(aws.config_table, aws.client()), config)

        def invoke(event: dict[str, Any]) -> dict[str, Any]:
            response: dict[str, Any] = worker.submit(module.handler, event, FakeContext()).result(
                timeout=60
            )
            return response

        yield invoke, admin
        loop = worker.submit(asyncio.get_event_loop).result()
        runtime = module._asgi.app.state.runtime
        worker.submit(loop.run_until_complete, runtime.aclose()).result(timeout=30)
        worker.submit(loop.close).result()
    worker.shutdown()


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
