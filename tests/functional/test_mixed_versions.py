"""A deploy runs the previous release and this one on one cache for minutes: a request admitted
by an instance of one may be extended, reclaimed at expiry or settled by an instance of the
other. Here the previous release (its own Python client AND its own Lua scripts, extracted from
git into a temporary folder and run in a subprocess) and this release make those calls on one
real Valkey, standalone and a 3-master cluster, in every order, and the counters, the remaining
budget and the usage records (parsed by this release's rollup) come out exactly right.

Each release registers its own scripts (by SHA; they differ, and coexist as in a real rolling
deploy). What crosses between them is the records in the cache: the reservation record (this
release adds ``v``; the previous one has none), the expiry record and the usage record.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from hardcap_core.ledger.keys import Keyspace
from hardcap_core.rollup.records import RecordKind, UsageRecord, parse_entry
from tests.functional import mixed_versions_driver as driver

REPO = Path(__file__).resolve().parents[2]
PREVIOUS_RELEASE = "44c25af"  # the last commit before lua/ moved into the package
OLD, NEW = "old", "new"
EXPIRING_TTL_S = 0.2  # the admitting instance's reservation TTL, where a hold must expire
PAST_TTL_S = 0.4
LIVE_TTL_S = 30.0
SCOPE, LIMITS = driver.SCOPE, driver.LIMITS


def cost(inp: int, out: int) -> int:
    return driver.PRICES.cost(inp, out)


def counts(inp: int, out: int) -> list[int]:
    """What ``inp`` input and ``out`` output tokens add to each row: tenant tokens, key output,
    org cost."""
    return [inp + out, out, cost(inp, out)]


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The previous release's package and scripts (``hardcap_core/`` and ``lua/`` at that
    commit), with the driver beside them."""
    root = tmp_path_factory.mktemp("previous_release")
    archive = subprocess.run(
        ["git", "archive", PREVIOUS_RELEASE, "hardcap_core", "lua"],
        cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    assert (root / "lua" / "admit.lua").is_file()
    assert not (root / "hardcap_core" / "lua").exists()  # the old layout: lua/ beside it
    shutil.copy(Path(driver.__file__), root / "driver.py")
    yield root
    shutil.rmtree(root, ignore_errors=True)


class Releases:
    """Calls on one cache by either release: ``new`` in this process, ``old`` in a subprocess
    importing only the previous release."""

    def __init__(self, old_root: Path, url: str, cluster: bool) -> None:
        self.old_root, self.url, self.cluster = old_root, url, cluster

    async def call(self, side: str, ttl_s: float = LIVE_TTL_S, **op: Any) -> dict[str, Any]:
        args: dict[str, Any] = {"url": self.url, "cluster": self.cluster, "ttl_s": ttl_s, "op": op}
        if side == NEW:
            mine = await driver.run(**args)
            assert Path(mine["package"]).is_relative_to(REPO / "hardcap_core")
            return mine
        env = {**os.environ, "PYTHONPATH": str(self.old_root)}
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(self.old_root / "driver.py"), json.dumps(args)],
            cwd=self.old_root, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        assert Path(out["package"]).is_relative_to(self.old_root)  # never this checkout's
        return out

    async def usage(self, side: str) -> dict[str, Any]:
        return await self.call(side, op="usage")


@pytest.fixture
def releases(previous_release: Path, backend: tuple[str, bool]) -> Releases:
    return Releases(previous_release, *backend)


async def with_client(backend: tuple[str, bool]) -> Any:
    url, cluster = backend
    if cluster:
        return RedisCluster.from_url(url)
    return aioredis.Redis.from_url(url)


async def reservation_record(backend: tuple[str, bool], rid: str) -> dict[str, Any] | None:
    client = await with_client(backend)
    try:
        raw = await client.hget(Keyspace().ledger(SCOPE)[1], rid)  # lib.lua: K_RES
    finally:
        await client.aclose()
    return None if raw is None else dict(json.loads(raw))


async def usage_records(backend: tuple[str, bool]) -> list[UsageRecord]:
    client = await with_client(backend)
    try:
        entries = await client.xrange(Keyspace().usage_stream(SCOPE.root))
    finally:
        await client.aclose()
    return [parse_entry(entry_id, fields) for entry_id, fields in entries]


def check_usage(u: dict[str, Any], used: list[int], reserved: list[int], live: int) -> None:
    assert (u["used"], u["reserved"], u["live"]) == (used, reserved, live)


def sums(records: list[UsageRecord]) -> list[int]:
    """What the records add to each row, as the rollup adds them."""
    inp = sum(r.input_tokens for r in records)
    out = sum(r.output_tokens for r in records)
    return [inp + out, out, sum(r.cost_nusd for r in records)]


ORDERS = [(OLD, NEW), (NEW, OLD)]


@pytest.mark.parametrize(("admits", "finishes"), ORDERS, ids=["old-admits", "new-admits"])
async def test_admitted_by_one_release_extended_and_settled_by_the_other(
    releases: Releases, backend: tuple[str, bool], admits: str, finishes: str
) -> None:
    a = await releases.call(admits, op="admit", id="r1", input=100, estimate=300)
    assert (a["result"], a["output_reserved"]) == ("Admitted", 300)
    record = await reservation_record(backend, "r1")
    assert record is not None
    # This release versions the record; the previous one wrote none (read as version 1).
    assert record.get("v") == (2 if admits == NEW else None)

    e = await releases.call(finishes, op="extend", held=a, tokens=64)
    assert (e["result"], e["granted"], e["output_reserved"]) == ("Extended", 64, 364)
    held = {**a, "output_reserved": 364}
    for side in (OLD, NEW):  # both read the hold the same
        check_usage(await releases.usage(side), [0, 0, 0], counts(100, 364), live=1)

    s = await releases.call(finishes, op="settle", held=held, input=100, output=350)
    assert (s["duplicate"], s["had_reservation"], s["expiry_charged"]) == (False, True, False)
    charged = counts(100, 350)
    assert s["remaining"] == [limit - c for limit, c in zip(LIMITS, charged, strict=True)]
    for side in (OLD, NEW):
        check_usage(await releases.usage(side), charged, [0, 0, 0], live=0)

    # A retry of the settle by the admitting release charges nothing twice.
    again = await releases.call(admits, op="settle", held=held, input=100, output=350)
    assert again["duplicate"] is True
    check_usage(await releases.usage(admits), charged, [0, 0, 0], live=0)

    (rec,) = await usage_records(backend)
    assert (rec.kind, rec.reservation_id, rec.outcome, rec.requests, rec.estimate) == (
        RecordKind.SETTLE, "r1", "completed", 1, False,
    )  # fmt: skip
    assert (rec.input_tokens, rec.output_tokens, rec.cost_nusd) == (100, 350, cost(100, 350))
    assert (rec.tenant, rec.org, rec.key_id, rec.route, rec.request_id) == (
        "acme", "bigco", "k1", "chat", "rq-r1",
    )  # fmt: skip
    assert rec.admitted_ms == a["at"]  # from the reservation record the other release wrote


EXPIRY_ORDERS = [(OLD, NEW, OLD), (OLD, NEW, NEW), (NEW, OLD, NEW), (NEW, OLD, OLD)]


@pytest.mark.parametrize(
    ("admits", "reclaims", "settles"), EXPIRY_ORDERS, ids=["-".join(o) for o in EXPIRY_ORDERS]
)
async def test_a_hold_admitted_by_one_release_is_reclaimed_at_expiry_by_the_other(
    releases: Releases, backend: tuple[str, bool], admits: str, reclaims: str, settles: str
) -> None:
    """The expiry charges the hold (admitted to be charged), in the reclaiming release; the
    late settle, in either, charges only the difference to the real counts."""
    a = await releases.call(
        admits, ttl_s=EXPIRING_TTL_S, op="admit", id="r2", input=100, estimate=300, charge=True
    )
    assert (a["result"], a["output_reserved"]) == ("Admitted", 300)
    await asyncio.sleep(PAST_TTL_S)

    hold = counts(100, 300)
    check_usage(await releases.usage(reclaims), hold, [0, 0, 0], live=0)
    assert await reservation_record(backend, "r2") is None
    gone = await releases.call(admits, op="extend", held=a, tokens=64)
    assert gone["result"] == "ReservationGone"

    s = await releases.call(settles, op="settle", held=a, input=100, output=250)
    assert (s["duplicate"], s["had_reservation"], s["expiry_charged"]) == (False, False, True)
    real = counts(100, 250)  # the same window: the settle refunds what the hold overcharged
    assert s["remaining"] == [limit - c for limit, c in zip(LIMITS, real, strict=True)]
    for side in (OLD, NEW):
        check_usage(await releases.usage(side), real, [0, 0, 0], live=0)

    expiry, late = await usage_records(backend)
    assert (expiry.kind, expiry.outcome, expiry.estimate, expiry.requests) == (
        RecordKind.EXPIRY, "expired", True, 1,
    )  # fmt: skip
    assert (expiry.input_tokens, expiry.output_tokens, expiry.cost_nusd) == (
        100, 300, cost(100, 300),
    )  # fmt: skip
    assert (expiry.request_id, expiry.admitted_ms) == ("rq-r2", a["at"])
    assert (late.kind, late.requests, late.reservation_id) == (RecordKind.SETTLE, 0, "r2")
    assert (late.input_tokens, late.output_tokens) == (0, -50)
    assert late.admitted_ms == 0  # the reservation was gone: the expiry record kept no t0
    assert sums([expiry, late]) == real  # the rollup's total is what the counters hold
