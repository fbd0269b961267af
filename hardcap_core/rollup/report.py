"""What ``hardcap usage`` prints: spend per tenant, key and model over a window, as a text
table with a total row, or as JSON.

Pure formatting of :class:`hardcap_core.rollup.table.UsageRow` lists, so it imports nothing
from AWS; the rows come from :meth:`UsageTable.usage`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hardcap_core.rollup.table import UsageRow

NANO_USD = 1_000_000_000
HEADERS = (
    "tenant",
    "key",
    "model",
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
# The counters a line of the table adds up, in the order of the HEADERS after "model".
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
TEXT_COLUMNS = 3  # tenant, key, model: left-aligned; the counters are right-aligned


def usd(nusd: int) -> str:
    """Nano-USD as dollars to the millionth (a short completion costs fractions of a cent)."""
    sign = "-" if nusd < 0 else ""
    whole, frac = divmod(abs(nusd), NANO_USD)
    return f"{sign}{whole}.{frac // 1000:06d}"


def lines(rows: Iterable[UsageRow]) -> list[tuple[tuple[str, str, str], dict[str, int]]]:
    """The rows summed per (tenant, key, model), sorted: a route is a name for a model, and
    two routes to one model are one line of spend."""
    merged: dict[tuple[str, str, str], dict[str, int]] = {}
    for row in rows:
        sums = merged.setdefault((row.tenant, row.key_id, row.model), dict.fromkeys(COUNTERS, 0))
        for name in COUNTERS:
            sums[name] += int(getattr(row, name))
    return sorted(merged.items())


def format_table(rows: Sequence[UsageRow], start_ms: int, end_ms: int) -> str:
    """The text table: a header naming the window (UTC), one line per tenant, key and model,
    and a total line."""
    window = f"{_when(start_ms)} to {_when(end_ms)} UTC"
    summed = lines(rows)
    if not summed:
        return f"No usage from {window}."
    body = [[*(name or "-" for name in names), *_cells(sums)] for names, sums in summed]
    total = {name: sum(sums[name] for _, sums in summed) for name in COUNTERS}
    table = [list(HEADERS), *body, ["total", "", "", *_cells(total)]]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADERS))]
    out = [f"Usage from {window}", ""]
    for i, cells in enumerate(table):
        if i == len(table) - 1:
            out.append("  ".join("-" * w for w in widths))
        out.append(_line(cells, widths))
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def to_json(rows: Iterable[UsageRow]) -> list[dict[str, Any]]:
    """The rows as they are (per route too), each with ``cost_usd`` (a float, for reading)
    beside the exact ``cost_nusd``; sorted like the table."""
    out = []
    for row in rows:
        item = dataclasses.asdict(row)
        item["cost_usd"] = int(row.cost_nusd) / NANO_USD
        out.append(item)
    return sorted(out, key=lambda r: (r["tenant"], r["key_id"], r["model"], r["route"]))


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


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    parts = [
        c.ljust(w) if i < TEXT_COLUMNS else c.rjust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    ]
    return "  ".join(parts).rstrip()


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
