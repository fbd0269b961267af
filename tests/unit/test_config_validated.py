"""The validated copy the Lambda build ships beside the YAML (config/loader.py write_validated):
used only when it was made from the same text, and then neither PyYAML nor pydantic is loaded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hardcap_core.config import Config, load_config
from hardcap_core.config import loader as loader_module
from hardcap_core.config.loader import write_validated

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "config.yaml"


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    shutil.copy(EXAMPLE, path)
    return path


def summary(config: Config) -> tuple[object, ...]:
    return (
        config.gateway,
        config.upstreams,
        config.routes,
        config.tenant_scopes,
        sorted(config.keys.principals(), key=lambda p: p.key_id),
    )


def test_the_copy_loads_the_same_config_without_parsing_yaml(
    config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = load_config(config_path)
    written = write_validated(config_path)
    assert written == config_path.with_name("config.yaml.validated.pickle")

    def no_yaml(*args: object) -> None:
        raise AssertionError("the YAML was parsed although a matching copy exists")

    monkeypatch.setattr(loader_module, "_parse_yaml", no_yaml)
    loaded = load_config(config_path)
    assert summary(loaded) == summary(expected)
    assert loaded.source == str(config_path)


def test_a_stale_copy_is_ignored(config_path: Path) -> None:
    write_validated(config_path)
    text = config_path.read_text()
    assert "max_body_bytes: 1048576" in text
    config_path.write_text(text.replace("max_body_bytes: 1048576", "max_body_bytes: 4096", 1))
    assert load_config(config_path).gateway.max_body_bytes == 4096


def test_an_unreadable_copy_is_ignored(config_path: Path) -> None:
    write_validated(config_path).write_bytes(b"not a pickle")
    assert summary(load_config(config_path)) == summary(load_config(EXAMPLE))


def test_the_environment_still_overrides_the_cache_url(
    config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_validated(config_path)
    monkeypatch.setenv("HARDCAP_REDIS_URL", "rediss://cache.example:6379")
    monkeypatch.setenv("HARDCAP_REDIS_CLUSTER", "true")
    gateway = load_config(config_path).gateway
    assert (gateway.redis_url, gateway.redis_cluster) == ("rediss://cache.example:6379", True)


def test_loading_the_copy_imports_neither_yaml_nor_pydantic(config_path: Path) -> None:
    write_validated(config_path)
    code = (
        "import sys, json; from hardcap_core.config import load_config;"
        f"load_config({str(config_path)!r});"
        "print(json.dumps(sorted(m for m in ('yaml', 'pydantic') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
