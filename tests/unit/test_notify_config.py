"""``notify_at`` on every budget: 50/80/100 unless the budget says, ``[]`` for none, each
threshold once and within 1..1000 %, carried to the budget at every level (a users: template's
to each user's budget) and left out of a budget's identity (the ledger counts alike)."""

from __future__ import annotations

from typing import Any

import pytest

from hardcap_core.auth import hash_key
from hardcap_core.budgets import Budget, Dimension, Level, LevelKind, Window
from hardcap_core.config import parse_config
from hardcap_core.errors import ConfigError


def data(**budgets: list[dict[str, Any]]) -> dict[str, Any]:
    def with_(level: str, limit: int = 1000) -> list[dict[str, Any]]:
        base = {"dimension": "total_tokens", "limit": limit, "window": "day"}
        return [{**base, **extra} for extra in budgets.get(level, [{}])]

    return {
        "upstreams": [{"name": "u", "base_url": "https://api.openai.com/v1"}],
        "routes": [{"name": "r", "upstream": "u",
                    "price": {"input_per_million": 1, "output_per_million": 2}}],
        "orgs": [{"id": "acme", "budgets": with_("org", 5000)}],
        "tenants": [{
            "id": "alpha", "org": "acme", "budgets": with_("tenant"),
            "users": {"budgets": with_("users", 100)},
            "keys": [{"id": "alpha-k", "hash": hash_key("sk-a"), "budgets": with_("key", 500)}],
        }],
    }  # fmt: skip


def notify_at_by_level(config_data: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    config = parse_config(config_data, "t.yaml", environ={})
    principal = config.principal_by_id("alpha-k")
    assert principal is not None and principal.users is not None
    scope = principal.users.scope(principal.scope, Level(LevelKind.USER, "alpha~bob"))
    return {b.level.kind.value: b.notify_at for b in scope.budgets}


def test_every_budget_notifies_at_50_80_100_by_default() -> None:
    assert notify_at_by_level(data()) == {
        "key": (50, 80, 100), "tenant": (50, 80, 100), "org": (50, 80, 100),
        "user": (50, 80, 100),
    }  # fmt: skip


def test_each_level_carries_its_own_thresholds_sorted() -> None:
    config_data = data(
        org=[{"notify_at": []}], tenant=[{"notify_at": [100, 90]}],
        key=[{"notify_at": [25]}], users=[{"notify_at": [75, 150]}],
    )  # fmt: skip
    assert notify_at_by_level(config_data) == {
        "key": (25,), "tenant": (90, 100), "org": (), "user": (75, 150)
    }  # fmt: skip


@pytest.mark.parametrize(
    ("notify_at", "message"),
    [
        ([50, 50], "each threshold once"),
        ([0], "greater than or equal to 1"),
        ([1001], "less than or equal to 1000"),
        (["half"], "valid integer"),
    ],
)
def test_bad_thresholds_name_the_field(notify_at: list[Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data(tenant=[{"notify_at": notify_at}]), "t.yaml", environ={})
    assert "tenants[0].budgets[0].notify_at" in str(info.value)
    assert message in str(info.value)


def test_thresholds_are_not_part_of_a_budgets_identity() -> None:
    level = Level(LevelKind.TENANT, "alpha")
    plain = Budget(level, Dimension.TOTAL_TOKENS, 10, Window("day"))
    assert plain == Budget(level, Dimension.TOTAL_TOKENS, 10, Window("day"), notify_at=(5,))
    assert plain.field == "t:alpha:tot:d"
