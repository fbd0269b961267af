"""Claude Code itself (the pinned one `make test` installs in tests/clients/) against `hardcap
serve` and the mock's Anthropic mode, with its defaults: only `ANTHROPIC_BASE_URL` and a key; its
default model (`claude-opus-5-5`, 128,000 output tokens, adaptive thinking) is a route. It
sends `/v1/messages?beta=true` with `context_management`, `output_config`, adaptive thinking,
a mid-conversation system message and cache marks; the turn must finish, and what the ledger
charged must be what the mock billed.

Missing, it fails under `make test` (HARDCAP_REQUIRE_CLIENTS=1) and is skipped elsewhere."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from hardcap_core.rollup.records import UsageRecord, parse_entry
from tests.clients.conftest import node_tool
from tests.stack import KEYS, Mock, config_data, gateway_processes

MODEL = "claude-opus-5-5"  # its default model, with max_tokens 128,000
KEY_ENV = "HC_TEST_ANTHROPIC_KEY"
PRICE = {"input_per_million": 3.0, "output_per_million": 15.0}
TURN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def claude() -> Path:
    """The pinned Claude Code's `claude` (tests/clients/package-lock.json)."""
    return node_tool("claude")


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0.2, seed=41))
    yield m
    m.stop()


def serve(mock: Mock, valkey: LocalValkey, tmp: Path, budget: int = 10_000_000) -> Any:
    data = config_data(mock.url, valkey.url)
    data["gateway"]["max_body_bytes"] = 2_000_000  # Claude Code's first turn is ~100 KB
    data["upstreams"].append(
        {"name": "claude", "kind": "anthropic", "base_url": f"{mock.url}/v1",
         "timeout_seconds": 30, "api_key_env": KEY_ENV}
    )  # fmt: skip
    data["routes"].append(
        {"name": MODEL, "upstream": "claude", "model": "mock-small", "price": PRICE,
         "max_output_tokens": 128_000}
    )  # fmt: skip
    data["tenants"][0]["budgets"] = [
        {"dimension": "total_tokens", "limit": budget, "window": "day"}
    ]
    return gateway_processes(data, 1, tmp)


@pytest.fixture
def fresh(valkey: LocalValkey, mock: Mock, monkeypatch: pytest.MonkeyPatch) -> LocalValkey:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    return valkey


def run(
    claude: Path, base: str, prompt: str, home: Path, *options: str
) -> subprocess.CompletedProcess[str]:
    """``claude [options] -p prompt`` with its defaults: the gateway's URL and a key."""
    home.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": base.removesuffix("/v1"),
        "ANTHROPIC_API_KEY": KEYS["alpha"],
        # No network here: keep it from phoning home (none of these change its requests).
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return subprocess.run(
        [str(claude), *options, "-p", prompt], env=env, cwd=home, capture_output=True, text=True,
        timeout=TURN_TIMEOUT_S, check=False,
    )  # fmt: skip


def received(mock: Mock) -> list[dict[str, Any]]:
    return list(httpx.get(f"{mock.url}/mock/anthropic/received").json())


def tenant_usage(base: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/hardcap/usage", headers={"x-api-key": KEYS["alpha"]})
    rows = {(b["level"], b["dimension"]): b for b in r.json()["budgets"]}
    return rows[("tenant", "total_tokens")]


def test_a_turn_with_its_defaults_finishes_and_is_charged_the_mocks_bill(
    claude: Path, mock: Mock, fresh: LocalValkey, tmp_path: Path
) -> None:
    with serve(mock, fresh, tmp_path) as bases:
        done = run(claude, bases[0], "say hi [mock:tokens=9]", tmp_path / "home")
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.strip(), done.stderr
        sent = [r for r in received(mock) if r["path"] == "/v1/messages"]
        assert sent, "Claude Code's turn never reached the upstream"
        body = sent[-1]["body"]
        for name in ("context_management", "output_config", "thinking", "metadata", "tools"):
            assert name in body, name
        assert "context-management-2025-06-27" in (sent[-1]["anthropic_beta"] or "")
        assert body["thinking"]["type"] == "adaptive" and body["model"] == "mock-small"
        tenant = body["metadata"]["user_id"]  # the mock's tenant: Claude Code's own id
        deadline = time.monotonic() + 5
        while tenant_usage(bases[0])["reserved"] and time.monotonic() < deadline:
            time.sleep(0.05)
        truth = mock.truth(tenant)
        assert truth["requests"] == len(sent)
        assert tenant_usage(bases[0])["used"] == truth["total_tokens"] > 0


def records(valkey: LocalValkey) -> list[UsageRecord]:
    with redis.Redis.from_url(valkey.url) as r:
        entries = r.xrange("hc:{o:acme}:usage")
    return [rec for rec in (parse_entry(i, f) for i, f in entries) if not rec.refused]


def test_the_next_turn_reads_the_conversation_from_the_providers_cache(
    claude: Path, mock: Mock, fresh: LocalValkey, tmp_path: Path
) -> None:
    """`claude -c` sends the first turn's prompt again with the next question: the upstream
    (the mock's prompt cache, as Anthropic's) reads it from its cache, and the ledger charges
    the read at the cache price: the second turn, longer, costs less than the first."""
    home = tmp_path / "home"
    with serve(mock, fresh, tmp_path) as bases:
        first = run(claude, bases[0], "say hi [mock:tokens=5]", home)
        assert first.returncode == 0, first.stdout + first.stderr
        second = run(claude, bases[0], "again [mock:tokens=5]", home, "--continue")
        assert second.returncode == 0, second.stdout + second.stderr
        deadline = time.monotonic() + 5
        while len(records(fresh)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        one, two = records(fresh)
        tenant = received(mock)[-1]["body"]["metadata"]["user_id"]
        truth = mock.truth(tenant)
    assert one.outcome == two.outcome == "completed"
    assert one.cached_input_tokens == 0 < two.cached_input_tokens
    assert two.input_tokens > one.input_tokens and two.cost_nusd < one.cost_nusd
    charged = sum(r.input_tokens + r.output_tokens for r in (one, two))
    assert charged == truth["total_tokens"]


def test_a_turn_past_the_budget_gets_a_clear_message_and_gives_up_promptly(
    claude: Path, mock: Mock, fresh: LocalValkey, tmp_path: Path
) -> None:
    before = len(received(mock))
    with serve(mock, fresh, tmp_path, budget=1_000) as bases:
        started = time.monotonic()
        done = run(claude, bases[0], "say hi", tmp_path / "home")
        took = time.monotonic() - started
        assert done.returncode != 0
        assert "budget" in (done.stdout + done.stderr).lower(), done.stdout + done.stderr
        assert took < 30, f"took {took:.0f} s to give up"
        assert len(received(mock)) == before  # refused before any upstream was asked
        assert tenant_usage(bases[0])["used"] == 0
