"""The local stack for end-to-end tests: mock upstream + gateway(s) on real ports + real Valkey.

Gateways run in this process (a uvicorn thread) or as separate ``hardcap serve`` processes,
the local stand-in for separate Lambda execution environments, launched by
:mod:`hardcap_core.local.stack` as the benchmarks' are.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from hardcap_core.auth import hash_key
from hardcap_core.config import parse_config
from hardcap_core.local.mock_upstream import MockSettings, create_mock_app
from hardcap_core.local.servers import ThreadServer
from hardcap_core.local.stack import gateways
from hardcap_core.local.valkey import free_port

KEYS = {"alpha": "sk-test-alpha", "beta": "sk-test-beta", "open": "sk-test-open"}


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

    def stop(self) -> None:
        self.http.close()
        if self.server is not None:
            self.server.stop()


@contextmanager
def gateway_thread(data: dict[str, Any]) -> Iterator[str]:
    """A gateway in this process; yields its /v1 base URL."""
    from hardcap_core.gateway.app import create_app

    server = ThreadServer(create_app(parse_config(data)), free_port()).start()
    try:
        yield f"{server.url}/v1"
    finally:
        server.stop()


@contextmanager
def gateway_processes(data: dict[str, Any], count: int, tmp: Path) -> Iterator[list[str]]:
    """``count`` separate `hardcap serve` processes sharing one Valkey; yields base URLs."""
    with gateways(data, count, tmp, env={"POWERTOOLS_LOG_LEVEL": "WARNING"}) as started:
        yield [f"{service.url}/v1" for service in started]
