"""The buckets a usage window is summed from cover exactly its minutes, with the fewest rows."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hardcap_core.rollup.table import GRANULARITY_MS, cover

MINUTE = GRANULARITY_MS["m"]
START = 1_780_000_000_000  # 2026


def minutes(runs: list[tuple[str, int, int]]) -> list[int]:
    out = []
    for g, first, last in runs:
        size = GRANULARITY_MS[g]
        assert first <= last and first % size == 0 and last % size == 0
        out += [m for b in range(first, last + size, size) for m in range(b, b + size, MINUTE)]
    return out


@given(st.integers(0, 90 * 86_400_000), st.integers(1, 40 * 86_400_000))
def test_cover_is_exactly_the_windows_minutes(offset: int, length: int) -> None:
    start, end = START + offset, START + offset + length
    got = minutes(cover(start, end))
    first, stop = start // MINUTE * MINUTE, -(-end // MINUTE) * MINUTE
    assert got == list(range(first, stop, MINUTE))  # in order, none twice, none missing


def test_a_month_takes_days_not_minutes() -> None:
    day = GRANULARITY_MS["d"]
    runs = cover(START // day * day, START // day * day + 30 * day + 90 * MINUTE)
    assert [g for g, _, _ in runs] == ["d", "h", "m"]
