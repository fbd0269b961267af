"""The rollup's cadence, which the Lambda's invocation and ``hardcap serve``'s timer share
(``rollup/run.py`` ``paced_passes``): a pass starts every interval from the start of the one
before, not an interval after it ends, and only the first (then one every ``full_every_s``) is
full. A lost cache forgets what settled since the last pass, so the cadence is the bound."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from hardcap_core.config import parse_config
from hardcap_core.config.settings import ROLLUP_INTERVAL_SECONDS
from hardcap_core.local.rollup_timer import RollupTimer
from hardcap_core.rollup import run
from hardcap_core.rollup.run import RollupReport, paced_passes
from tests.stack import config_data


class Clock:
    """Time that moves only when a pass works or the loop sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


async def test_passes_start_every_interval_from_the_last_start_and_only_the_first_is_full() -> None:
    clock = Clock()
    passes: list[tuple[float, bool]] = []

    async def one_pass(full: bool, started: float) -> RollupReport:
        passes.append((started, full))
        clock.now += 3.0 if full else 1.0  # a full pass takes longer
        return RollupReport()

    total = await paced_passes(one_pass, interval_s=5.0, until=22.0, sleep=clock.sleep, clock=clock)
    assert passes == [(0.0, True), (5.0, False), (10.0, False), (15.0, False), (20.0, False)]
    assert total is not None and total.passes == 5


async def test_a_long_pass_is_followed_at_once_and_a_failed_first_leaves_the_next_full() -> None:
    clock = Clock()
    passes: list[tuple[float, bool]] = []

    async def one_pass(full: bool, started: float) -> RollupReport | None:
        passes.append((started, full))
        clock.now += 7.0 if len(passes) == 2 else 1.0
        return None if len(passes) == 1 else RollupReport()  # the first fails

    await paced_passes(one_pass, interval_s=5.0, until=20.0, sleep=clock.sleep, clock=clock)
    assert passes == [(0.0, True), (5.0, True), (12.0, False), (17.0, False)]


async def test_a_full_pass_comes_again_every_full_every_s() -> None:
    clock = Clock()
    fulls: list[float] = []

    async def one_pass(full: bool, started: float) -> RollupReport:
        if full:
            fulls.append(started)
        return RollupReport()

    await paced_passes(
        one_pass, interval_s=5.0, until=130.0, full_every_s=60.0, sleep=clock.sleep, clock=clock
    )
    assert fulls == [0.0, 60.0, 120.0]


async def test_an_idle_invocation_is_one_pass_and_traffic_keeps_the_passes_going() -> None:
    """An idle stack pays for one pass a minute, not ~52 s of passes over empty streams; while
    records keep arriving the passes keep the interval, and a lull longer than the linger ends
    the invocation (the next scheduled one picks up)."""

    async def passes_with(work: set[float], until: float = 55.0) -> list[float]:
        clock, started = Clock(), list[float]()

        async def one_pass(full: bool, at: float) -> RollupReport | None:
            started.append(at)
            clock.now += 0.5
            if at in work:
                return None if at == -1.0 else RollupReport(applied=3)
            return RollupReport()

        await paced_passes(
            one_pass, interval_s=5.0, until=until, linger_s=12.0, sleep=clock.sleep, clock=clock
        )
        return started

    assert await passes_with(set()) == [0.0]
    busy = {float(t) for t in range(0, 55, 5)}
    assert await passes_with(busy) == sorted(busy)
    # Work until 10 s, then none: passes at 15 and 20 s (within 12 s of the last work), no more.
    assert await passes_with({0.0, 5.0, 10.0}) == [0.0, 5.0, 10.0, 15.0, 20.0]


async def test_a_failed_pass_counts_as_work_so_the_next_retries_it() -> None:
    clock, started = Clock(), list[float]()

    async def one_pass(full: bool, at: float) -> RollupReport | None:
        started.append(at)
        return None if at == 0.0 else RollupReport()  # DynamoDB refused the first

    await paced_passes(
        one_pass, interval_s=5.0, until=55.0, linger_s=5.0, sleep=clock.sleep, clock=clock
    )
    assert started == [0.0, 5.0]


def test_the_local_timer_keeps_the_cadence_and_the_cli_its_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``hardcap serve``'s timer runs through ``paced_passes``: only its first pass is full
    (and the last, at stop); its interval's default is the Lambda's (one constant:
    config/settings.py)."""
    fulls: list[bool] = []
    three = threading.Event()

    async def recorded(*args: Any, first_pass: bool = True, **kwargs: Any) -> RollupReport:
        fulls.append(first_pass)
        if len(fulls) >= 3:
            three.set()
        return RollupReport()

    monkeypatch.setattr(run, "run_rollup", recorded)
    config = parse_config(config_data("http://127.0.0.1:9", "redis://127.0.0.1:9"))
    timer = RollupTimer(config, table=None, interval_s=0.02)  # type: ignore[arg-type]

    async def no_cache() -> None:
        return None

    monkeypatch.setattr(timer, "_cache", no_cache)
    with timer:
        assert three.wait(10)
    assert fulls[:3] == [True, False, False] and fulls[-1] is True
    default = RollupTimer(config, table=None)  # type: ignore[arg-type]
    assert default.interval_s == ROLLUP_INTERVAL_SECONDS
    assert run.INTERVAL_S == ROLLUP_INTERVAL_SECONDS
