"""LoopLag: the lateness it reports, the recent maximum that expires, the shedding hysteresis;
and the refusal the Shedder raises from it."""

from __future__ import annotations

import asyncio
import time

import pytest

from hardcap_core.errors import Overloaded
from hardcap_core.gateway.loop_lag import LoopLag
from hardcap_core.gateway.shed import Shedder


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lag(**kwargs: float) -> tuple[LoopLag, Clock]:
    clock = Clock()
    return LoopLag(clock=clock, **kwargs), clock


def test_reports_the_last_ticks_lateness_and_never_a_negative_one() -> None:
    monitor, clock = lag()
    monitor.observe(0.040)
    assert monitor.current_s() == pytest.approx(0.040)
    clock.now += 0.025
    monitor.observe(-0.001)  # a timer that ran early is not late
    assert monitor.current_s() == 0.0


def test_recent_max_remembers_a_stall_for_the_horizon_then_forgets_it() -> None:
    monitor, clock = lag(horizon_s=10.0)
    monitor.observe(0.300)
    for _ in range(8):  # eight seconds of small lags: the stall is still recent
        clock.now += 1.0
        monitor.observe(0.002)
    assert monitor.recent_max_s() == pytest.approx(0.300)
    clock.now += 3.0  # past the horizon
    monitor.observe(0.002)
    assert monitor.recent_max_s() == pytest.approx(0.002)


def test_recent_max_is_the_largest_of_several_stalls() -> None:
    monitor, clock = lag()
    for late in (0.050, 0.200, 0.080):
        clock.now += 0.5
        monitor.observe(late)
    assert monitor.recent_max_s() == pytest.approx(0.200)
    assert monitor.current_s() == pytest.approx(0.080)


def test_sheds_above_the_threshold_and_stays_on_for_the_hold() -> None:
    monitor, clock = lag(threshold_s=0.100, hold_s=1.0)
    monitor.observe(0.050)
    assert not monitor.shedding()
    monitor.observe(0.150)
    assert monitor.shedding()
    for _ in range(3):  # back under the threshold, but not for long enough
        clock.now += 0.25
        monitor.observe(0.010)
        assert monitor.shedding()
    clock.now += 0.3
    monitor.observe(0.010)
    assert not monitor.shedding()


def test_a_threshold_of_zero_never_sheds() -> None:
    monitor, _ = lag(threshold_s=0.0)
    monitor.observe(5.0)
    assert not monitor.shedding()
    assert monitor.recent_max_s() == pytest.approx(5.0)


def test_measures_a_blocked_loop() -> None:
    async def run() -> float:
        monitor = LoopLag(interval_s=0.005)
        monitor.start()
        await asyncio.sleep(0.02)
        asyncio.get_running_loop().call_soon(time.sleep, 0.1)  # blocks the loop: the tick is late
        await asyncio.sleep(0.2)
        await monitor.stop()
        assert not monitor.running
        return monitor.recent_max_s()

    assert asyncio.run(run()) >= 0.05


def test_the_shedder_refuses_with_retry_headers_while_shedding() -> None:
    monitor, clock = lag(threshold_s=0.100, hold_s=1.0)
    shedder = Shedder(monitor, clock=clock)
    shedder.check()  # not shedding: returns
    monitor.observe(0.5)
    with pytest.raises(Overloaded) as refused:
        shedder.check()
    error = refused.value
    assert (error.status, error.type, error.code) == (503, "overloaded_error", "overloaded")
    assert error.headers == {
        "retry-after": "1",
        "retry-after-ms": "1000",
        "x-should-retry": "true",
    }
