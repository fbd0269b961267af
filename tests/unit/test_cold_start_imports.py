"""What a cold start imports: the app's import leaves out what most requests never touch.

Every module imported with the app is paid by every cold start, on the first request of each
new Lambda environment. The quote and lease endpoints, the live config (a config table) and the
tokenizers (a route with ``tokenizer:``) are imported on first use instead (gateway/app.py,
tokenize/routes.py), and all at once before a SnapStart snapshot, whose init time is free.
Each probe runs in a fresh interpreter: this process has imported everything already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFERRED = (
    "hardcap_core.control",  # the live config and the admin side: control.*
    "hardcap_core.gateway.quote",
    "hardcap_core.gateway.leases",
    "hardcap_core.ledger.leases",
    "hardcap_core.tokenize.counters",
    "hardcap_core.tokenize.count_api",
    "hardcap_core.tokenize.vocabularies",
)
CONFIG = {
    "gateway": {"redis_url": "redis://127.0.0.1:1"},
    "upstreams": [{"name": "u", "base_url": "http://127.0.0.1:1/v1"}],
    "routes": [{"name": "r", "upstream": "u", "model": "llama-3.3-70b"}],  # the bound only
}


def deferred_in(modules: list[str]) -> list[str]:
    """The deferred modules among ``modules`` (a package counts with its submodules)."""
    return sorted(m for m in modules if any(m == d or m.startswith(f"{d}.") for d in DEFERRED))


def probe(code: str, **environ: str) -> Any:
    """Run ``code`` in a new interpreter; the JSON of its last line of output."""
    env = {k: v for k, v in os.environ.items() if k not in ("HARDCAP_CONFIG_TABLE",)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**env, "PYTHONPATH": str(ROOT), "POWERTOOLS_LOG_LEVEL": "WARNING", **environ},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_importing_the_app_imports_none_of_the_deferred_modules() -> None:
    modules = probe(
        "import hardcap_core.gateway.app, json, sys; print(json.dumps(sorted(sys.modules)))"
    )
    assert "hardcap_core.gateway.app" in modules
    assert deferred_in(modules) == []


def test_the_app_lambda_builds_without_a_config_table_imports_none_of_them(
    tmp_path: Path,
) -> None:
    """``app_from_env`` (what uvicorn and Mangum call on Lambda) with no config table named,
    and the gateway's counts for a config whose routes have no tokenizer."""
    path = tmp_path / "hardcap.yaml"
    path.write_text(json.dumps(CONFIG))  # JSON is YAML
    modules = probe(
        "import json, sys\n"
        "from hardcap_core.gateway.app import app_from_env\n"
        "from hardcap_core.config import load_config\n"
        "from hardcap_core.tokenize.routes import InputCounts\n"
        f"app_from_env(); InputCounts(load_config({str(path)!r}))\n"
        "print(json.dumps(sorted(sys.modules)))",
        HARDCAP_CONFIG=str(path),
    )
    assert deferred_in(modules) == []


def test_a_route_with_a_tokenizer_imports_the_counters_when_the_gateway_is_built() -> None:
    """A tokenizer route still finds a missing vocabulary at startup (tests/unit/
    test_tokenizers.py), so its counters are imported when its counts are built."""
    data = {**CONFIG, "routes": [{"name": "r", "upstream": "u", "model": "gpt-4o"}]}
    modules = probe(
        "import json, sys\n"
        "from hardcap_core.config import parse_config\n"
        "from hardcap_core.tokenize.routes import InputCounts\n"
        f"InputCounts(parse_config({data!r}))\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    assert {"hardcap_core.tokenize.counters", "hardcap_core.tokenize.vocabularies"} <= set(modules)
    assert "tiktoken" not in modules  # its vocabulary is still loaded on the first count


def test_a_snapstart_snapshot_holds_every_deferred_module() -> None:
    """The adapter's before-checkpoint hook (Runtime.before_snapshot) imports them, so no
    environment restored from the snapshot imports one on a request."""
    modules = probe(
        "import asyncio, json, sys\n"
        "from hardcap_core.config import parse_config\n"
        "from hardcap_core.gateway.app import LAZY_MODULES, Runtime\n"
        f"asyncio.run(Runtime(parse_config({CONFIG!r})).before_snapshot())\n"
        "print(json.dumps({'modules': sorted(sys.modules), 'lazy': LAZY_MODULES}))"
    )
    assert set(modules["lazy"]) <= set(modules["modules"])
    assert {"hardcap_core.gateway.quote", "hardcap_core.gateway.leases"} <= set(modules["lazy"])


# What tracing imports (gateway/tracing.py): the SDK's trace pipeline, its OTLP exporter and
# protobuf. The OpenTelemetry API itself is not among them: redis-py imports it when installed.
TRACING = (
    "hardcap_core.gateway.tracing",
    "opentelemetry.sdk",
    "opentelemetry.exporter",
    "opentelemetry.proto",
    "google.protobuf",
)
LOADED = "print(json.dumps(sorted(m for m, v in sys.modules.items() if v is not None)))"
NO_OTLP = {"HARDCAP_OTLP_ENDPOINT": "", "OTEL_EXPORTER_OTLP_ENDPOINT": "",
           "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ""}  # fmt: skip


def tracing_in(modules: list[str]) -> list[str]:
    return sorted(m for m in modules if any(m == t or m.startswith(f"{t}.") for t in TRACING))


def test_without_an_otlp_endpoint_a_request_path_imports_no_tracing(tmp_path: Path) -> None:
    """Tracing off (the default) costs a cold start nothing: neither the gateway's tracing
    module nor the SDK is imported by the app, its runtime or the ledger's redis client (which
    imports the SDK's metrics whenever they are installed unless hardcap_core.ledger hides them
    first), even though the SDK is installed here."""
    path = tmp_path / "hardcap.yaml"
    path.write_text(json.dumps(CONFIG))
    modules = probe(
        "import json, sys\n"
        "from hardcap_core.gateway.app import app_from_env\n"
        "import redis.asyncio, hardcap_core.ledger.connection\n"
        "app = app_from_env(); assert app.state.runtime.tracing is None\n" + LOADED,
        HARDCAP_CONFIG=str(path), **NO_OTLP,
    )  # fmt: skip
    assert "redis.asyncio" in modules
    assert tracing_in(modules) == []


def test_an_otlp_endpoint_imports_tracing_with_the_app_and_not_the_sdks_metrics(
    tmp_path: Path,
) -> None:
    """With an endpoint the SDK is imported when the app is built (on Lambda: the init phase,
    before the first request); the metrics redis-py would load stay out."""
    path = tmp_path / "hardcap.yaml"
    path.write_text(json.dumps(CONFIG))
    modules = probe(
        "import json, sys\n"
        "from hardcap_core.gateway.app import app_from_env\n"
        "app = app_from_env(); assert app.state.runtime.tracing is not None\n"
        "app.state.runtime.tracing.shutdown()\n" + LOADED,
        HARDCAP_CONFIG=str(path), **{**NO_OTLP, "HARDCAP_OTLP_ENDPOINT": "http://127.0.0.1:9"},
    )  # fmt: skip
    assert "hardcap_core.gateway.tracing" in modules
    assert "opentelemetry.sdk.trace" in modules
    assert "opentelemetry.sdk.metrics" not in modules
