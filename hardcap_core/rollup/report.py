"""What ``hardcap usage`` prints: spend per tenant, key (and user, where a row has one) and
model over a window, or per tenant and user (``--by user``) or lease (``--by lease``: requests
under none are one line, lease "-"), as a text table with a total row, or as JSON.

Pure formatting of :class:`hardcap_core.rollup.table.UsageRow` lists, so it imports nothing
from AWS; the rows come from :meth:`UsageTable.usage`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hardcap_core.rollup.table import UsageRow

NANO_USD = 1_000_000_000
BY_KEY = "key"  # a line per tenant, key, user (when any row has one) and model
BY_USER = "user"  # a line per tenant and user, dearest first: who spends
BY_LEASE = "lease"  # a line per tenant and lease, dearest first: what each lease spent
BY = (BY_KEY, BY_USER, BY_LEASE)
# The row attribute each name column shows.
_NAMES = {"tenant": "tenant", "key": "key_id", "user": "user", "model": "model", "lease": "lease"}
COUNTER_HEADERS = (
    "requests",
    "input",
    "output",
    "reasoning",
    "cached",
    "cost USD",
    "truncated",
    "estimated",
    "refused",
)
HEADERS = ("tenant", "key", "model", *COUNTER_HEADERS)  # the table of rows without users
# The counters a line of the table adds up, in the order of COUNTER_HEADERS.
COUNTERS = (
    "requests",
    "input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cached_input_tokens",
    "cost_nusd",
    "truncated",
    "estimated",
    "refused",
)
AGE_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def usd(nusd: int) -> str:
    """Nano-USD as dollars to the millionth (a short completion costs fractions of a cent)."""
    sign = "-" if nusd < 0 else ""
    whole, frac = divmod(abs(nusd), NANO_USD)
    return f"{sign}{whole}.{frac // 1000:06d}"


def columns(rows: Sequence[UsageRow], by: str = BY_KEY) -> tuple[str, ...]:
    """The columns that name a line: tenant and user ``by`` user; else tenant, key and model,
    with user between when a row has one (a deploy without users sees the table it saw)."""
    if by == BY_USER:
        return ("tenant", "user")
    if by == BY_LEASE:
        return ("tenant", "lease")
    if by != BY_KEY:
        raise ValueError(f"by {by!r}: one of {', '.join(BY)}")
    if any(row.user for row in rows):
        return ("tenant", "key", "user", "model")
    return ("tenant", "key", "model")


def lines(
    rows: Sequence[UsageRow], by: str = BY_KEY
) -> list[tuple[tuple[str, ...], dict[str, int]]]:
    """The rows summed per line (:func:`columns`): a route is a name for a model, and two
    routes to one model are one line of spend. Sorted by the names; ``by`` user, each tenant's
    users dearest first (requests without a user are one line, user "")."""
    names = [_NAMES[c] for c in columns(rows, by)]
    merged: dict[tuple[str, ...], dict[str, int]] = {}
    for row in rows:
        who = tuple(str(getattr(row, n)) for n in names)
        sums = merged.setdefault(who, dict.fromkeys(COUNTERS, 0))
        for name in COUNTERS:
            sums[name] += int(getattr(row, name))
    if by in (BY_USER, BY_LEASE):
        return sorted(merged.items(), key=lambda item: (item[0][0], -item[1]["cost_nusd"], item[0]))
    return sorted(merged.items())


def format_table(rows: Sequence[UsageRow], start_ms: int, end_ms: int, by: str = BY_KEY) -> str:
    """The text table: a header naming the window (UTC), one line per :func:`lines`, and a
    total line."""
    window = f"{_when(start_ms)} to {_when(end_ms)} UTC"
    summed = lines(rows, by)
    if not summed:
        return f"No usage from {window}."
    named = columns(rows, by)
    headers = [*named, *COUNTER_HEADERS]
    body = [[*(name or "-" for name in names), *_cells(sums)] for names, sums in summed]
    total = {name: sum(sums[name] for _, sums in summed) for name in COUNTERS}
    table = [headers, *body, ["total", *[""] * (len(named) - 1), *_cells(total)]]
    widths = [max(len(r[i]) for r in table) for i in range(len(headers))]
    out = [f"Usage from {window}", ""]
    for i, cells in enumerate(table):
        if i == len(table) - 1:
            out.append("  ".join("-" * w for w in widths))
        out.append(_line(cells, widths, len(named)))
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def to_json(rows: Sequence[UsageRow], by: str = BY_KEY) -> list[dict[str, Any]]:
    """``by`` key: the rows as they are (per route too; ``user`` "" without one); ``by`` user:
    a line per tenant and user, as the table. Each with ``cost_usd`` (a float, for reading)
    beside the exact ``cost_nusd``; sorted like the table."""
    if by in (BY_USER, BY_LEASE):
        return [
            {"tenant": tenant, by: who, **sums, "cost_usd": sums["cost_nusd"] / NANO_USD}
            for (tenant, who), sums in lines(rows, by)
        ]
    columns(rows, by)  # the same error for an unknown ``by``
    out = []
    for row in rows:
        item = dataclasses.asdict(row)
        item["cost_usd"] = int(row.cost_nusd) / NANO_USD
        out.append(item)
    return sorted(out, key=lambda r: (r["tenant"], r["key_id"], r["user"], r["model"], r["route"]))


def parse_time(text: str, now_ms: int) -> int:
    """``--since`` / ``--until``: an age (``90s``, ``30m``, ``1h``, ``24h``, ``7d``) before
    ``now_ms``, ``now``, or an ISO 8601 time (UTC unless it names an offset); milliseconds.

    Raises ValueError with a message that says what is accepted."""
    value = text.strip().lower()
    if value == "now":
        return now_ms
    if len(value) > 1 and value[-1] in AGE_UNITS and value[:-1].isdigit():
        return now_ms - int(value[:-1]) * AGE_UNITS[value[-1]]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an age (90s, 30m, 1h, 24h, 7d) nor an ISO 8601 time "
            "(2026-01-31, 2026-01-31T12:00, 2026-01-31T12:00+02:00)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _cells(sums: dict[str, int]) -> list[str]:
    return [usd(sums[n]) if n == "cost_nusd" else f"{sums[n]:,}" for n in COUNTERS]


def _line(cells: Sequence[str], widths: Sequence[int], text_columns: int) -> str:
    # The names are left-aligned, the counters right-aligned.
    parts = [
        c.ljust(w) if i < text_columns else c.rjust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    ]
    return "  ".join(parts).rstrip()


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
