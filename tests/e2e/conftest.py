"""Fixtures of the end-to-end tests: the mock upstream and a gateway on a flushed Valkey."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from tests.stack import OPENED, Mock, config_data, gateway_thread, mock_fixture

# The mock upstream, fast and seeded, shared by a module's tests (a module may have its own).
mock = mock_fixture(MockSettings(pace_ms=0.5, seed=5))


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Closes the SDK clients the test opened with tests.stack's openai_client and
    anthropic_client."""
    yield
    while OPENED:
        OPENED.pop().close()


@pytest.fixture
def base(valkey: LocalValkey, mock: Mock) -> Iterator[str]:
    """The /v1 URL of a gateway with the test config, on a flushed Valkey and a reset mock."""
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    with gateway_thread(config_data(mock.url, valkey.url)) as url:
        yield url


@pytest.fixture
def flushed(valkey: LocalValkey, mock: Mock) -> LocalValkey:
    """A flushed Valkey and a reset mock (the requesting module's own ``mock`` if it has one)."""
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    return valkey
