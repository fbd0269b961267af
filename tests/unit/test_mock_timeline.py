"""The mock's per-tenant token timeline and the worst sliding window measured over it."""

from __future__ import annotations

from hardcap_core.local.mock_truth import GroundTruth, Timeline, worst_window


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_prompt_at_receive_and_completion_as_generated_land_in_their_slots() -> None:
    clock = Clock()
    truth = GroundTruth(clock=clock)
    account = truth.receive("acme", 40, None, refused=False)
    assert account is not None
    clock.t += 0.25
    account.add_tokens(7)
    account.add_tokens(3)
    clock.t += 0.02
    account.add_tokens(1)
    truth.receive("acme", 99, None, refused=True)  # an injected error bills nothing
    assert truth.timeline_json("acme")["rows"] == [[1_000_000, 40, 0], [1_000_200, 0, 11]]
    truth.reset()
    assert truth.timeline_json("acme")["rows"] == []


def test_memory_is_bounded_to_the_most_recent_slots() -> None:
    clock = Clock()
    line = Timeline(clock, max_slots=3)
    for _ in range(5):
        line.add(prompt=1)
        clock.t += 0.1
    assert [r[0] for r in line.rows()] == [1_000_200, 1_000_300, 1_000_400]


def test_worst_window_is_the_most_in_any_minute_of_slots() -> None:
    rows = [[0, 100, 0], [30_000, 0, 50], [59_900, 10, 0], [60_000, 500, 0], [119_900, 0, 1]]
    w = worst_window(rows)
    # [100 ms, 60.1 s) holds 50 + 10 + 500; the first minute [0, 60 s) only 160.
    assert (w["tokens"], w["start_ms"]) == (560, 100)
    # One slot more (a window that starts inside a slot) can also touch the first slot.
    assert w["bound"] == 660
    assert worst_window([]) == {"tokens": 0, "start_ms": 0, "bound": 0}
    assert worst_window([[5_000, 3, 4]])["tokens"] == 7
