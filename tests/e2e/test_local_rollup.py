"""Spend on a laptop, as a user sees it: `hardcap serve` runs the rollup on a timer into an
embedded DynamoDB (moto), and `hardcap usage` reads it back, equal to what was charged and to
what the mock upstream really billed."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from hardcap_core import env
from hardcap_core.config import parse_config
from hardcap_core.local.aws import ENDPOINT_VAR, LocalAws, dynamodb_client
from hardcap_core.local.rollup_timer import RollupTimer
from hardcap_core.local.stack import Service, start_gateway
from hardcap_core.local.valkey import LocalValkey
from hardcap_core.rollup.table import UsageTable, create_table
from tests.stack import KEYS, Mock, config_data

ROOT = Path(__file__).resolve().parents[2]
# Printed by `hardcap serve` when it starts its own DynamoDB: the line that reads its spend.
SEE_SPEND = re.compile(r"see spend with: (\S+=\S+) (\S+=\S+) hardcap usage")
# config_data's price: $1 and $2 per million input and output tokens, in nano-USD per token.
NUSD_IN, NUSD_OUT = 1_000, 2_000
DAY_MS = 86_400_000


def hardcap_usage(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hardcap_core.local.cli", "usage", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def usage_json(*args: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    out = hardcap_usage("--json", *args, env=env)
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


@pytest.fixture
def local_aws() -> Iterator[LocalAws]:
    """moto's DynamoDB in this process with a fresh usage table; the environment (and so every
    child process) points at it until the test ends."""
    with LocalAws(table=f"hardcap-usage-{uuid.uuid4().hex[:8]}") as aws:
        yield aws


@pytest.fixture
def no_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing configured: `hardcap serve` starts its own Valkey and DynamoDB."""
    for name in ("HARDCAP_REDIS_URL", env.USAGE_TABLE, ENDPOINT_VAR, "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)


def serve(mock: Mock, tmp_path: Path, *options: str) -> Service:
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump(config_data(mock.url, None)))
    return start_gateway(config, tmp_path, rollup=True, options=options)


def stream_one(url: str, request_id: str) -> Any:
    """A streamed completion through the official SDK; the usage chunk the gateway sent."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEYS["alpha"], max_retries=0)
    try:
        stream = client.chat.completions.create(
            model="small",
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=60,
            messages=[{"role": "user", "content": "How is spend rolled up?"}],
            extra_body={"metadata": {"hardcap_bench_id": request_id}},
        )
        usage = None
        for chunk in stream:
            usage = chunk.usage or usage
    finally:
        client.close()
    assert usage is not None
    return usage


def test_serve_rolls_a_streamed_completion_up_into_its_embedded_dynamodb(
    mock: Mock, tmp_path: Path, no_aws_env: None
) -> None:
    mock.reset()
    gateway = serve(mock, tmp_path, "--rollup-interval", "0.5")
    try:
        match = SEE_SPEND.search(gateway.log.read_text())
        assert match, gateway.log.read_text()
        spend_env = dict(assignment.split("=", 1) for assignment in match.groups())
        assert usage_json(env=spend_env) == []  # nothing spent yet

        request_id = uuid.uuid4().hex
        usage = stream_one(gateway.url, request_id)
        truth = mock.http.get("/mock/requests").json()[request_id]
        assert truth["state"] == "finished"
        assert (usage.prompt_tokens, usage.completion_tokens) == (
            truth["prompt_tokens"],
            truth["completion_tokens"],
        )

        # No request comes after it: only the timer can bring it into the table.
        deadline = time.monotonic() + 60
        rows = usage_json("--tenant", "alpha", env=spend_env)
        while not rows and time.monotonic() < deadline:
            time.sleep(0.25)
            rows = usage_json("--tenant", "alpha", env=spend_env)
        assert len(rows) == 1, gateway.log.read_text()
        row = rows[0]
        assert (row["tenant"], row["org"], row["key_id"], row["route"], row["model"]) == (
            "alpha", "acme", "alpha-k", "small", "mock-small"
        )  # fmt: skip
        assert row["requests"] == 1
        assert row["input_tokens"] == usage.prompt_tokens
        assert row["output_tokens"] == usage.completion_tokens
        assert (
            row["cost_nusd"] == NUSD_IN * usage.prompt_tokens + NUSD_OUT * usage.completion_tokens
        )
        assert (row["truncated"], row["estimated"], row["refused"]) == (0, 0, 0)
        # A window that starts this hour, and every tenant: the same single row.
        assert usage_json("--since", "1h", env=spend_env) == rows
        assert usage_json("--since", "30m", "--tenant", "beta", env=spend_env) == []

        table = hardcap_usage("--tenant", "alpha", env=spend_env)
        assert table.returncode == 0, table.stderr
        line = next(li for li in table.stdout.splitlines() if li.startswith("alpha "))
        assert line.split()[:6] == [
            "alpha", "alpha-k", "mock-small", "1",
            str(usage.prompt_tokens), str(usage.completion_tokens),
        ]  # fmt: skip
        assert re.search(r"^total\s+1\s", table.stdout, re.MULTILINE), table.stdout
    finally:
        status = gateway.stop()
    assert status == 0, gateway.log.read_text()


def test_serve_rolls_up_into_a_configured_table_and_once_more_when_stopped(
    mock: Mock, tmp_path: Path, local_aws: LocalAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a table named in the environment, serve uses it (and starts no DynamoDB of its
    own); a timer that never fired still rolls up on SIGTERM what was settled."""
    monkeypatch.delenv("HARDCAP_REDIS_URL", raising=False)
    mock.reset()
    gateway = serve(mock, tmp_path, "--rollup-interval", "3600")
    try:
        assert "embedded DynamoDB" not in gateway.log.read_text()
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEYS["alpha"], max_retries=0)
        with client:
            reply = client.chat.completions.create(
                model="small", max_tokens=20, messages=[{"role": "user", "content": "hi"}]
            )
        assert reply.usage is not None
        table = UsageTable(dynamodb_client(), local_aws.table)
        now_ms = int(time.time() * 1000)
        assert table.usage(None, now_ms - DAY_MS, now_ms) == []
    finally:
        status = gateway.stop()
    assert status == 0, gateway.log.read_text()
    now_ms = int(time.time() * 1000)
    rows = table.usage(None, now_ms - DAY_MS, now_ms)
    assert [(r.tenant, r.requests, r.input_tokens, r.output_tokens) for r in rows] == [
        ("alpha", 1, reply.usage.prompt_tokens, reply.usage.completion_tokens)
    ]


def test_the_timer_logs_a_failed_run_and_the_next_one_applies_it(
    base: str,
    mock: Mock,
    valkey: LocalValkey,
    local_aws: LocalAws,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Runs fail while the table is missing; each failure is logged, the timer goes on, and
    once the table is there the records the failed runs left in the stream arrive, once."""
    client = dynamodb_client()
    table = UsageTable(client, f"created-late-{uuid.uuid4().hex[:8]}")
    timer = RollupTimer(parse_config(config_data(mock.url, valkey.url)), table, interval_s=0.2)
    timer.start()
    try:
        reply = httpx.post(
            f"{base}/chat/completions",
            headers={"authorization": f"Bearer {KEYS['alpha']}"},
            json={
                "model": "small",
                "max_tokens": 7,
                "messages": [{"role": "user", "content": "hi"}],
            },
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        deadline = time.monotonic() + 30

        def failed() -> list[logging.LogRecord]:
            # A run is counted when it ends, just before its failure is logged (on the timer's
            # thread): wait for the logs, not the count.
            message = "rollup failed; the next run retries"
            return [r for r in caplog.records if r.getMessage() == message]

        while len(failed()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert timer.runs >= 3
        assert len(failed()) >= 3 and all(r.exc_info for r in failed())

        create_table(client, table.name)
        now_ms = int(time.time() * 1000)
        rows = table.usage(["alpha"], now_ms - DAY_MS, now_ms)
        while not rows and time.monotonic() < deadline + 30:
            time.sleep(0.05)
            rows = table.usage(["alpha"], now_ms - DAY_MS, now_ms)
    finally:
        timer.stop()
    usage = reply.json()["usage"]
    rows = table.usage(["alpha"], now_ms - DAY_MS, int(time.time() * 1000))
    try:
        assert [(r.requests, r.input_tokens, r.output_tokens) for r in rows] == [
            (1, usage["prompt_tokens"], usage["completion_tokens"])
        ]
    finally:
        client.delete_table(TableName=table.name)


def test_usage_on_an_empty_table_prints_an_empty_list(local_aws: LocalAws) -> None:
    out = hardcap_usage("--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
    text = hardcap_usage("--table", local_aws.table)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("No usage from ")


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--since", "yesterday"], "--since"),
        (["--since", "7x"], "--since"),
        (["--until", "2026-13-01"], "--until"),
        (["--since", "1h", "--until", "2h"], "--since"),
    ],
)
def test_usage_names_the_flag_of_a_bad_window(args: list[str], flag: str) -> None:
    out = hardcap_usage("--table", "hardcap-usage", *args)
    assert out.returncode == 2
    assert out.stdout == ""
    assert f"error: {flag}" in out.stderr, out.stderr


def test_usage_without_a_table_says_how_to_name_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(env.USAGE_TABLE, raising=False)
    out = hardcap_usage("--json")
    assert out.returncode == 2
    assert "--table" in out.stderr and env.USAGE_TABLE in out.stderr


def test_usage_checks_tenants_against_the_config(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(config_data("http://127.0.0.1:9", None)))
    out = hardcap_usage("-c", str(config), "--tenant", "zeta", "--table", "t")
    assert out.returncode == 2
    assert "--tenant zeta" in out.stderr and "alpha" in out.stderr
