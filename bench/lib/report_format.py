"""Number formatting shared by the benchmark report's tables."""

from __future__ import annotations

from typing import Any


def num(x: float | None, digits: int = 1) -> str:
    """``x`` with thousands separators, or a dash for no value."""
    if x is None:
        return "—"
    return f"{x:,.{digits}f}"


def pct(x: float, digits: int = 2) -> str:
    return f"{x * 100:+.{digits}f}%"


def share(x: float | None) -> str:
    """A share of the budget, capped at 100% (a '+' says it was more); a dash for none."""
    if x is None:
        return "—"
    return f"{min(x, 1.0) * 100:.1f}%{'+' if x > 1 else ''}"


def before_refusal(s: dict[str, Any]) -> str:
    """Budget spent before the first refusal: mean / worst tenant-run (old cells: a dash)."""
    mean, low = s.get("usable_before_refusal_mean"), s.get("usable_before_refusal_min")
    return "—" if mean is None else f"{share(mean)} / {share(low)}"


def queue_wait(s: dict[str, Any]) -> str:
    """The admission queue's wait, p50 / p99 over every answer of the cell."""
    p50, p99 = s.get("queue_wait_p50_ms"), s.get("queue_wait_p99_ms")
    return "—" if p50 is None or p99 is None else f"{p50:,.0f} / {p99:,.0f} ms"


def failed(c: dict[str, Any]) -> str:
    """Requests per tenant an SDK-like client gave up on; a dash for other clients."""
    value = c["summary"].get("failed_per_tenant")
    return num(value) if c.get("client") == "sdk" and value is not None else "—"


def ms(x: float | None) -> str:
    return "—" if x is None else f"{x:+.2f} ms"
