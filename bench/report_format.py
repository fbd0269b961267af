"""Number formatting shared by the benchmark report's tables."""

from __future__ import annotations


def num(x: float | None, digits: int = 1) -> str:
    """``x`` with thousands separators, or a dash for no value."""
    if x is None:
        return "—"
    return f"{x:,.{digits}f}"
