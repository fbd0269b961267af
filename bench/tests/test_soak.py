"""The soak's verdict: what fails it (a dead gateway, memory or descriptors that grew, a ledger
below the mock's truth, a budget the truth passed, a hold left behind) and what does not."""

from __future__ import annotations

from typing import Any

from bench.failover.soak import FD_GROWTH, RSS_GROWTH_MB, verdict


def run(**changes: Any) -> dict[str, Any]:
    gateway = {"alive": True, "rss_mb": 100.0, "fds": 30, "healthz_worst_ms": 5.0}
    result: dict[str, Any] = {
        "exits": {"a": None, "b": None},
        "fatal_errors": [],
        "samples": [{"minute": m, "gateways": [dict(gateway), dict(gateway)]} for m in (1, 2, 3)],
        "ledger": {
            "big": {"billed": 900, "charged": 910, "reserved": 0, "limit": 10**12},
            "tight-0": {"billed": 3990, "charged": 4000, "reserved": 0, "limit": 4000},
        },
    }
    result.update(changes)
    return result


def test_a_clean_run_misses_nothing() -> None:
    assert verdict(run()) == []


def test_growth_past_the_allowance_fails_and_within_it_does_not() -> None:
    result = run()
    last = result["samples"][-1]["gateways"][1]
    last["rss_mb"] += RSS_GROWTH_MB - 1
    last["fds"] += FD_GROWTH
    assert verdict(result) == []
    last["rss_mb"] += 2
    last["fds"] += 1
    assert verdict(result) == [
        "gateway 1: RSS grew 100.0 -> 141.0 MB",
        "gateway 1: descriptors grew 30 -> 55",
    ]


def test_a_dead_gateway_a_lost_settle_an_overshoot_and_a_left_hold_each_fail() -> None:
    ledger = {
        "big": {"billed": 900, "charged": 899, "reserved": 0, "limit": 10**12},
        "tight-0": {"billed": 4001, "charged": 4001, "reserved": 16, "limit": 4000},
    }
    missed = verdict(run(exits={"a": -11, "b": None}, ledger=ledger))
    assert missed == [
        "a gateway died: exits {'a': -11, 'b': None}, []",
        "big: charged 899 < billed 900",
        "tight-0: billed 4001 past its limit 4000",
        "tight-0: 16 still held",
    ]
