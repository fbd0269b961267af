"""What the admin verbs change, without I/O: item changes applied to a live state, the tenant
hierarchies they touch (whose gateways must hear of them), a level's rules edited in its
document, and a validation error of the joined config named by ids instead of positions."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from hardcap_core.budgets import Window
from hardcap_core.control.state import KeyRecord, LiveState
from hardcap_core.control.store import Change
from hardcap_core.errors import ConfigError, GatewayError, InvalidRequest, NotFound

_PROBLEM = re.compile(r"^\s*(?P<loc>[^\s:][^:]*): (?P<what>.*)$")
_INDEXED = re.compile(r"\b(?P<section>orgs|tenants)\[(?P<i>\d+)\](?:\.keys\[(?P<k>\d+)\])?")
Kind = Literal["org", "tenant"]


class Conflict(GatewayError):
    """409: the change contradicts what the table holds (an id taken, a key already revoked),
    or the table kept moving under the change."""

    status = 409
    type = "conflict_error"
    code = "conflict"


@dataclasses.dataclass(frozen=True, slots=True)
class Built:
    """What a verb builds on a state: its item changes and its reply (without the version)."""

    changes: list[Change]
    reply: dict[str, Any]


def diff(state: LiveState, data: Mapping[str, Any], now: float, who: str) -> list[Change]:
    """The changes that make the live orgs, tenants and keys what ``data`` (a whole file's
    sections) says; a 400 naming the field when ``data`` does not validate."""
    from hardcap_core.control import plan

    try:
        return plan.diff(state, data, now, who=who)
    except ConfigError as e:
        raise invalid(e, data) from None


def invalid(error: ConfigError, data: Mapping[str, Any]) -> InvalidRequest:
    """A validation error as a 400: every problem, ``param`` the first one's field."""
    problems = [_named(line, data) for line in str(error).splitlines()[1:]] or [str(error)]
    loc = _PROBLEM.match(problems[0])
    return InvalidRequest("; ".join(problems), param=loc.group("loc") if loc else None)


def _named(problem: str, data: Mapping[str, Any]) -> str:
    """A validation problem with list positions of the joined config (sorted by id, not where
    the operator wrote anything) replaced by ids: ``tenants[acme].keys[acme-1].budgets[0]``."""

    def by_id(m: re.Match[str]) -> str:
        section, i = m.group("section"), int(m.group("i"))
        items = data.get(section) or []
        item = items[i] if i < len(items) else {}
        out = f"{section}[{item.get('id', i)}]"
        if m.group("k") is not None:
            k = int(m.group("k"))
            keys = item.get("keys") or []
            out += f".keys[{keys[k].get('id', k) if k < len(keys) else k}]"
        return out

    return _INDEXED.sub(by_id, problem.strip())


def applied(state: LiveState, changes: Iterable[Change], version: int | None = None) -> LiveState:
    """``state`` with ``changes`` made (as the table will hold them), at the next version."""
    orgs, tenants = dict(state.orgs), dict(state.tenants)
    keys, overrides = dict(state.keys), {o.id: o for o in state.overrides}
    places: dict[str, dict[str, Any]] = {
        "org": orgs, "tenant": tenants, "key": keys, "override": overrides
    }  # fmt: skip
    for c in changes:
        place = places[c.kind]
        if c.after is None:
            place.pop(c.id, None)
        else:
            place[c.id] = c.after
    new = state.version + 1 if version is None else version
    return LiveState(new, orgs, tenants, keys, tuple(overrides.values()))


def as_written(state: LiveState) -> LiveState:
    """``state`` as a table that was written (join then uses its orgs and tenants, not the
    file's), for a state read before the first write."""
    return state if state.initialized else dataclasses.replace(state, version=1)


def _root_of(state: LiveState, tenant: str) -> str | None:
    doc = state.tenants.get(tenant)
    if doc is None:
        return None
    org = doc.get("org")
    return f"o:{org}" if org else f"t:{tenant}"


def roots(before: LiveState, after: LiveState, changes: Iterable[Change]) -> list[str]:
    """The root tag of every hierarchy ``changes`` touch, as it was and as it is."""
    out: dict[str, None] = {}
    for c in changes:
        for state, value in ((before, c.before), (after, c.after)):
            if value is None:
                continue
            for root in _roots_of(state, c.kind, c.id, value):
                if root is not None:
                    out.setdefault(root)
    return list(out)


def _roots_of(state: LiveState, kind: str, ident: str, value: Any) -> list[str | None]:
    if kind == "org":
        return [f"o:{ident}"]
    if kind == "tenant":
        return [f"o:{value['org']}" if value.get("org") else f"t:{ident}"]
    if kind == "key":
        return [_root_of(state, value.tenant)]
    if value.level == "org":
        return [f"o:{value.level_id}"]
    if value.level == "tenant":
        return [_root_of(state, value.level_id)]
    record = next((r for r in state.keys.values() if r.id == value.level_id), None)
    return [_root_of(state, record.tenant)] if record else []


def docs(state: LiveState, kind: Kind) -> Mapping[str, Mapping[str, Any]]:
    """The state's orgs or tenants, by id."""
    return state.orgs if kind == "org" else state.tenants


def found(items: Mapping[str, Mapping[str, Any]], ident: str, what: str) -> Mapping[str, Any]:
    """``items[ident]``, or a 404 naming what is missing."""
    doc = items.get(ident)
    if doc is None:
        raise NotFound(f"no {what} named {ident!r}", param="id", code="not_found")
    return doc


def active_keys(state: LiveState, now: float) -> dict[str, list[KeyRecord]]:
    """Each tenant's keys that work at ``now``."""
    out: dict[str, list[KeyRecord]] = {}
    for r in state.keys.values():
        if r.active(now):
            out.setdefault(r.tenant, []).append(r)
    return out


def key_by_id(state: LiveState, key_id: str) -> KeyRecord:
    """The key record with id ``key_id`` (ids are never reused), or a 404."""
    record = next((r for r in state.keys.values() if r.id == key_id), None)
    if record is None:
        raise NotFound(f"no key with id {key_id!r}", param="id", code="not_found")
    return record


def live_key(state: LiveState, key_id: str, now: float) -> KeyRecord:
    """The key ``key_id`` if it still works (a 409 if it was revoked or ended)."""
    record = key_by_id(state, key_id)
    if not record.active(now):
        raise Conflict(f"key {key_id!r} no longer works: nothing to rotate", param="id")
    return record


def id_free(state: LiveState, key_id: str, param: str) -> None:
    """Key ids are never reused, not even a revoked key's: usage and the audit are by id."""
    if any(r.id == key_id for r in state.keys.values()):
        raise Conflict(f"key id {key_id!r} is taken (ids are never reused)", param=param)


def stem(key_id: str) -> str:
    """A rotated key's id without the random tag its predecessor got, so ids do not grow."""
    head, _, tag = key_id.rpartition("-")
    base = head if head and re.fullmatch(r"[0-9a-f]{6}", tag) else key_id
    return base[:57]


def level_doc(
    state: LiveState, level: str, ident: str, now: float
) -> tuple[Literal["org", "tenant", "key"], str, Mapping[str, Any]]:
    """Where a level's budgets live: (kind of item, its id, its document)."""
    if level == "key":
        record = next((r for r in state.keys.values() if r.id == ident and r.active(now)), None)
        if record is None:
            raise InvalidRequest(f"no working key with id {ident!r}", param="id")
        return "key", record.hash, record.doc
    kind: Kind = "org" if level == "org" else "tenant"
    doc = docs(state, kind).get(ident)
    if doc is None:
        raise InvalidRequest(f"no {kind} named {ident!r}", param="id")
    return kind, ident, doc


def on_level(
    state: LiveState,
    level: str,
    ident: str,
    now: float,
    action: str,
    edit: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> Built:
    """The change that edits a level's rules: an org's, a tenant's, a key's, or (``users``)
    the tenant's per-user template."""
    kind, item_id, doc = level_doc(state, level, ident, now)
    # The users template is part of the tenant's document.
    after = {**doc, "users": edit(doc.get("users") or {})} if level == "users" else edit(doc)
    reply: dict[str, Any] = {"level": level, "id": ident}
    if kind == "key":
        record = next(r for r in state.keys.values() if r.hash == item_id)
        new = dataclasses.replace(record, doc=after)
        reply["rules"] = dict(after)
        return Built([Change("key", item_id, record, new, action)], reply)
    rules = after.get("users", {}) if level == "users" else after
    reply["rules"] = {k: v for k, v in rules.items() if k in ("budgets", "rate_limits")}
    changes = [] if after == dict(doc) else [Change(kind, item_id, doc, after, action)]
    return Built(changes, reply)


def same_budget(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two ``budgets:`` entries count the same dimension over the same window."""
    return a["dimension"] == b["dimension"] and _spec(a["window"]) == _spec(b["window"])


def _spec(window: Any) -> str:
    return Window.parse(str(window)).spec


def with_budget(doc: Mapping[str, Any], budget: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` with ``budget`` in place of its budget of the same dimension and window."""
    kept = [b for b in doc.get("budgets", []) if not same_budget(b, budget)]
    return {**doc, "budgets": [*kept, dict(budget)]}


def without_budget(doc: Mapping[str, Any], budget: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``doc`` without its budget of ``budget``'s dimension and window (a 404 if it has none)."""
    kept = [b for b in doc.get("budgets", []) if not same_budget(b, budget)]
    if len(kept) == len(doc.get("budgets", [])):
        what = f"{where} has no {budget['dimension']} budget per {budget['window']}"
        raise NotFound(what, param="window", code="not_found")
    return {**doc, "budgets": kept}


def with_rate_limits(doc: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` with the rate limits ``given`` set (None removes one; none left: no section)."""
    merged = {**(doc.get("rate_limits") or {}), **given}
    rates = {k: v for k, v in merged.items() if v is not None}
    out = {k: v for k, v in doc.items() if k != "rate_limits"}
    return {**out, "rate_limits": rates} if rates else out
