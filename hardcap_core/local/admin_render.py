"""What ``hardcap admin`` prints of the admin API's replies: tables and sentences an operator
reads (``--json`` prints the reply itself instead)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

Render = Callable[[dict[str, Any]], str]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns under a header and a rule."""
    cells = [list(headers), *([_cell(v) for v in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def when(epoch: float | None) -> str:
    """Epoch seconds as UTC text; ``-`` for none."""
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _budgets_text(budgets: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"{b['dimension']} {b['limit']}/{b['window']}" for b in budgets) or "-"


def tenants(reply: dict[str, Any]) -> str:
    rows = [(t["id"], t["org"], t["disabled"], t["budgets"], t["keys"]) for t in reply["tenants"]]
    return table(("tenant", "org", "disabled", "budgets", "keys"), rows)


def orgs(reply: dict[str, Any]) -> str:
    rows = [(o["id"], o["disabled"], o["budgets"], ", ".join(o["tenants"]) or "-")
            for o in reply["orgs"]]  # fmt: skip
    return table(("org", "disabled", "budgets", "tenants"), rows)


def tenant(reply: dict[str, Any]) -> str:
    t = reply["tenant"]
    out = [f"tenant {t['id']}" + (" (disabled)" if t.get("disabled") else "")]
    for name in ("org", "routes", "fail_mode", "rate_limits", "users", "end_users"):
        if name in t:
            out.append(f"  {name}: {_cell(t[name])}")
    out.append(f"  budgets: {_budgets_text(t.get('budgets', []))}")
    out.append(f"  budgets now: {_budgets_text(reply['effective_budgets'])}")
    if reply["overrides"]:
        out += ["", overrides({"overrides": reply["overrides"]})]
    out += ["", keys({"keys": reply["keys"]}) if reply["keys"] else "No keys."]
    return "\n".join(out)


def saved(kind: str) -> Render:
    def render(reply: dict[str, Any]) -> str:
        item = reply[kind]
        changed = reply.get("changed", True)
        state = "saved" if changed else "unchanged"
        return f"{kind} {item['id']} {state} (config version {reply['version']})"

    return render


def keys(reply: dict[str, Any]) -> str:
    rows = [(k["id"], k["tenant"], k["status"], when(k["created_at"]), when(k["expires_at"]),
             when(k["revoked_at"]), when(k["last_used_at"])) for k in reply["keys"]]  # fmt: skip
    return table(("key", "tenant", "status", "created", "expires", "revoked", "last used"), rows)


def new_key(reply: dict[str, Any]) -> str:
    out = [
        f"New API key {reply['id']} for tenant {reply['tenant']} (shown once: store it now, "
        "Hardcap keeps only its hash):",
        "",
        f"  {reply['key']}",
        "",
    ]
    old = reply.get("replaces")
    if old:
        out.append(f"Key {old['id']} keeps working until {when(old['expires_at'])}.")
    out.append(f"(config version {reply['version']})")
    return "\n".join(out)


def revoked(reply: dict[str, Any]) -> str:
    key = reply["key"]
    return f"key {key['id']} revoked at {when(key['revoked_at'])} (version {reply['version']})"


def rules_set(reply: dict[str, Any]) -> str:
    rules = reply["rules"]
    rates = rules.get("rate_limits")
    return (
        f"{reply['level']} {reply['id']}: budgets {_budgets_text(rules.get('budgets', []))}; "
        f"rate limits {_cell(rates)} (config version {reply['version']})"
    )


def budget_set(reply: dict[str, Any]) -> str:
    o = reply.get("override")
    if o is None:
        return rules_set(reply)
    b = o["budget"]
    return (
        f"{o['level']} {o['level_id']}: {b['dimension']} {b['limit']}/{b['window']} until "
        f"{when(o['expires_at'])}, then its own budgets again (temporary budget {o['id']}, "
        f"config version {reply['version']})"
    )


def overrides(reply: dict[str, Any]) -> str:
    rows = [(o["id"], o["level"], o["level_id"], _budgets_text([o["budget"]]),
             when(o["expires_at"]), o["created_by"], o["reason"] or "-")
            for o in reply["overrides"]]  # fmt: skip
    if not rows:
        return "No temporary budgets."
    return table(("override", "level", "id", "budget", "until", "by", "reason"), rows)


def cancelled(reply: dict[str, Any]) -> str:
    return f"temporary budget {reply['override']['id']} ended (config version {reply['version']})"


def usage(reply: dict[str, Any]) -> str:
    from hardcap_core.rollup.report import format_table
    from hardcap_core.rollup.table import UsageRow

    names = set(UsageRow.__dataclass_fields__)
    rows = [UsageRow(**{k: v for k, v in r.items() if k in names}) for r in reply["rows"]]
    return format_table(rows, reply["start_ms"], reply["end_ms"])


def audit(reply: dict[str, Any]) -> str:
    rows = [(when(e["at"]), e["who"], e["action"], f"{e['kind']} {e['target']}",
             _what_changed(e["before"], e["after"]), e["version"])
            for e in reply["entries"]]  # fmt: skip
    if not rows:
        return "No changes recorded."
    return table(("when", "who", "action", "target", "changed", "version"), rows)


def _what_changed(before: Any, after: Any) -> str:
    """The fields a change touched, e.g. ``budgets, disabled``; ``created`` / ``deleted``."""
    if before is None:
        return "created"
    if after is None:
        return "deleted"
    if not isinstance(before, dict) or not isinstance(after, dict):
        return "-"
    names = sorted(k for k in {*before, *after} if before.get(k) != after.get(k))
    return ", ".join(names) or "-"
