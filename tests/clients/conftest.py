"""The stack of the real-client tests: its own Valkey, ``hardcap mock`` and ``hardcap serve``
processes, shared by the session (each test has tenants of its own, so nothing is flushed)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from hardcap_core.local.stack import start_gateway, start_mock
from hardcap_core.local.valkey import LocalValkey
from tests.clients.stack import CUT_TENANTS, NODE_BIN, REQUIRE_ENV, UPSTREAM_KEY_ENV, config


@dataclass
class Stack:
    """The gateway's root URL, its log, and the cut tenants not yet used."""

    url: str
    log: Path
    _cut: Iterator[int] = field(default_factory=lambda: iter(range(CUT_TENANTS)))

    def cut_tenant(self) -> str:
        """A tenant of its own for a test whose stream is cut (its budget is spent after)."""
        return f"cut-{next(self._cut)}"


@pytest.fixture(scope="session")
def client_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("client-stack")
    with LocalValkey() as valkey:
        mock = start_mock(logs, ["--pace-ms", "1", "--seed", "7"])
        try:
            path = logs / "config.yaml"
            path.write_text(yaml.safe_dump(config(mock.url, valkey.url), sort_keys=False))
            gateway = start_gateway(
                path, logs, env={UPSTREAM_KEY_ENV: "sk-ant-mock", "POWERTOOLS_LOG_LEVEL": "INFO"}
            )
            try:
                yield Stack(gateway.url, gateway.log)
            finally:
                gateway.stop()
        finally:
            mock.stop()


_homes = itertools.count()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A HOME of the client's own, so no user config or credentials leak into the run."""
    path = tmp_path / f"home-{next(_homes)}"
    path.mkdir()
    return path


def node_tool(name: str) -> Path:
    """A client's command installed by ``npm ci --prefix tests/clients``."""
    return installed(NODE_BIN / name)


def installed(path: Path) -> Path:
    """``path`` if the npm install put it there; missing, the test fails under ``make test``
    (HARDCAP_REQUIRE_CLIENTS=1) and is skipped otherwise."""
    if not path.exists():
        message = f"{path} is missing: run `npm ci --prefix tests/clients`"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path
