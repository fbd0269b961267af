"""`hardcap usage` with users, as an operator runs it against a usage table (moto's server):
the user column where rows have one, and ``--by user``, a line per tenant and user, dearest
first, as a table and as JSON."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest

from hardcap_core.local.aws import LocalAws
from hardcap_core.rollup.records import RecordKind, UsageRecord
from hardcap_core.rollup.run import chunks
from hardcap_core.rollup.table import UsageTable, Write
from tests.e2e.test_local_rollup import hardcap_usage

NOW = int(time.time() * 1000)
RECORD = UsageRecord(
    entry_id=f"{NOW - 60_000}-0", kind=RecordKind.SETTLE, reservation_id="r", tenant="alpha",
    org="acme", key_id="alpha-k", route="small", model="mock-small", provider="mock",
    request_id="q", outcome="completed", estimate=False, requests=1, input_tokens=100,
    output_tokens=50, reasoning_tokens=0, cached_input_tokens=0, cost_nusd=200_000,
    admitted_ms=NOW - 61_000,
)  # fmt: skip
SPENT = [
    replace(RECORD, user="alpha~ann"),
    replace(RECORD, entry_id=f"{NOW - 60_000}-1", user="alpha~bob", cost_nusd=900_000),
    replace(RECORD, entry_id=f"{NOW - 60_000}-2", user="alpha~bob", key_id="alpha-ci"),
    replace(RECORD, entry_id=f"{NOW - 60_000}-3"),  # a request without a user
]


@pytest.fixture
def spent() -> Iterator[LocalAws]:
    """A usage table holding :data:`SPENT`, written as the rollup writes it."""
    with LocalAws(table=f"hardcap-usage-{uuid.uuid4().hex[:8]}") as aws:
        table = UsageTable(aws.client(), aws.table)
        cursor = None
        for chunk in chunks(SPENT):
            last = chunk.records[-1].entry_id
            assert table.apply("o:acme", "g", cursor, last, chunk.totals, len(chunk.records)) is (
                Write.APPLIED
            )
            cursor = last
        yield aws


def test_the_table_gains_a_user_column(spent: LocalAws) -> None:
    out = hardcap_usage("--since", "1h")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[2].split()[:5] == ["tenant", "key", "user", "model", "requests"]
    assert [line.split()[:5] for line in lines[4:-2]] == [
        ["alpha", "alpha-ci", "alpha~bob", "mock-small", "1"],
        ["alpha", "alpha-k", "-", "mock-small", "1"],
        ["alpha", "alpha-k", "alpha~ann", "mock-small", "1"],
        ["alpha", "alpha-k", "alpha~bob", "mock-small", "1"],
    ]


def test_by_user_answers_who_spends(spent: LocalAws) -> None:
    out = hardcap_usage("--since", "1h", "--by", "user")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[2].split()[:3] == ["tenant", "user", "requests"]
    body = [line.split() for line in lines[4:-2]]
    assert [(cells[1], cells[2], cells[7]) for cells in body] == [
        ("alpha~bob", "2", "0.001100"),  # two keys, one user
        ("-", "1", "0.000200"),  # a tie in cost goes by name
        ("alpha~ann", "1", "0.000200"),
    ]
    as_json = hardcap_usage("--since", "1h", "--by", "user", "--json")
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert [(r["user"], r["requests"], r["cost_nusd"]) for r in rows] == [
        ("alpha~bob", 2, 1_100_000), ("", 1, 200_000), ("alpha~ann", 1, 200_000),
    ]  # fmt: skip


def test_by_names_what_it_accepts(spent: LocalAws) -> None:
    out = hardcap_usage("--by", "model")
    assert out.returncode == 2
    assert "invalid choice: 'model'" in out.stderr and "'user'" in out.stderr
