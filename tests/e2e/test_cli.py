"""The `hardcap` command as a user runs it: keys new, the whole demo stack, and `serve` and
`demo` stopped by SIGTERM as a process manager stops them."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import yaml

from hardcap_core import env
from hardcap_core.auth import hash_key
from hardcap_core.local.stack import start_gateway, start_mock
from hardcap_core.local.valkey import free_port
from tests.stack import KEYS, config_data

ROOT = Path(__file__).resolve().parents[2]
VALKEY_URL = re.compile(r"redis://127\.0\.0\.1:(\d+)")


def hardcap(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hardcap_core.local.cli", *args],
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
    # One Responses call and one embeddings call, each with its cost.
    assert re.search(
        r"POST /v1/responses.*\n  -> (completed|incomplete): .*\n .* tokens, \$0\.", out.stdout
    )
    assert re.search(r"POST /v1/embeddings.*\n  -> 2 vectors .*\n .* tokens, \$0\.", out.stdout)
    assert "sk-alpha-demo" not in out.stderr  # keys never reach the logs


def test_demo_shows_the_tenants_spend_read_back_from_dynamodb() -> None:
    """After the stream, one rollup; the `hardcap usage` table has exactly what was charged
    (the gateway's usage chunk) and what the ledger counts as used."""
    mock_port, port = free_port(), free_port()
    out = hardcap("demo", "--once", "--port", str(port), "--mock-port", str(mock_port))
    assert out.returncode == 0, out.stderr
    assert "DynamoDB (embedded, moto)" in out.stdout
    assert '{"_aws"' not in out.stdout  # the exchange, not the gateway's metric lines
    chunk = re.search(r"^\[usage: (.*)\]$", out.stdout, re.MULTILINE)
    assert chunk, out.stdout
    charged = json.loads(chunk.group(1))
    ledger = json.loads(
        out.stdout.split("$ GET /v1/hardcap/usage", 1)[1].split("budget headers")[0]
    )
    day = next(
        b for b in ledger["budgets"] if b["dimension"] == "total_tokens" and b["level"] == "tenant"
    )
    assert day["used"] == charged["prompt_tokens"] + charged["completion_tokens"]

    shown = out.stdout.split("$ hardcap usage --tenant alpha", 1)[1].split("$ hardcap admin")[0]
    assert "after a rollup: 1 usage record from the cache into DynamoDB" in shown
    rows = [line.split() for line in shown.splitlines() if line.startswith(("alpha ", "total "))]
    assert [r[0] for r in rows] == ["alpha", "total"], shown
    alpha, total = rows
    expected = ["1", str(charged["prompt_tokens"]), str(charged["completion_tokens"])]
    assert alpha[:3] == ["alpha", "alpha-dev", "mock-small"]
    assert alpha[3:6] == expected
    assert total[1:4] == expected
    # cost: the demo route's $5 / $15 per million input / output tokens, to the millionth
    cost = (5 * charged["prompt_tokens"] + 15 * charged["completion_tokens"]) / 1e6
    assert alpha[8] == f"{cost:.6f}"
    # Then the live config's loop: a key made by `hardcap admin` works at once, and once
    # revoked its next request is refused, with no restart.
    admin = out.stdout.split("$ hardcap admin keys create", 1)[1]
    key = re.search(r"new key \(shown once\): (hc_\S+)", admin)
    assert key, admin
    replies = re.findall(r"^  -> (\d{3}) ", admin, re.MULTILINE)
    assert replies == ["200", "401"], admin
    assert "$ hardcap admin keys revoke alpha-live" in admin


class Output:
    """A child's stdout, read line by line in a thread so every wait has a bound."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        assert proc.stdout is not None
        self.stdout = proc.stdout
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        for line in self.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def close(self) -> None:
        """Once the process is gone: the pipe reaches its end, then it is closed."""
        self.thread.join(10)
        self.stdout.close()

    def until(self, marker: str, timeout_s: float = 60) -> str:
        """Everything printed up to and including the first line containing ``marker``."""
        while not self.seen or marker not in self.seen[-1]:
            try:
                line = self.lines.get(timeout=timeout_s)
            except queue.Empty:
                pytest.fail(f"no {marker!r} within {timeout_s} s; printed:\n{''.join(self.seen)}")
            if line is None:
                pytest.fail(f"exited before printing {marker!r}:\n{''.join(self.seen)}")
            self.seen.append(line)
        return "".join(self.seen)


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


# As a process manager starts it: output to a pipe or a file is block-buffered (an empty
# PYTHONUNBUFFERED counts as unset), so what the user must see has to be flushed.
BUFFERED = {"PYTHONUNBUFFERED": ""}


def test_sigterm_stops_the_demo_and_its_valkey() -> None:
    port, mock_port = free_port(), free_port()
    args = ["demo", "--port", str(port), "--mock-port", str(mock_port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "hardcap_core.local.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env={**os.environ, **BUFFERED},
    )  # fmt: skip
    output = Output(proc)
    try:
        printed = output.until("Serving until Ctrl-C")
        match = VALKEY_URL.search(printed)
        assert match, printed
        valkey_port = int(match.group(1))
        assert not refuses_connections(valkey_port)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        output.close()
    assert refuses_connections(valkey_port), "the demo's Valkey outlived it"
    assert refuses_connections(port) and refuses_connections(mock_port)


def test_sigterm_stops_serve_and_its_embedded_valkey(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hardcap serve` with no redis_url anywhere serves from an embedded Valkey and stops it."""
    monkeypatch.delenv(env.REDIS_URL, raising=False)
    mock = start_mock(tmp_path, ["--pace-ms", "0"])
    try:
        config = tmp_path / "serve.yaml"
        config.write_text(yaml.safe_dump(config_data(mock.url, None)))
        gateway = start_gateway(config, tmp_path, env=BUFFERED)
        try:
            reply = httpx.post(
                f"{gateway.url}/v1/chat/completions",
                headers={"authorization": f"Bearer {KEYS['alpha']}"},
                json={
                    "model": "small",
                    "max_tokens": 5,
                    "messages": [{"role": "user", "content": "hi"}],
                },
                timeout=30,
            )
            assert reply.status_code == 200, reply.text
            match = VALKEY_URL.search(gateway.log.read_text())
            assert match, gateway.log.read_text()
            valkey_port = int(match.group(1))
            assert not refuses_connections(valkey_port)
        finally:
            status = gateway.stop()
    finally:
        assert mock.stop() == 0
    assert status == 0, gateway.log.read_text()
    assert refuses_connections(valkey_port), "serve's embedded Valkey outlived it"
