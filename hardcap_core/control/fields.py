"""The admin API's fields: a request's ids, levels, budgets and durations checked (a 400 naming
the field), and what a reply shows of a key, a temporary budget and a change (never a key's
hash or plaintext)."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from hardcap_core.budgets import ID_PATTERN
from hardcap_core.control.state import KeyRecord, Override
from hardcap_core.control.store import Change
from hardcap_core.errors import InvalidRequest

LEVELS = ("org", "tenant", "key", "users")  # where a budget or a rate limit may be set
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_KEY_RULES = ("budgets", "rate_limits", "queue_priority")  # what a key's document holds


def level_of(body: Mapping[str, Any]) -> tuple[str, str]:
    """The request's ``level`` (org, tenant, key, users) and ``id``."""
    level = body.get("level")
    if level not in LEVELS:
        raise InvalidRequest(f"level is one of {', '.join(LEVELS)}", param="level")
    return str(level), ident(body.get("id"), "id")


def budget(body: Mapping[str, Any], *, with_limit: bool) -> dict[str, Any]:
    """The request's budget as a ``budgets:`` entry, checked field by field."""
    from pydantic import ValidationError

    from hardcap_core.config.schema import BudgetConfig

    raw = {k: body.get(k) for k in ("dimension", "window", "limit")}
    if not with_limit:
        raw["limit"] = 0
    try:
        checked = BudgetConfig.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "limit"
        got = first.get("input")
        shown = f" (got {got!r})" if isinstance(got, str | int | float) else ""
        raise InvalidRequest(f"{field}: {first['msg']}{shown}", param=field) from None
    out: dict[str, Any] = {"dimension": checked.dimension.value, "window": checked.window}
    if with_limit:  # a number as the file writes it: whole tokens, or USD with a fraction
        whole = checked.limit == checked.limit.to_integral_value()
        out["limit"] = int(checked.limit) if whole else float(checked.limit)
    return out


def ident(value: Any, param: str) -> str:
    """An org, tenant, key or override id from the request (a 400 naming ``param``)."""
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise InvalidRequest(f"{param} must match {ID_PATTERN.pattern}", param=param)
    return value


def seconds(value: Any, param: str) -> float:
    """A duration: seconds, or text like ``90s``, ``30m``, ``36h``, ``7d``, ``2w``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        duration = float(value)
    elif isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?[smhdw]", value.strip()):
        text = value.strip()
        duration = float(text[:-1]) * DURATION_UNITS[text[-1]]
    else:
        raise InvalidRequest(f"{param}: a duration like 3600, 90m, 36h or 7d", param=param)
    if not 0 < duration < math.inf:
        raise InvalidRequest(f"{param}: a duration more than 0", param=param)
    return duration


def until(body: Mapping[str, Any], now: float) -> float:
    """When a temporary budget ends: ``until`` (ISO 8601, UTC unless it says, or epoch
    seconds) or ``for`` a duration from now."""
    if "for" in body and "until" in body:
        raise InvalidRequest("give until or for, not both", param="for")
    if "for" in body:
        return now + seconds(body["for"], "for")
    value = body["until"]
    if isinstance(value, int | float) and not isinstance(value, bool):
        ends = float(value)
    else:
        try:
            when = datetime.fromisoformat(str(value))
        except ValueError:
            raise InvalidRequest("until: an ISO 8601 time like 2026-07-01T00:00Z",
                                 param="until") from None  # fmt: skip
        ends = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    if ends <= now:
        raise InvalidRequest("until is in the past", param="until")
    return ends


def time_arg(parse: Callable[[str, int], int], text: str, now_ms: int, param: str) -> int:
    """``parse(text, now_ms)`` (``--since`` style times), its ValueError a 400 naming ``param``."""
    try:
        return parse(text, now_ms)
    except ValueError as e:
        raise InvalidRequest(f"{param}: {e}", param=param) from None


def key_view(
    record: KeyRecord, now: float, last_used: Mapping[tuple[str, str], float]
) -> dict[str, Any]:
    """A key as the API shows it: never its hash, never the key."""
    if record.revoked_at is not None:
        status = "revoked"
    elif record.expires_at is not None:
        status = "expiring" if now < record.expires_at else "expired"
    else:
        status = "active"
    return {
        "id": record.id,
        "tenant": record.tenant,
        "status": status,
        "created_at": record.created_at,
        "created_by": record.created_by,
        "expires_at": record.expires_at,
        "revoked_at": record.revoked_at,
        "last_used_at": last_used.get((record.tenant, record.id)),
        **{k: v for k, v in record.doc.items() if k in _KEY_RULES},
    }


def override_view(o: Override) -> dict[str, Any]:
    """A temporary budget as the API shows it: every field."""
    return dataclasses.asdict(o)


def change_view(c: Change) -> dict[str, Any]:
    """A change as ``config plan|apply`` show it: keys by id, never their hash."""

    def plain(value: Any) -> Any:
        if isinstance(value, KeyRecord):
            return {k: v for k, v in dataclasses.asdict(value).items() if k != "hash"}
        if isinstance(value, Override):
            return dataclasses.asdict(value)
        return None if value is None else dict(value)

    target = c.id
    record = c.after if c.after is not None else c.before
    if isinstance(record, KeyRecord):
        target = record.id
    return {"kind": c.kind, "id": target, "action": c.action,
            "before": plain(c.before), "after": plain(c.after)}  # fmt: skip


def live_sections(body: Mapping[str, Any], file_data: Mapping[str, Any]) -> dict[str, Any]:
    """The deployed file with ``body``'s ``orgs`` and ``tenants`` (``config plan|apply``): the
    other sections are the deployed file's, never the request's."""
    extra = sorted(set(body) - {"orgs", "tenants"})
    if extra:
        raise InvalidRequest(
            f"only orgs and tenants are live; {extra[0]} stays in the deployed file",
            param=extra[0],
        )
    for section in ("orgs", "tenants"):
        if not isinstance(body.get(section, []), list):
            raise InvalidRequest(f"{section} must be a list", param=section)
    return {**file_data, "orgs": body.get("orgs", []), "tenants": body.get("tenants", [])}
