"""The local stack for end-to-end tests: mock upstream + gateway(s) on real ports + real Valkey.

Gateways run in this process (a uvicorn thread) or as separate ``hardcap serve`` processes,
the local stand-in for separate Lambda execution environments, launched by
:mod:`hardcap_core.local.stack` as the benchmarks' are.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from hardcap_core.auth import hash_key
from hardcap_core.config import parse_config
from hardcap_core.local.mock_upstream import MockSettings, create_mock_app
from hardcap_core.local.servers import ThreadServer
from hardcap_core.local.stack import gateways
from hardcap_core.local.valkey import LocalValkey, free_port

if TYPE_CHECKING:  # the SDKs are imported by the tests that open one, not by every test
    import anthropic
    import openai

KEYS = {"alpha": "sk-test-alpha", "beta": "sk-test-beta", "open": "sk-test-open"}
# Where the gateway finds the key of upstream `claude` (:func:`anthropic_config`).
ANTHROPIC_KEY_ENV = "HC_TEST_ANTHROPIC_KEY"
# The SDK clients the running test opened (openai_client, anthropic_client): the end-to-end
# tests' conftest closes them after each test, so no keep-alive socket outlives it.
OPENED: list[openai.OpenAI | anthropic.Anthropic] = []


def config_data(mock_url: str, redis_url: str, **overrides: Any) -> dict[str, Any]:
    """A test config: tenants alpha (org acme), beta (only `small`), open (fails open)."""
    price = {"input_per_million": 1.0, "output_per_million": 2.0}
    data: dict[str, Any] = {
        "gateway": {"redis_url": redis_url, "max_body_bytes": 200_000},
        "upstreams": [{"name": "mock", "base_url": f"{mock_url}/v1", "timeout_seconds": 5}],
        "routes": [
            {
                "name": "small",
                "upstream": "mock",
                "model": "mock-small",
                "price": price,
                "max_output_tokens": 1024,
            },
            {
                "name": "reason",
                "upstream": "mock",
                "model": "mock-reason",
                "price": price,
                "max_output_tokens": 2048,
            },
            {
                "name": "p95",
                "upstream": "mock",
                "model": "mock-small",
                "price": price,
                "estimator": {"kind": "p95", "min_samples": 20},
                "max_output_tokens": 1024,
            },
            {
                "name": "allow",
                "upstream": "mock",
                "model": "mock-small",
                "price": price,
                "policy": "allow",
                "max_output_tokens": 1024,
            },
        ],
        "orgs": [
            {
                "id": "acme",
                "budgets": [{"dimension": "total_tokens", "limit": 10_000_000, "window": "day"}],
            }
        ],
        "tenants": [
            {
                "id": "alpha",
                "org": "acme",
                "budgets": [{"dimension": "total_tokens", "limit": 1_000_000, "window": "day"}],
                "keys": [{"id": "alpha-k", "hash": hash_key(KEYS["alpha"])}],
            },
            {
                "id": "beta",
                "org": "acme",
                "routes": ["small"],
                "budgets": [{"dimension": "output_tokens", "limit": 1_000_000, "window": "day"}],
                "keys": [{"id": "beta-k", "hash": hash_key(KEYS["beta"])}],
            },
            {
                "id": "open",
                "fail_mode": "open",
                "budgets": [{"dimension": "total_tokens", "limit": 1_000_000, "window": "day"}],
                "keys": [{"id": "open-k", "hash": hash_key(KEYS["open"])}],
            },
        ],
    }
    for path, value in overrides.items():
        _set(data, path, value)
    return data


def anthropic_config(mock: Mock, valkey: LocalValkey) -> dict[str, Any]:
    """The test config with upstream `claude` beside `mock`: the mock in its Anthropic mode, its
    key read from :data:`ANTHROPIC_KEY_ENV` (the test sets it)."""
    data = config_data(mock.url, valkey.url)
    data["upstreams"].append(
        {"name": "claude", "kind": "anthropic", "base_url": f"{mock.url}/v1",
         "timeout_seconds": 5, "api_key_env": ANTHROPIC_KEY_ENV}
    )  # fmt: skip
    return data


def route_config(**route: Any) -> dict[str, Any]:
    """A config of one route `r` (``route`` its fields) on upstream `u`, with an Anthropic
    upstream `a` beside it, all on ports nothing listens on: what parse_config makes of a
    route, with no server started."""
    return {
        "gateway": {"redis_url": "redis://127.0.0.1:1"},
        "upstreams": [
            {"name": "u", "base_url": "http://127.0.0.1:1/v1"},
            {"name": "a", "kind": "anthropic", "base_url": "http://127.0.0.1:1/v1"},
        ],
        "routes": [{"name": "r", "upstream": "u", **route}],
    }


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    """Set ``tenants.0.budgets`` style paths in the config dict."""
    *parents, last = path.split(".")
    node: Any = data
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


class Mock:
    """The mock upstream in a thread of this process, or (``url``) one running elsewhere."""

    def __init__(self, settings: MockSettings | None = None, *, url: str | None = None) -> None:
        self.server = (
            None
            if url
            else ThreadServer(create_mock_app(settings or MockSettings()), free_port()).start()
        )
        self.url = url or self.server.url  # type: ignore[union-attr]
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def reset(self) -> None:
        self.http.post("/mock/reset").raise_for_status()

    def truth(self, tenant: str, settle_s: float = 5.0) -> dict[str, int]:
        """Ground truth for ``tenant`` once nothing is in flight at the mock."""
        deadline = time.monotonic() + settle_s
        while True:
            tenants = self.http.get("/mock/ground-truth").json()["tenants"]
            row = tenants.get(tenant, {})
            if not row.get("in_flight") or time.monotonic() > deadline:
                return dict(row)
            time.sleep(0.02)

    def received(self) -> list[dict[str, Any]]:
        """The last Messages requests the Anthropic mode was sent (path, betas, body)."""
        r = self.http.get("/mock/anthropic/received")
        r.raise_for_status()
        got: list[dict[str, Any]] = r.json()
        return got

    def stop(self) -> None:
        self.http.close()
        if self.server is not None:
            self.server.stop()


def mock_fixture(settings: MockSettings) -> Callable[[], Iterator[Mock]]:
    """A module's ``mock`` fixture (``mock = mock_fixture(...)``): the mock upstream with
    ``settings``, shared by the module's tests."""

    @pytest.fixture(scope="module", name="mock")
    def fixture() -> Iterator[Mock]:
        m = Mock(settings)
        yield m
        m.stop()

    return fixture


@contextmanager
def gateway_thread(data: dict[str, Any]) -> Iterator[str]:
    """A gateway in this process; yields its /v1 base URL."""
    from hardcap_core.gateway.app import create_app

    server = ThreadServer(create_app(parse_config(data)), free_port()).start()
    try:
        yield f"{server.url}/v1"
    finally:
        server.stop()


def gateway(mock: Mock, valkey: LocalValkey, **overrides: Any) -> AbstractContextManager[str]:
    """A gateway in this process with the test config on ``mock`` and ``valkey`` (``overrides``
    as :func:`config_data` takes them); yields its /v1 base URL."""
    return gateway_thread(config_data(mock.url, valkey.url, **overrides))


def openai_client(base: str, key: str = KEYS["alpha"]) -> openai.OpenAI:
    """The `openai` SDK on the gateway at ``base``, no retries, closed after the test."""
    import openai

    OPENED.append(sdk := openai.OpenAI(base_url=base, api_key=key, max_retries=0))
    return sdk


def anthropic_client(base: str, key: str = KEYS["alpha"]) -> anthropic.Anthropic:
    """The `anthropic` SDK on the gateway at ``base`` (a /v1 URL: the SDK is given the root and
    adds /v1 itself), no retries, closed after the test."""
    import anthropic

    root = base.removesuffix("/v1")
    OPENED.append(sdk := anthropic.Anthropic(base_url=root, api_key=key, max_retries=0))
    return sdk


@contextmanager
def gateway_processes(data: dict[str, Any], count: int, tmp: Path) -> Iterator[list[str]]:
    """``count`` separate `hardcap serve` processes sharing one Valkey; yields base URLs."""
    with gateways(data, count, tmp, env={"POWERTOOLS_LOG_LEVEL": "WARNING"}) as started:
        yield [f"{service.url}/v1" for service in started]
