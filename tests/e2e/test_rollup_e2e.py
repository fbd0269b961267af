"""End to end: the official `openai` SDK -> gateway -> mock upstream, real Valkey, moto's
DynamoDB, and the rollup function's handler fed the sample scheduler event from `events/`."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import openai
import pytest
import redis
import yaml
from moto import mock_aws

from hardcap_core import env
from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey, free_port
from hardcap_core.rollup import run as run_module
from hardcap_core.rollup.records import parse_entry
from hardcap_core.rollup.table import UsageTable, create_table
from tests.stack import KEYS, Mock, config_data, gateway_thread

ROOT = Path(__file__).resolve().parents[2]
EVENT = json.loads((ROOT / "events" / "scheduler-rollup.json").read_text())
TABLE = "hardcap-usage"


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=1.0, seed=23))
    yield m
    m.stop()


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Iterator[UsageTable]:
    """moto's DynamoDB for this process (the gateway thread and the handler both use it)."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL_DYNAMODB", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = boto3.client("dynamodb")
        create_table(client, TABLE)
        monkeypatch.setenv(env.USAGE_TABLE, TABLE)
        yield UsageTable(client, TABLE)


def rollup_handler(
    data: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Any]:
    """functions/rollup/app.py as Lambda loads it: a fresh import with this config."""
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setenv(env.CONFIG_PATH, str(path))
    app = ROOT / "functions" / "rollup" / "app.py"
    spec = importlib.util.spec_from_file_location(f"rollup_app_{uuid.uuid4().hex}", app)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def once(event: dict[str, Any], context: Any) -> Any:
        try:
            return module.handler(event, context)
        finally:
            module.close()

    return once


def totals(table: UsageTable, tenant: str) -> dict[str, int]:
    rows = table.usage([tenant], 0, 2**42)
    return {
        k: sum(getattr(r, k) for r in rows) for k in ("requests", "input_tokens", "output_tokens")
    }


def ledger_used(base: str, key: str) -> int:
    r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {key}"})
    r.raise_for_status()
    rows = {(b["level"], b["dimension"]): b for b in r.json()["budgets"]}
    return int(rows[("tenant", "total_tokens")]["used"])


def stream(base: str, key: str, content: str, max_tokens: int = 80) -> list[Any]:
    with openai.OpenAI(base_url=base, api_key=key, max_retries=0) as sdk:
        return list(sdk.chat.completions.create(
            model="small", messages=[{"role": "user", "content": content}],
            max_tokens=max_tokens, stream=True, user="alpha",
        ))  # fmt: skip


def test_scheduled_rollup_puts_exactly_the_settled_usage_in_dynamodb(
    mock: Mock, valkey: LocalValkey, table: UsageTable, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    data = config_data(mock.url, valkey.url)
    with gateway_thread(data) as base:
        for i in range(6):
            chunks = stream(base, KEYS["alpha"], f"Tell me about budgets, part {i}.")
            assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason
        used = ledger_used(base, KEYS["alpha"])
        with redis.Redis.from_url(valkey.url) as r:
            records = [parse_entry(i, f) for i, f in r.xrange("hc:{o:acme}:usage")]
    truth = mock.truth("alpha")
    summary = rollup_handler(data, tmp_path, monkeypatch)(EVENT, None)
    assert summary["applied"] == len(records) == 6
    got = totals(table, "alpha")
    # DynamoDB holds exactly the settled records ...
    assert got["input_tokens"] == sum(r.input_tokens for r in records)
    assert got["output_tokens"] == sum(r.output_tokens for r in records)
    assert got["requests"] == 6
    # ... which are what the provider billed for these completed streams, and what the ledger
    # charged.
    assert (got["input_tokens"], got["output_tokens"]) == (
        truth["prompt_tokens"], truth["completion_tokens"])  # fmt: skip
    assert got["input_tokens"] + got["output_tokens"] == used
    # A second run finds nothing new.
    assert rollup_handler(data, tmp_path, monkeypatch)(EVENT, None)["applied"] == 0
    assert totals(table, "alpha") == got


def test_a_cache_killed_mid_stream_loses_no_usage(
    mock: Mock, table: UsageTable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache dies while a stream runs and comes back empty: the stream's settle, which
    could not reach it, was kept in DynamoDB; the next rollup charges it to the restored ledger
    and rolls its record up."""
    mock.reset()
    port = free_port()
    cache = LocalValkey(port=port).start()
    data = config_data(mock.url, cache.url)
    try:
        with gateway_thread(data) as base:
            with openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0) as sdk:
                chunks = []
                events = sdk.chat.completions.create(
                    # Room to spare: the stream needs no extend, so it completes without the
                    # cache and its charge is the provider's own count.
                    model="small", max_tokens=400, stream=True, user="alpha",
                    messages=[{"role": "user",
                               "content": "Go slowly. [mock:pace_ms=20] [mock:tokens=40]"}],
                    stream_options={"include_usage": True},
                )  # fmt: skip
                for chunk in events:
                    chunks.append(chunk)
                    if len(chunks) == 5:
                        cache.stop()  # killed: no persistence, its data is gone
            assert chunks[-1].usage is not None  # the stream finished for the client
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
            truth = mock.truth("alpha")
            pending = table.pending("o:acme")
            assert len(pending) == 1  # the settle the cache never took
            cache = LocalValkey(port=port).start()  # back, empty
            summary = rollup_handler(data, tmp_path, monkeypatch)(EVENT, None)
            assert summary["replayed"] == 1 and summary["applied"] == 1
            got = totals(table, "alpha")
            assert (got["input_tokens"], got["output_tokens"]) == (
                truth["prompt_tokens"], truth["completion_tokens"])  # fmt: skip
            assert table.pending("o:acme") == []
            # The ledger was charged too: the restored cache shows the stream's usage.
            assert ledger_used(base, KEYS["alpha"]) == got["input_tokens"] + got["output_tokens"]
    finally:
        cache.stop()


class LambdaContext:
    """The one thing of Lambda's context object the handler reads."""

    def __init__(self, remaining_ms: int) -> None:
        self.deadline = time.monotonic() + remaining_ms / 1000

    def get_remaining_time_in_millis(self) -> int:
        return int((self.deadline - time.monotonic()) * 1000)


def test_an_invocation_rolls_up_in_passes_until_shortly_before_its_deadline(
    mock: Mock, valkey: LocalValkey, table: UsageTable, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A completion settled while the invocation runs is in DynamoDB when it returns (before,
    one run a minute: it waited for the next invocation)."""
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    monkeypatch.setattr(run_module, "INTERVAL_S", 0.3)
    data = config_data(mock.url, valkey.url)
    with gateway_thread(data) as base:
        stream(base, KEYS["alpha"], "Before the invocation.")
        later = threading.Timer(0.6, stream, (base, KEYS["alpha"], "During the invocation."))
        later.start()
        started = time.monotonic()
        context = LambdaContext(int((run_module.RESERVE_S + 2.0) * 1000))
        summary = rollup_handler(data, tmp_path, monkeypatch)(EVENT, context)
        later.join()
        took = time.monotonic() - started
    assert summary["passes"] >= 3 and summary["applied"] == 2
    assert totals(table, "alpha")["requests"] == 2
    assert 1.5 <= took < 4.0  # until RESERVE_S before the deadline, not past it
