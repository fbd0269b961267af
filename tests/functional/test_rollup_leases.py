"""Lease spend downstream of the usage record, against a real Valkey (standalone and cluster)
and moto's DynamoDB: the rollup keeps a lease column (items without a lease keep the key they
had), and ``hardcap usage --by lease`` sums what each lease's requests spent."""

from __future__ import annotations

from typing import Any

import pytest

from hardcap_core.config import Config, parse_config
from hardcap_core.ledger import Admitted, Ledger, ReservationMeta
from hardcap_core.ledger.leases import LeaseOpened, LeaseOwner, Leases
from hardcap_core.rollup import report
from hardcap_core.rollup.run import run_rollup
from hardcap_core.rollup.table import UsageTable
from tests.functional.test_rollup import PRICES
from tests.stack import config_data


@pytest.fixture
def config(backend: tuple[str, bool]) -> Config:
    return parse_config(config_data("http://127.0.0.1:9", backend[0]))


async def spend(ledger: Ledger, config: Config, lease: str, n: int) -> int:
    principal = config.principal_by_id("alpha-k")
    assert principal is not None
    total = 0
    for _ in range(n):
        meta = ReservationMeta(route="small", model="mock-small", key_id="alpha-k", lease=lease)
        a = await ledger.admit(
            principal.scope, input_tokens=10, output_estimate=50, prices=PRICES, meta=meta
        )
        assert isinstance(a, Admitted), a
        await ledger.settle(a.reservation, input_tokens=10, output_tokens=20)
        total += 30
    return total


async def test_spend_per_lease_is_rolled_up_and_reported(
    client: Any, config: Config, usage_table: UsageTable
) -> None:
    ledger = Ledger(client)
    principal = config.principal_by_id("alpha-k")
    assert principal is not None
    leases = Leases(ledger)
    opened = [
        await leases.open(principal.scope, LeaseOwner("alpha"), ttl_s=60, tokens=10_000)
        for _ in range(2)
    ]
    first, second = (o.id for o in opened if isinstance(o, LeaseOpened))
    want = {
        ("alpha", first): await spend(ledger, config, first, 3),
        ("alpha", second): await spend(ledger, config, second, 1),
        ("alpha", ""): await spend(ledger, config, "", 2),
    }
    await run_rollup(config, client, usage_table)
    rows = usage_table.usage(["alpha"], 0, 2**42)
    by_lease = report.lines(rows, report.BY_LEASE)
    assert {names: sums["input_tokens"] + sums["output_tokens"] for names, sums in by_lease} == want
    assert by_lease[0][0] == ("alpha", first)  # dearest first
    items = usage_table.client.scan(TableName=usage_table.name)["Items"]
    days = [i["sk"]["S"] for i in items if i["sk"]["S"].startswith("d#")]
    # No lease: the key it always had; a lease: '#<user>#<lease>' with no user.
    assert sorted(len(sk.split("#")) for sk in days) == [6, 8, 8]
    text = report.format_table(rows, 0, 2**42, report.BY_LEASE)
    assert first in text and "lease" in text.splitlines()[2]
    assert report.to_json(rows, report.BY_LEASE)[0]["lease"] == first
