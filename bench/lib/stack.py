"""Processes for the benchmarks: the mock upstream and ``hardcap serve`` gateways, one OS process
each (launched by :mod:`hardcap_core.local.stack`, as the tests' are), next to a private Valkey
(:class:`hardcap_core.local.valkey.LocalValkey`), and config builders.

Every server listens on 127.0.0.1 only. Gateways start through a tiny bootstrap
(:data:`GATEWAY_BOOTSTRAP`) that can hide hiredis from redis-py before anything imports it, and
that prints which RESP parser the first Redis connection really used, so a run can prove which
parser it measured (:func:`parser_in_use`).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hardcap_core.auth import hash_key
from hardcap_core.local import stack as local_stack
from hardcap_core.local.stack import Service
from tests.load.mock import get_nice as get_nice
from tests.load.mock import set_nice as set_nice
from tests.load.mock import start_mock as start_mock

ROOT = Path(__file__).resolve().parents[2]
PARSER_LINE = "hardcap-bench: redis parser in use: "
SERVER_LINE = "hardcap-bench: server: "

# redis-py picks its parser when `redis.utils` is imported (HIREDIS_AVAILABLE) and binds the
# default into Connection.__init__'s signature, so patching afterwards does not work: the
# module `hiredis` is hidden (sys.modules entry None makes `import hiredis` raise ImportError)
# before redis is imported. `set_parser` is wrapped to report the class a connection really got.
# uvicorn's "auto" loop and HTTP choices likewise fall back to asyncio and h11 when uvloop and
# httptools cannot be imported.
GATEWAY_BOOTSTRAP = f"""
import importlib.util, os, sys
PARSER_LINE = {PARSER_LINE!r}
if os.environ.get("HARDCAP_BENCH_NO_HIREDIS") == "1":
    sys.modules["hiredis"] = None
if os.environ.get("HARDCAP_BENCH_PLAIN_SERVER") == "1":
    sys.modules["uvloop"] = sys.modules["httptools"] = None
def _has(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # hidden: sys.modules[name] is None
        return False
print({SERVER_LINE!r} + ("uvloop" if _has("uvloop") else "asyncio") + " + "
      + ("httptools" if _has("httptools") else "h11"), flush=True)
import redis.asyncio.connection as _c
_orig = _c.AbstractConnection.set_parser
_seen = []
def _set_parser(self, cls):
    if not _seen:
        _seen.append(cls)
        print(PARSER_LINE + cls.__name__, flush=True)
    return _orig(self, cls)
_c.AbstractConnection.set_parser = _set_parser
try:
    from hardcap_core.local.cli import main
except ModuleNotFoundError:  # a tree from before the command line moved into local/ (--base-tree)
    from hardcap_core.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _env(**extra: str) -> dict[str, str]:
    """The benchmarks run from a checkout: the repository goes first on the children's path."""
    return {
        **extra,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def _gateway_launch(*, hiredis: bool, fast_server: bool, log_level: str) -> dict[str, Any]:
    """How a benchmark gateway starts: through :data:`GATEWAY_BOOTSTRAP`, from the checkout."""
    env = _env(
        POWERTOOLS_LOG_LEVEL=log_level,
        HARDCAP_BENCH_NO_HIREDIS="0" if hiredis else "1",
        HARDCAP_BENCH_PLAIN_SERVER="0" if fast_server else "1",
    )
    return {"command": [sys.executable, "-c", GATEWAY_BOOTSTRAP], "env": env, "cwd": ROOT}


def start_gateway(
    config: Path,
    tmp: Path,
    *,
    hiredis: bool = True,
    fast_server: bool = True,
    log_level: str = "WARNING",
    env: dict[str, str] | None = None,
    rollup: bool = False,
) -> Service:
    """One ``hardcap serve`` process; ``hiredis=False`` hides the C parser from redis-py,
    ``fast_server=False`` hides uvloop and httptools from uvicorn; ``env`` is added to its
    environment; ``rollup`` runs its rollup timer (against the usage table ``env`` names)."""
    launch = _gateway_launch(hiredis=hiredis, fast_server=fast_server, log_level=log_level)
    launch["env"] = {**launch["env"], **(env or {})}
    return local_stack.start_gateway(config, tmp, rollup=rollup, **launch)


@contextmanager
def gateways(
    data: dict[str, Any],
    count: int,
    tmp: Path,
    *,
    hiredis: bool = True,
    fast_server: bool = True,
    log_level: str = "WARNING",
) -> Iterator[list[Service]]:
    """``count`` gateway processes serving the config ``data``; stopped on exit."""
    launch = _gateway_launch(hiredis=hiredis, fast_server=fast_server, log_level=log_level)
    with local_stack.gateways(data, count, tmp, **launch) as started:
        yield started


@contextmanager
def gateways_with_env(
    data: dict[str, Any],
    count: int,
    tmp: Path,
    env: dict[str, str],
    *,
    hiredis: bool = True,
    fast_server: bool = True,
    log_level: str = "WARNING",
) -> Iterator[list[Service]]:
    """:func:`gateways` with ``env`` added to the gateways' environment (last, so it wins):
    a benchmark measures a variant (another upstream transport, say) without a code change."""
    launch = _gateway_launch(hiredis=hiredis, fast_server=fast_server, log_level=log_level)
    launch["env"] = {**launch["env"], **env}
    with local_stack.gateways(data, count, tmp, **launch) as started:
        yield started


def parser_in_use(service: Service, timeout_s: float = 5.0) -> str:
    """The RESP parser class the gateway's first Redis connection used (after one request)."""
    return _reported(service, PARSER_LINE, timeout_s)


def server_in_use(service: Service, timeout_s: float = 5.0) -> str:
    """The event loop and HTTP parser uvicorn could use in the gateway process."""
    return _reported(service, SERVER_LINE, timeout_s)


def _reported(service: Service, prefix: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in service.log.read_text(errors="replace").splitlines():
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        time.sleep(0.05)
    return "unknown"


def tenant_key(tenant: str) -> str:
    return f"sk-bench-{tenant}"


def tenant_entry(tenant: str, budget: int, window: str) -> dict[str, Any]:
    """A config tenant with one total_tokens budget and one key (:func:`tenant_key`)."""
    return {
        "id": tenant,
        "budgets": [{"dimension": "total_tokens", "limit": budget, "window": window}],
        "keys": [{"id": f"{tenant}-k", "hash": hash_key(tenant_key(tenant))}],
    }


def mock_route(name: str, **fields: Any) -> dict[str, Any]:
    """A route to the mock's `mock-small` model."""
    return {"name": name, "upstream": "mock", "model": "mock-small", **fields}


def base_config(mock_url: str, redis_url: str, **gateway: Any) -> dict[str, Any]:
    """A config with the mock as its only upstream and no routes or tenants yet."""
    return {
        "gateway": {"redis_url": redis_url, **gateway},
        "upstreams": [{"name": "mock", "base_url": f"{mock_url}/v1", "timeout_seconds": 120}],
        "routes": [],
        "tenants": [],
    }


class LogWatch:
    """Counts the gateways' warning and error log lines written since the last look."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.offsets = {p: p.stat().st_size if p.exists() else 0 for p in paths}

    def new_entries(self) -> dict[str, int]:
        """``{"<level>: <message> (<error>)": count}`` over every gateway."""
        counts: collections.Counter[str] = collections.Counter()
        for path in self.paths:
            with path.open("rb") as f:
                f.seek(self.offsets[path])
                data = f.read()
                self.offsets[path] = f.tell()
            for line in data.decode(errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(entry, dict) and entry.get("level") in ("WARNING", "ERROR"):
                    error = f" ({entry['error']})" if entry.get("error") else ""
                    counts[f"{entry['level']}: {entry.get('message')}{error}"] += 1
        return dict(counts.most_common())
