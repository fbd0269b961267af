"""What `hardcap usage` prints for a list of rows, and the windows it accepts."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from hardcap_core.rollup.report import HEADERS, format_table, parse_time, to_json, usd
from hardcap_core.rollup.table import UsageRow

NOW = int(datetime(2026, 3, 1, 12, 30, tzinfo=UTC).timestamp() * 1000)


def row(**changes: object) -> UsageRow:
    base = UsageRow(
        tenant="alpha", org="acme", key_id="alpha-dev", route="demo", model="mock-small",
        provider="mock", requests=2, input_tokens=30, output_tokens=200, reasoning_tokens=0,
        cached_input_tokens=4, cost_nusd=3_150_000, truncated=1, estimated=1, refused=0,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def cells(table: str, first: str) -> list[str]:
    return next(line.split() for line in table.splitlines() if line.startswith(first + " "))


def test_two_routes_to_one_model_are_one_line_and_the_total_adds_every_line() -> None:
    rows = [
        row(),
        row(route="demo-allow", requests=1, input_tokens=10, output_tokens=5, cost_nusd=125_000),
        row(tenant="beta", key_id="beta-dev", requests=0, input_tokens=0, output_tokens=0,
            cost_nusd=0, truncated=0, estimated=0, cached_input_tokens=0, refused=3),
    ]  # fmt: skip
    table = format_table(rows, NOW - 3_600_000, NOW)
    assert table.splitlines()[0] == "Usage from 2026-03-01 11:30:00 to 2026-03-01 12:30:00 UTC"
    assert table.splitlines()[2].split() == [*HEADERS[:8], "cost", "USD", *HEADERS[9:]]
    assert cells(table, "alpha") == [
        "alpha", "alpha-dev", "mock-small", "3", "40", "205", "0", "8", "0.003275", "2", "2", "0"
    ]  # fmt: skip
    assert cells(table, "beta")[3:] == ["0", "0", "0", "0", "0", "0.000000", "0", "0", "3"]
    assert cells(table, "total") == [
        "total", "3", "40", "205", "0", "8", "0.003275", "2", "2", "3"
    ]  # fmt: skip


def test_no_rows_says_so_with_the_window() -> None:
    assert format_table([], NOW - 60_000, NOW) == (
        "No usage from 2026-03-01 12:29:00 to 2026-03-01 12:30:00 UTC."
    )


def test_json_keeps_each_route_and_the_exact_cost() -> None:
    out = to_json([row(route="z"), row(route="a", cost_nusd=1)])
    assert [r["route"] for r in out] == ["a", "z"]
    assert out[0]["cost_nusd"] == 1 and out[0]["cost_usd"] == 1e-9
    assert out[1]["cost_usd"] == 0.00315
    assert set(out[0]) == {f.name for f in dataclasses.fields(UsageRow)} | {"cost_usd"}


@pytest.mark.parametrize(
    ("nusd", "shown"),
    [(0, "0.000000"), (999, "0.000000"), (1_000, "0.000001"), (-2_500_000_000, "-2.500000")],
)
def test_cost_in_dollars_to_the_millionth(nusd: int, shown: str) -> None:
    assert usd(nusd) == shown


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("now", NOW),
        ("90s", NOW - 90_000),
        ("30m", NOW - 1_800_000),
        ("24h", NOW - 86_400_000),
        ("7D", NOW - 7 * 86_400_000),
        ("2026-03-01", int(datetime(2026, 3, 1, tzinfo=UTC).timestamp() * 1000)),
        ("2026-03-01T12:00", NOW - 1_800_000),  # no offset: UTC
        ("2026-03-01T14:00+02:00", NOW - 1_800_000),
    ],
)
def test_windows_are_ages_or_iso_times(text: str, ms: int) -> None:
    assert parse_time(text, NOW) == ms


@pytest.mark.parametrize("text", ["yesterday", "h", "1w", "-1h", "1.5h", "2026-13-01", ""])
def test_a_bad_window_says_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match=r"neither an age \(90s, 30m, 1h, 24h, 7d\)"):
        parse_time(text, NOW)


def test_the_user_column_shows_only_when_a_row_has_a_user() -> None:
    rows = [row(), row(user="alpha~bob", requests=1, cost_nusd=5_000_000)]
    table = format_table(rows, NOW - 3_600_000, NOW)
    assert table.splitlines()[2].split()[:4] == ["tenant", "key", "user", "model"]
    lines = [line.split() for line in table.splitlines()[4:6]]
    assert [cells[:4] for cells in lines] == [
        ["alpha", "alpha-dev", "-", "mock-small"],  # requests without a user
        ["alpha", "alpha-dev", "alpha~bob", "mock-small"],
    ]
    assert cells(table, "total")[1:2] == ["3"]


def test_by_user_is_a_line_per_tenant_and_user_dearest_first() -> None:
    rows = [
        row(user="alpha~ann", cost_nusd=1_000),
        row(user="alpha~bob", key_id="alpha-ci", cost_nusd=7_000),
        row(user="alpha~bob", model="mock-large", cost_nusd=3_000),  # bob: 10,000 in all
        row(user=""),  # requests of the tenant's keys without a user
        row(tenant="beta", key_id="beta-dev", user="beta~zed", cost_nusd=2),
    ]
    table = format_table(rows, NOW - 3_600_000, NOW, by="user")
    assert table.splitlines()[2].split()[:3] == ["tenant", "user", "requests"]
    body = [line.split()[:3] for line in table.splitlines()[4:-2]]
    assert body == [
        ["alpha", "-", "2"],
        ["alpha", "alpha~bob", "4"],
        ["alpha", "alpha~ann", "2"],
        ["beta", "beta~zed", "2"],
    ]
    assert cells(table, "total")[1:2] == ["10"]
    out = to_json(rows, by="user")
    assert [(r["tenant"], r["user"], r["cost_nusd"]) for r in out] == [
        ("alpha", "", 3_150_000), ("alpha", "alpha~bob", 10_000), ("alpha", "alpha~ann", 1_000),
        ("beta", "beta~zed", 2),
    ]  # fmt: skip
    assert out[1]["cost_usd"] == 1e-5 and out[1]["requests"] == 4


def test_an_unknown_grouping_is_refused() -> None:
    with pytest.raises(ValueError, match="one of key, user"):
        format_table([row()], NOW - 60_000, NOW, by="model")
