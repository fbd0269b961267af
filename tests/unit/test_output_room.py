"""The output cap a stream's provider is sent: no more than the budgets held for it."""

from __future__ import annotations

import pytest

from hardcap_core.budgets import Budget, Dimension, Level, LevelKind, Prices, Scope, Window
from hardcap_core.gateway.answers import output_room
from hardcap_core.ledger import Admitted, BudgetState, Reservation

TENANT = Level(LevelKind.TENANT, "t")
ORG = Level(LevelKind.ORG, "o")
PRICES = Prices(input_nusd=100, output_nusd=1_000)


def admitted(reserved: int, *states: tuple[Level, Dimension, int]) -> Admitted:
    budgets = [Budget(level, dim, 10**9, Window.parse("day")) for level, dim, _ in states]
    scope = Scope((TENANT, ORG), tuple(budgets))
    held = Reservation("r", scope, PRICES, 10, reserved)
    rows = tuple(
        BudgetState(b, left, 1000) for b, (_, _, left) in zip(budgets, states, strict=True)
    )
    return Admitted(held, rows, (), 0)


@pytest.mark.parametrize(
    ("states", "room"),
    [
        # The reservation plus what the tightest output-counting budget had left after it.
        ([(TENANT, Dimension.OUTPUT_TOKENS, 50)], 150),
        ([(TENANT, Dimension.TOTAL_TOKENS, 30), (ORG, Dimension.OUTPUT_TOKENS, 500)], 130),
        # An overspent budget leaves nothing beyond the reservation.
        ([(TENANT, Dimension.TOTAL_TOKENS, -40)], 100),
        # Money: what is left buys this many output tokens at the route's price.
        ([(TENANT, Dimension.COST_USD, 25_500)], 125),
        # An input budget says nothing about output.
        ([(TENANT, Dimension.INPUT_TOKENS, 0), (ORG, Dimension.OUTPUT_TOKENS, 7)], 107),
    ],
)
def test_the_room_is_the_hold_and_what_the_tightest_budget_had_left(
    states: list[tuple[Level, Dimension, int]], room: int
) -> None:
    assert output_room(admitted(100, *states), PRICES) == room


def test_no_budget_on_output_sets_no_room() -> None:
    assert output_room(admitted(100, (TENANT, Dimension.INPUT_TOKENS, 5)), PRICES) is None
    free = Prices(input_nusd=0, output_nusd=0)
    assert output_room(admitted(100, (TENANT, Dimension.COST_USD, 5)), free) is None
