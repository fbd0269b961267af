"""Route and upstream limits over every tenant in the config: what they build, what is refused."""

from __future__ import annotations

from typing import Any

import pytest

from hardcap_core.budgets import Window
from hardcap_core.errors import ConfigError
from hardcap_core.ledger.allowances import MINUTE
from tests.unit.test_config import base, parse


def _with(route: dict[str, Any] | None = None, upstream: dict[str, Any] | None = None) -> Any:
    data = base()
    data["routes"][0].update(route or {})
    data["upstreams"][0].update(upstream or {})
    return parse(data)


def test_a_route_without_limits_has_no_shared_rows() -> None:
    assert parse(base()).routes["gpt-4o-mini"].shared is None


def test_route_and_upstream_limits_build_shared_rows_route_first() -> None:
    config = _with(
        route={"budgets": [{"dimension": "output_tokens", "limit": 5000, "window": "1h"}]},
        upstream={
            "budgets": [{"dimension": "cost_usd", "limit": 2.5, "window": "day"}],
            "rate_limits": {"requests_per_minute": 450, "tokens_per_minute": 90000},
        },
    )
    shared = config.routes["gpt-4o-mini"].shared
    assert shared is not None
    rows = [(b.owner, b.dim, b.measure, b.limit, b.window) for b in shared.budgets]
    assert rows == [
        ("route:gpt-4o-mini", "out", "out", 5000, Window("fixed", 3600)),
        ("upstream:openai", "usd", "usd", 2_500_000_000, Window("day")),  # nano-USD
        ("upstream:openai", "req", "rpm", 450, MINUTE),  # fixed minute windows
        ("upstream:openai", "tot", "tpm", 90000, MINUTE),
    ]
    fields = [b.field for b in shared.budgets]
    assert fields == ["rt:gpt-4o-mini:out:f3600", "up:openai:usd:d", "up:openai:rpm:f60",
                      "up:openai:tpm:f60"]  # fmt: skip
    assert config.upstreams["openai"].shared == shared.budgets[1:]


@pytest.mark.parametrize(
    ("route", "upstream", "expected"),
    [
        ({"budgets": [{"dimension": "total_tokens", "limit": -1, "window": "day"}]}, None,
         "routes[0].budgets[0].limit"),
        (None, {"budgets": [{"dimension": "total_tokens", "limit": 10, "window": "fortnight"}]},
         "upstreams[0].budgets[0].window"),
        (None, {"rate_limits": {"requests_per_minute": 0}},
         "upstreams[0].rate_limits.requests_per_minute"),
        ({"budgets": [{"dimension": "input_tokens", "limit": 10, "window": "day"},
                      {"dimension": "input_tokens", "limit": 20, "window": " Day"}]}, None,
         "two input_tokens budgets"),
        (None, {"budgets": [{"dimension": "total_tokens", "limit": 1.5, "window": "day"}]},
         "whole number"),
    ],
)  # fmt: skip
def test_bad_shared_limits_are_refused_naming_the_field(
    route: dict[str, Any] | None, upstream: dict[str, Any] | None, expected: str
) -> None:
    with pytest.raises(ConfigError) as e:
        _with(route, upstream)
    assert expected in str(e.value)
