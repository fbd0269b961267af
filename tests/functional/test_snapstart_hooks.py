"""The clients built at start, and the SnapStart hooks the Lambda Web Adapter calls around a
snapshot (gateway/app.py): routes only when the adapter's variables name them; before the
snapshot the cache client is closed, after a restore a new one is built."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from hardcap_core.config import parse_config
from hardcap_core.gateway.app import create_app
from hardcap_core.local.valkey import LocalValkey
from tests.stack import config_data

BEFORE, AFTER = "/_hardcap/snapstart/before", "/_hardcap/snapstart/after"


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_LWA_SNAPSTART_BEFORE_CHECKPOINT_PATH", BEFORE)
    monkeypatch.setenv("AWS_LWA_SNAPSTART_AFTER_RESTORE_PATH", AFTER)


def test_no_hook_routes_unless_the_adapter_names_them(
    valkey: LocalValkey, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_LWA_SNAPSTART_BEFORE_CHECKPOINT_PATH", raising=False)
    monkeypatch.delenv("AWS_LWA_SNAPSTART_AFTER_RESTORE_PATH", raising=False)
    app = create_app(parse_config(config_data("http://127.0.0.1:9", valkey.url)))
    with TestClient(app) as client:
        assert client.post(BEFORE).status_code == 404
        assert client.post(AFTER).status_code == 404


def test_clients_are_built_at_start_and_rebuilt_around_a_snapshot(
    valkey: LocalValkey, hooks: None
) -> None:
    app = create_app(parse_config(config_data("http://127.0.0.1:9", valkey.url)))
    runtime = app.state.runtime
    with TestClient(app) as client:
        assert runtime._gateway is not None, "built in the lifespan, before any request"
        first = runtime._ledger_client

        assert client.post(BEFORE).status_code == 200
        assert runtime._gateway is None and runtime._ledger_client is None

        assert client.post(AFTER).status_code == 200
        assert runtime._gateway is not None
        assert runtime._ledger_client is not None and runtime._ledger_client is not first
        # The rebuilt gateway answers: an unknown key is refused by it, not by a 500.
        assert client.get("/v1/models").status_code == 401


def test_a_cache_that_cannot_be_built_at_start_is_left_to_the_first_request() -> None:
    data = config_data("http://127.0.0.1:9", "redis://127.0.0.1:9")
    data["gateway"].pop("redis_url")
    app = create_app(parse_config(data, environ={}))
    with TestClient(app, raise_server_exceptions=False) as client:
        assert app.state.runtime._gateway is None
        assert client.get("/v1/models").status_code == 500
