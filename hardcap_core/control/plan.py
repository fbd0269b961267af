"""GitOps over the config table: what a file's orgs and tenants change in the live state
(``hardcap config plan``), the changes that apply it (``apply``), and the live state written
back as YAML (``export``).

The file is the whole config (the deployed file's gateway, upstreams, routes, prices and
issuers, with the operator's ``orgs:`` and ``tenants:``); only its orgs, tenants and keys are
compared. Documents are compared in their canonical form, the schema's own (defaults left
out, limits as numbers, windows as written after normalising), so ``fail_mode: closed`` written
out or left to its default is no difference, and what apply stores is that form.

Keys follow three rules. A key is matched by its hash: its id, tenant, budgets, rate limits and
priority can change; when it was created and by whom are not differences. A key live and
active but not in the file is revoked (the record stays, with ``revoked_at``), never deleted:
the audit and ``keys list`` keep it. A key the file lists that the live state revoked or that
ended after a rotation is refused (:class:`ConfigError` naming it), never brought back: apply
of an old file must not revive a leaked key.

Temporary budgets (overrides) are operational and end by themselves: apply leaves them alone,
and export lists them in a comment, never as the levels' budgets.

Changes come out in an order whose every prefix is a sensible state, so an apply split into
several writes (:data:`~hardcap_core.control.store.MAX_CHANGES` each) passes through states
that load: orgs created or changed, tenants created or changed, keys revoked, keys created or
changed, tenants deleted, orgs deleted.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from hardcap_core.config.schema import ConfigFile, KeyConfig, OrgConfig, TenantConfig
from hardcap_core.config.validation import parse_config
from hardcap_core.control.state import KeyRecord, LiveState, Override
from hardcap_core.control.store import Change
from hardcap_core.errors import ConfigError

ACTION = "config.apply"
SOURCE = "<config file>"


def desired_state(
    file_data: Mapping[str, Any], current: LiveState, now: float, *, who: str = ""
) -> LiveState:
    """The live state ``file_data`` asks for, built on ``current``: the file's orgs and tenants,
    its keys (existing records kept, with the file's id, tenant and limits; new ones created at
    ``now`` by ``who``), the other active keys revoked at ``now``, the overrides unchanged.

    :class:`ConfigError` (each problem named by its field) when the file does not validate or
    lists a key the live state revoked or ended."""
    file = _validated(file_data)
    orgs = {str(o.id): _canonical(o, {"id"}) for o in file.orgs}
    tenants = {str(t.id): _canonical(t, {"id", "keys"}) for t in file.tenants}
    keys = dict(current.keys)
    listed: set[str] = set()
    problems: list[str] = []
    for i, tenant in enumerate(file.tenants):
        for j, k in enumerate(tenant.keys):
            listed.add(k.hash)
            doc = _canonical(k, {"id", "hash"})
            record = current.keys.get(k.hash)
            if record is None:
                keys[k.hash] = KeyRecord(str(k.id), str(tenant.id), k.hash, doc, now, who)
            elif not record.active(now):
                problems.append(f"tenants[{i}].keys[{j}]: {_ended(record)}")
            elif (record.id, record.tenant, _key_doc(record)) != (k.id, tenant.id, doc):
                keys[k.hash] = dataclasses.replace(record, id=str(k.id), tenant=str(tenant.id),
                                                   doc=doc)  # fmt: skip
    if problems:
        raise ConfigError(f"invalid config {SOURCE}:\n" + "\n".join(f"  {p}" for p in problems))
    for key_hash, record in current.keys.items():
        if key_hash not in listed and record.active(now):
            keys[key_hash] = dataclasses.replace(record, revoked_at=now)
    return LiveState(current.version, orgs, tenants, keys, current.overrides)


def diff(
    current: LiveState, file_data: Mapping[str, Any], now: float, *, who: str = ""
) -> list[Change]:
    """The changes that make ``current``'s orgs, tenants and keys what ``file_data`` says
    (:func:`desired_state`), in an order each prefix of which is a sensible state; none when
    they already are. ``who`` is recorded as the creator of the keys it creates."""
    want = desired_state(file_data, current, now, who=who)
    orgs = _level_changes("org", current.orgs, want.orgs)
    tenants = _level_changes("tenant", current.tenants, want.tenants)
    upserted: list[Change] = []
    revoked: list[Change] = []
    for record in sorted(want.keys.values(), key=lambda r: (r.tenant, r.id, r.hash)):
        before = current.keys.get(record.hash)
        if before == record:
            continue
        change = Change("key", record.hash, before, record, ACTION)
        (revoked if _revokes(before, record) else upserted).append(change)
    upserts = [c for c in orgs + tenants if c.after is not None]
    # Deletes the other way round: tenants before the orgs they belong to.
    deletes = [c for c in tenants + orgs if c.after is None]
    # Revocations before new keys: a file that gives a key id a new hash must not pass through
    # a state with two active keys of one id.
    return [*upserts, *revoked, *upserted, *deletes]


def _revokes(before: Any, after: Any) -> bool:
    """Whether a key's change is its revocation."""
    return (
        isinstance(before, KeyRecord) and isinstance(after, KeyRecord)
        and before.revoked_at is None and after.revoked_at is not None
    )  # fmt: skip


def _level_changes(
    kind: Literal["org", "tenant"],
    have: Mapping[str, Mapping[str, Any]],
    want: Mapping[str, Mapping[str, Any]],
) -> list[Change]:
    canon = _org_doc if kind == "org" else _tenant_doc
    changes = []
    for level_id in sorted(have.keys() | want.keys()):
        before, after = have.get(level_id), want.get(level_id)
        if before is None or after is None or canon(level_id, before) != after:
            changes.append(Change(kind, level_id, before, after, ACTION))
    return changes


def render(changes: Sequence[Change]) -> str:
    """The changes as a terraform-plan-like text: ``+ tenant acme``, ``~ tenant beta:
    budgets[0].limit 5 -> 10``, ``- key beta-1 (revoke)``, a summary line; ``No changes.``"""
    if not changes:
        return "No changes."
    lines: list[str] = []
    counts = {"add": 0, "change": 0, "revoke": 0, "delete": 0}
    for c in changes:
        what, text = _render_one(c)
        counts[what] += 1
        lines += text
    summary = ", ".join(f"{n} to {what}" for what, n in counts.items())
    return "\n".join([*lines, "", f"Plan: {summary}."])


def export(state: LiveState, now: float) -> str:
    """``state``'s orgs and tenants (with their active keys) as YAML that loads beside a file's
    other sections; the temporary budgets in force and the keys ending after a rotation are
    listed in comments above it (they end by themselves: they are not the file's)."""
    import yaml

    keys_of: dict[str, list[KeyRecord]] = {}
    for record in sorted(state.keys.values(), key=lambda r: (r.tenant, r.id)):
        if record.active(now):
            keys_of.setdefault(record.tenant, []).append(record)
    orgs = [{"id": i, **_org_doc(i, doc)} for i, doc in sorted(state.orgs.items())]
    tenants = []
    for i, doc in sorted(state.tenants.items()):
        entry: dict[str, Any] = {"id": i, **_tenant_doc(i, doc)}
        keys = [{"id": r.id, "hash": r.hash, **_key_doc(r)} for r in keys_of.get(i, [])]
        if keys:
            entry["keys"] = keys
        tenants.append(entry)
    head = [
        f"# The live orgs and tenants: config table version {state.version}, at {_at(now)}.",
        "# Beside the deployed file's other sections, `hardcap config plan` shows no changes.",
    ]
    overrides = [o for o in state.overrides if o.active(now)]
    if overrides:
        head.append("# Temporary budgets in force (not part of the file; each ends by itself):")
        head += [f"#   {o.id}: {_override_text(o)}" for o in overrides]
    ending = [r for rs in keys_of.values() for r in rs if r.expires_at is not None]
    if ending:
        head.append("# Keys ending after a rotation (remove them from the file once ended):")
        head += [f"#   {r.id} (tenant {r.tenant}) ends {_at(r.expires_at or 0)}" for r in ending]
    body = yaml.safe_dump({"orgs": orgs, "tenants": tenants}, sort_keys=False, allow_unicode=True)
    return "\n".join(head) + "\n" + body


# -- canonical documents ---------------------------------------------------------------------


def _validated(file_data: Mapping[str, Any]) -> ConfigFile:
    data = dict(file_data)
    data.setdefault("orgs", [])
    data.setdefault("tenants", [])
    parse_config(data, SOURCE, environ={})  # every problem named by its field, or none
    return ConfigFile.model_validate(data)


def _canonical(model: BaseModel, leave_out: set[str]) -> dict[str, Any]:
    """A document in the schema's form: its defaults left out, plain JSON values."""
    doc = model.model_dump(exclude=leave_out, exclude_defaults=True)
    plain: dict[str, Any] = _plain(doc)
    return plain


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def _doc_of(model: type[BaseModel], level_id: str, doc: Mapping[str, Any],
            leave_out: set[str], **extra: Any) -> dict[str, Any]:  # fmt: skip
    """A stored document in canonical form; as stored when it no longer validates (so it
    differs from any valid one, and apply replaces it)."""
    try:
        parsed = model.model_validate({**doc, **extra, "id": level_id})
    except ValidationError:
        raw: dict[str, Any] = _plain({k: v for k, v in doc.items() if k not in leave_out})
        return raw
    return _canonical(parsed, leave_out)


def _org_doc(level_id: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    return _doc_of(OrgConfig, level_id, doc, {"id"})


def _tenant_doc(level_id: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    return _doc_of(TenantConfig, level_id, doc, {"id", "keys"})


def _key_doc(record: KeyRecord) -> dict[str, Any]:
    return _doc_of(KeyConfig, record.id, record.doc, {"id", "hash"}, hash=record.hash)


# -- the plan's text -------------------------------------------------------------------------


def _render_one(c: Change) -> tuple[str, list[str]]:
    """(add | change | revoke | delete, the change's lines)."""
    name = _name(c)
    if c.before is None:
        return "add", [f"+ {c.kind} {name}{_created(c.after)}"]
    if c.after is None:
        return "delete", [f"- {c.kind} {name}{' (cancel)' if c.kind == 'override' else ''}"]
    if _revokes(c.before, c.after):
        return "revoke", [f"- key {name} (revoke)"]
    before, after = _comparable(c.kind, c.id, c.before), _comparable(c.kind, c.id, c.after)
    paths = list(_differences(before, after, ""))
    if not paths:  # a difference the canonical form hides: show that it is rewritten
        return "change", [f"~ {c.kind} {name}: rewritten in canonical form"]
    return "change", [f"~ {c.kind} {name}: {path} {_show(a, path)} -> {_show(b, path)}"
                      for path, a, b in paths]  # fmt: skip


def _name(c: Change) -> str:
    record = c.after if c.after is not None else c.before
    return record.id if isinstance(record, KeyRecord) else c.id


def _created(after: Any) -> str:
    if isinstance(after, KeyRecord):
        return f" (tenant {after.tenant})"
    if isinstance(after, Override):
        return f": {_override_text(after)}"
    return ""


def _comparable(kind: str, level_id: str, value: Any) -> dict[str, Any]:
    if isinstance(value, KeyRecord):
        return {"id": value.id, "tenant": value.tenant, **_key_doc(value),
                "expires_at": value.expires_at, "revoked_at": value.revoked_at}  # fmt: skip
    if isinstance(value, Override):
        fields: dict[str, Any] = _plain(dataclasses.asdict(value))
        return fields
    canon = _org_doc if kind == "org" else _tenant_doc
    return canon(level_id, value)


_MISSING = object()


def _differences(a: Any, b: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    """(path, before, after) of every leaf that differs: ``budgets[0].limit``."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in sorted(a.keys() | b.keys()):
            sub = f"{path}.{k}" if path else str(k)
            yield from _differences(a.get(k, _MISSING), b.get(k, _MISSING), sub)
    elif isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            yield from _differences(a[i] if i < len(a) else _MISSING,
                                    b[i] if i < len(b) else _MISSING, f"{path}[{i}]")  # fmt: skip
    elif a != b:
        yield path, a, b


def _show(value: Any, path: str = "") -> str:
    if value is _MISSING or value is None:
        return "(none)"
    if path.endswith("_at") and isinstance(value, int | float) and not isinstance(value, bool):
        return _at(value)  # created_at, expires_at, revoked_at: epoch seconds
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _override_text(o: Override) -> str:
    b = o.budget
    who = f" (by {o.created_by}{': ' + o.reason if o.reason else ''})" if o.created_by else ""
    return (f"{o.level} {o.level_id} {b['dimension']}/{b['window']} {_show(_plain(b['limit']))}"
            f" until {_at(o.expires_at)}{who}")  # fmt: skip


def _ended(record: KeyRecord) -> str:
    if record.revoked_at is not None:
        how = f"was revoked at {_at(record.revoked_at)}"
    else:
        how = f"ended at {_at(record.expires_at or 0)} after a rotation"
    return (f"key {record.id!r} {how}; remove it from the file (a revoked key is never "
            "brought back: issue a new one)")  # fmt: skip


def _at(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
