"""The `hardcap` command as a user runs it: keys new, and the whole demo stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hardcap_core.auth import hash_key
from hardcap_core.local.valkey import free_port

ROOT = Path(__file__).resolve().parents[2]


def hardcap(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hardcap_core.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


def test_keys_new_prints_a_key_once_and_only_its_hash_to_paste() -> None:
    out = hardcap("keys", "new", "--tenant", "alpha", "--id", "alpha-ci")
    assert out.returncode == 0, out.stderr
    key = next(w for w in out.stdout.split() if w.startswith("hc_"))
    assert hash_key(key) in out.stdout
    assert "alpha-ci" in out.stdout


def test_demo_streams_a_completion_and_shows_usage(tmp_path: Path) -> None:
    mock_port, port = free_port(), free_port()
    config = (ROOT / "hardcap_core" / "local" / "demo.yaml").read_text()
    config = config.replace("127.0.0.1:9001", f"127.0.0.1:{mock_port}")
    (tmp_path / "local.yaml").write_text(config)
    out = hardcap("demo", "--once", "-c", str(tmp_path / "local.yaml"), "--port", str(port))
    assert out.returncode == 0, out.stderr
    assert "[finish_reason: " in out.stdout
    assert "[DONE]" in out.stdout
    assert '"object": "hardcap.usage"' in out.stdout
    assert '"tenant": "alpha"' in out.stdout
    assert "x-token-budget-remaining" in out.stdout
    assert "sk-alpha-demo" not in out.stderr  # keys never reach the logs
