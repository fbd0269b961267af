"""The admin service: every change an operator makes to the live configuration, checked whole
before it is written, written with its audit entry, then published to the gateways.

Each verb is a method that returns a JSON-able dict (the admin API's reply). A change takes one
path (:meth:`Admin._change`): load the table's state, build the item changes on it
(:mod:`.edits`), validate the config the gateways would then run (:func:`join` of the file
and the new state through :func:`parse_config`, as a gateway loads it), write it as the next
version (rebuilt and retried when another writer went first), and tell every gateway through
the cache that the hierarchies it touched moved to that version (:mod:`.publish`). A change
that does not validate writes nothing and is a 400 naming the field. Before the table's first
write the file's orgs and tenants apply; the first change imports them first (its own
version, audited as ``config.import``), so creating one tenant never drops the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hardcap_core.auth import new_key
from hardcap_core.control import edits, fields
from hardcap_core.control.publish import ConfigPublisher, LedgerPublisher
from hardcap_core.control.state import OVERRIDE_LEVELS, KeyRecord, LiveState, Override, join
from hardcap_core.control.store import MAX_CHANGES, Change, ConfigStore
from hardcap_core.errors import (
    ConfigConflict,
    ConfigError,
    HardcapError,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
)
from hardcap_core.logs import logger

if TYPE_CHECKING:
    from hardcap_core.rollup.table import UsageTable

WRITE_ATTEMPTS = 3  # tries of a change another writer keeps beating (rebuilt on each's state)
DEFAULT_OVERLAP_S = 24 * 3600.0  # a rotated key keeps working this long beside its successor


class Admin:
    """The admin verbs over ``store``; ``file_data`` is the deployed config file parsed (its
    routes, upstreams, prices and issuers are what the live orgs and tenants are checked
    against). ``publisher`` None: gateways learn of changes by polling the table's version.
    ``usage`` None: no usage and no keys' last use."""

    def __init__(
        self,
        store: ConfigStore,
        file_data: Mapping[str, Any],
        publisher: ConfigPublisher | None = None,
        usage: UsageTable | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.file_data = dict(file_data)
        self.publisher = publisher
        self.usage_table = usage
        self.clock = clock

    async def aclose(self) -> None:
        """Close the clients the service owns (a publisher's own cache client)."""
        if isinstance(self.publisher, LedgerPublisher):
            await self.publisher.aclose()

    # -- orgs and tenants ---------------------------------------------------------------------

    async def list_tenants(self) -> dict[str, Any]:
        state = await self._state()
        active = edits.active_keys(state, self.clock())
        tenants = [
            {"id": i, "org": doc.get("org"), "disabled": bool(doc.get("disabled", False)),
             "budgets": len(doc.get("budgets", [])), "keys": len(active.get(i, []))}
            for i, doc in sorted(state.tenants.items())
        ]  # fmt: skip
        return {"version": state.version, "tenants": tenants}

    async def show_tenant(self, tenant: str) -> dict[str, Any]:
        """The tenant as stored, its keys, the temporary budgets on it, and the budgets that
        apply right now (its own with those temporary ones in place)."""
        state = await self._state()
        now = self.clock()
        doc = edits.found(state.tenants, tenant, "tenant")
        joined = join(self.file_data, edits.as_written(state), now).data
        effective = next(t for t in joined["tenants"] if t["id"] == tenant).get("budgets", [])
        keys = [r for r in state.keys.values() if r.tenant == tenant]
        last = await self._last_used([tenant])
        targets = {("tenant", tenant), *(("key", r.id) for r in keys)}
        overrides = [o for o in state.overrides
                     if o.active(now) and (o.level, o.level_id) in targets]  # fmt: skip
        return {
            "version": state.version,
            "tenant": {"id": tenant, **doc},
            "effective_budgets": effective,
            "keys": [fields.key_view(r, now, last) for r in sorted(keys, key=lambda r: r.id)],
            "overrides": [fields.override_view(o) for o in overrides],
        }

    async def create_tenant(self, who: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self._create(who, "tenant", body)

    async def update_tenant(self, who: str, tenant: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self._update(who, "tenant", tenant, body, "tenant.update")

    async def disable_tenant(self, who: str, tenant: str) -> dict[str, Any]:
        return await self._update(who, "tenant", tenant, {"disabled": True}, "tenant.disable")

    async def enable_tenant(self, who: str, tenant: str) -> dict[str, Any]:
        return await self._update(who, "tenant", tenant, {"disabled": None}, "tenant.enable")

    async def list_orgs(self) -> dict[str, Any]:
        state = await self._state()
        orgs = [
            {"id": i, "disabled": bool(doc.get("disabled", False)),
             "budgets": len(doc.get("budgets", [])),
             "tenants": sorted(t for t, d in state.tenants.items() if d.get("org") == i)}
            for i, doc in sorted(state.orgs.items())
        ]  # fmt: skip
        return {"version": state.version, "orgs": orgs}

    async def create_org(self, who: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self._create(who, "org", body)

    async def update_org(self, who: str, org: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self._update(who, "org", org, body, "org.update")

    async def disable_org(self, who: str, org: str) -> dict[str, Any]:
        return await self._update(who, "org", org, {"disabled": True}, "org.disable")

    async def enable_org(self, who: str, org: str) -> dict[str, Any]:
        return await self._update(who, "org", org, {"disabled": None}, "org.enable")

    async def _create(self, who: str, kind: edits.Kind, body: Mapping[str, Any]) -> dict[str, Any]:
        ident = fields.ident(body.get("id"), "id")
        doc = {k: v for k, v in body.items() if k != "id"}
        if kind == "tenant" and "keys" in doc:
            raise InvalidRequest("keys are created with `keys create`", param="keys")

        def build(state: LiveState, now: float) -> edits.Built:
            if ident in edits.docs(state, kind):
                raise edits.Conflict(f"{kind} {ident!r} exists already", param="id")
            change = Change(kind, ident, None, doc, f"{kind}.create")
            return edits.Built([change], {kind: {"id": ident, **doc}})

        return await self._change(who, build)

    async def _update(
        self, who: str, kind: edits.Kind, ident: str, body: Mapping[str, Any], action: str
    ) -> dict[str, Any]:
        """Set the fields ``body`` names (None removes one: its default applies)."""
        for field in ("id", "keys"):
            if field in body:
                raise InvalidRequest(f"{field} cannot be changed here", param=field)

        def build(state: LiveState, now: float) -> edits.Built:
            before = edits.found(edits.docs(state, kind), ident, kind)
            after = {k: v for k, v in {**before, **body}.items() if v is not None}
            changes = [] if after == dict(before) else [Change(kind, ident, before, after, action)]
            return edits.Built(changes, {kind: {"id": ident, **after}, "changed": bool(changes)})

        return await self._change(who, build)

    # -- keys ---------------------------------------------------------------------------------

    async def list_keys(self, tenant: str | None = None) -> dict[str, Any]:
        state = await self._state()
        now = self.clock()
        if tenant is not None:
            edits.found(state.tenants, tenant, "tenant")
        records = sorted(
            (r for r in state.keys.values() if tenant is None or r.tenant == tenant),
            key=lambda r: (r.tenant, r.id),
        )
        last = await self._last_used(sorted({r.tenant for r in records}))
        return {"version": state.version, "keys": [fields.key_view(r, now, last) for r in records]}

    async def create_key(self, who: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A new key for ``body["tenant"]``: the reply holds its plaintext, the only time it is
        ever shown; the table keeps its hash."""
        tenant = fields.ident(body.get("tenant"), "tenant")
        key_id = fields.ident(body.get("id") or f"{tenant[:57]}-{secrets.token_hex(3)}", "id")
        doc = {k: v for k, v in body.items() if k not in ("tenant", "id")}
        if "hash" in doc:
            raise InvalidRequest("the gateway mints the key: send no hash", param="hash")
        plaintext, key_hash = new_key()

        def build(state: LiveState, now: float) -> edits.Built:
            if tenant not in state.tenants:
                raise InvalidRequest(f"no tenant named {tenant!r}", param="tenant")
            edits.id_free(state, key_id, "id")
            record = KeyRecord(key_id, tenant, key_hash, doc, now, created_by=who)
            reply = {"key": plaintext, **fields.key_view(record, now, {})}
            return edits.Built([Change("key", key_hash, None, record, "key.create")], reply)

        return await self._change(who, build)

    async def rotate_key(self, who: str, key_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A new key with the old one's tenant and settings; the old one keeps working for the
        overlap (default a day), so clients can move over, then stops by itself."""
        overlap = fields.seconds(body.get("overlap", DEFAULT_OVERLAP_S), "overlap")
        new_id = fields.ident(body.get("id") or f"{edits.stem(key_id)}-{secrets.token_hex(3)}",
                              "id")  # fmt: skip
        plaintext, key_hash = new_key()

        def build(state: LiveState, now: float) -> edits.Built:
            old = edits.live_key(state, key_id, now)
            edits.id_free(state, new_id, "id")
            ends = now + overlap if old.expires_at is None else min(old.expires_at, now + overlap)
            retiring = dataclasses.replace(old, expires_at=ends)
            record = KeyRecord(new_id, old.tenant, key_hash, dict(old.doc), now, created_by=who)
            changes = [
                Change("key", key_hash, None, record, "key.rotate"),
                Change("key", old.hash, old, retiring, "key.rotate"),
            ]
            reply = {"key": plaintext, **fields.key_view(record, now, {}),
                     "replaces": fields.key_view(retiring, now, {})}  # fmt: skip
            return edits.Built(changes, reply)

        return await self._change(who, build)

    async def revoke_key(self, who: str, key_id: str) -> dict[str, Any]:
        """Refuse the key from the next request on (its record stays, for the audit and usage)."""

        def build(state: LiveState, now: float) -> edits.Built:
            old = edits.key_by_id(state, key_id)
            if old.revoked_at is not None:
                raise edits.Conflict(f"key {key_id!r} was revoked already", param="id")
            revoked = dataclasses.replace(old, revoked_at=now)
            reply = {"key": fields.key_view(revoked, now, {})}
            return edits.Built([Change("key", old.hash, old, revoked, "key.revoke")], reply)

        return await self._change(who, build)

    # -- budgets, rate limits, temporary budgets ----------------------------------------------

    async def set_budget(self, who: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A budget at a level (replacing the one of its dimension and window); with ``until``
        (a time) or ``for`` (a duration) a temporary one that reverts by itself instead."""
        level, ident = fields.level_of(body)
        budget = fields.budget(body, with_limit=True)
        temporary = "until" in body or "for" in body
        if temporary and level not in OVERRIDE_LEVELS:
            raise InvalidRequest(f"a temporary budget is set on {', '.join(OVERRIDE_LEVELS)}, "
                                 f"not {level!r}", param="level")  # fmt: skip
        reason = str(body.get("reason", ""))

        def build(state: LiveState, now: float) -> edits.Built:
            if not temporary:
                set_ = "budget.set"
                return edits.on_level(state, level, ident, now, set_,
                                      lambda d: edits.with_budget(d, budget))  # fmt: skip
            edits.level_doc(state, level, ident, now)  # it must exist
            ends = fields.until(body, now)
            o = Override(f"ov-{uuid.uuid4().hex[:12]}", level, ident, budget, ends, now, who,
                         reason)  # fmt: skip
            change = Change("override", o.id, None, o, "budget.override")
            return edits.Built([change], {"override": fields.override_view(o)})

        return await self._change(who, build)

    async def remove_budget(self, who: str, body: Mapping[str, Any]) -> dict[str, Any]:
        level, ident = fields.level_of(body)
        budget = fields.budget(body, with_limit=False)

        def build(state: LiveState, now: float) -> edits.Built:
            without = lambda d: edits.without_budget(d, budget, f"{level} {ident}")  # noqa: E731
            return edits.on_level(state, level, ident, now, "budget.remove", without)

        return await self._change(who, build)

    async def set_rate_limits(self, who: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``requests_per_minute`` / ``tokens_per_minute`` at a level; null removes one."""
        level, ident = fields.level_of(body)
        names = ("requests_per_minute", "tokens_per_minute")
        given = {n: body[n] for n in names if n in body}
        if not given:
            raise InvalidRequest(f"name one of {', '.join(names)}", param=names[0])

        def build(state: LiveState, now: float) -> edits.Built:
            limited = lambda d: edits.with_rate_limits(d, given)  # noqa: E731
            return edits.on_level(state, level, ident, now, "rate_limits.set", limited)

        return await self._change(who, build)

    async def list_overrides(self, include_ended: bool = False) -> dict[str, Any]:
        state = await self._state()
        now = self.clock()
        chosen = [o for o in state.overrides if include_ended or o.active(now)]
        return {"version": state.version, "overrides": [fields.override_view(o) for o in chosen]}

    async def cancel_override(self, who: str, override_id: str) -> dict[str, Any]:
        """End a temporary budget now: the level's own budgets apply again."""

        def build(state: LiveState, now: float) -> edits.Built:
            o = next((o for o in state.overrides if o.id == override_id), None)
            if o is None:
                raise NotFound(f"no temporary budget {override_id!r}", param="id", code="not_found")
            change = Change("override", o.id, o, None, "override.cancel")
            return edits.Built([change], {"override": fields.override_view(o)})

        return await self._change(who, build)

    # -- GitOps: the file's orgs and tenants against the live ones ----------------------------

    async def plan(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """What ``apply`` of ``body`` (a file's ``orgs`` and ``tenants``) would change in what
        the gateways serve now (before the table's first write: the deployed file's)."""
        from hardcap_core.control import plan

        state = await self._state()
        now = self.clock()
        wanted = fields.live_sections(body, self.file_data)
        changes = edits.diff(state, wanted, now, "")
        self._validate(edits.applied(state, changes), now)
        return {"version": state.version, "changes": [fields.change_view(c) for c in changes],
                "text": plan.render(changes)}  # fmt: skip

    async def apply(self, who: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Make the live orgs, tenants and keys what ``body`` says; again, nothing changes."""
        from hardcap_core.control import plan

        wanted = fields.live_sections(body, self.file_data)

        def build(state: LiveState, now: float) -> edits.Built:
            changes = edits.diff(state, wanted, now, who)
            views = [fields.change_view(c) for c in changes]
            return edits.Built(changes, {"changes": views, "text": plan.render(changes)})

        return await self._change(who, build)

    async def export(self) -> dict[str, Any]:
        """The live orgs and tenants as YAML that loads beside the file's other sections."""
        from hardcap_core.control import plan

        state = await self._state()
        return {"version": state.version, "yaml": plan.export(state, self.clock())}

    # -- reports ------------------------------------------------------------------------------

    async def usage(
        self, since: str = "24h", until: str = "now", tenants: Sequence[str] = ()
    ) -> dict[str, Any]:
        """What ``hardcap usage`` shows: spend per tenant, key, route and model in the window."""
        from hardcap_core.rollup import report

        if self.usage_table is None:
            raise ServiceUnavailable("No usage table is configured.", code="no_usage_table")
        now_ms = int(self.clock() * 1000)
        start_ms = fields.time_arg(report.parse_time, since, now_ms, "since")
        end_ms = fields.time_arg(report.parse_time, until, now_ms, "until")
        if start_ms >= end_ms:
            raise InvalidRequest(f"since {since} is not before until {until}", param="since")
        rows = await asyncio.to_thread(
            self.usage_table.usage, list(tenants) or None, start_ms, end_ms
        )
        return {"start_ms": start_ms, "end_ms": end_ms, "rows": report.to_json(rows)}

    async def audit(self, limit: int = 100, since: float | None = None) -> dict[str, Any]:
        """The changes, newest first: who, when, what it was before and after."""
        if not 1 <= limit <= 1000:
            raise InvalidRequest("limit is 1 to 1000", param="limit")
        entries = await asyncio.to_thread(self.store.audit, limit, since)
        return {"entries": [dataclasses.asdict(e) for e in entries]}

    # -- the one path of every change ---------------------------------------------------------

    async def _change(
        self, who: str, build: Callable[[LiveState, float], edits.Built]
    ) -> dict[str, Any]:
        """Build the change on the table's state, validate the result whole, write it, publish
        it. Before the table's first write the file's orgs and tenants are the state, written
        first as their own version (``config.import``), and only once the change is known to
        validate: a refused change writes nothing at all."""
        for _ in range(WRITE_ATTEMPTS):
            state = await asyncio.to_thread(self.store.load)
            now = self.clock()
            imported: list[Change] = []
            if not state.initialized:
                imported = [dataclasses.replace(c, action="config.import")
                            for c in edits.diff(state, self.file_data, now, who)]  # fmt: skip
            base = edits.applied(state, imported, version=state.version)
            built = build(base, now)
            after = edits.applied(base, built.changes)
            self._validate(after, now)
            if not built.changes:
                return {"version": state.version, **built.reply}
            writes = [c for c in (imported, built.changes) if c]
            try:
                version = await asyncio.to_thread(self._write, writes, who, state.version)
            except ConfigConflict:
                continue
            await self._publish(edits.roots(state, after, [*imported, *built.changes]), version)
            return {"version": version, **built.reply}
        raise edits.Conflict(
            f"the live config kept changing during {WRITE_ATTEMPTS} tries; try again"
        )

    def _write(self, writes: Sequence[Sequence[Change]], who: str, version: int) -> int:
        """Each of ``writes`` in turn, from table version ``version``, as few versions as the
        store takes (:data:`MAX_CHANGES` per write); the last version written."""
        for changes in writes:
            for start in range(0, len(changes), MAX_CHANGES):
                version = self.store.write(changes[start : start + MAX_CHANGES], who, version)
        return version

    def _validate(self, state: LiveState, now: float) -> None:
        """The config every gateway would run with ``state``, checked as a gateway loads it."""
        from hardcap_core.config.validation import parse_config

        data = join(self.file_data, edits.as_written(state), now).data
        try:
            parse_config(data, "<live config>", environ={})
        except ConfigError as e:
            raise edits.invalid(e, data) from None

    async def _publish(self, roots: Sequence[str], version: int) -> None:
        if self.publisher is None:
            return
        try:
            await self.publisher.publish(roots, version)
        except HardcapError as e:  # the cache unreachable: the change itself is written
            # Gateways also poll the table's version: they learn of it within that period.
            context = {"version": version, "roots": list(roots), "error": str(e)}
            logger.warning("config version not published; gateways poll for it", extra=context)

    async def _state(self) -> LiveState:
        """What applies now: the table's state, or the file's orgs and tenants before the
        table's first write (version 0)."""
        state = await asyncio.to_thread(self.store.load)
        if state.initialized:
            return state
        return edits.applied(state, edits.diff(state, self.file_data, self.clock(), ""), version=0)

    async def _last_used(self, tenants: Iterable[str]) -> dict[tuple[str, str], float]:
        """When each key of ``tenants`` was last used, epoch seconds, from the usage table."""
        table = self.usage_table
        if table is None:
            return {}
        out: dict[tuple[str, str], float] = {}
        for tenant in tenants:
            seen = await asyncio.to_thread(table.last_used, tenant)
            out.update({(tenant, key_id): at for key_id, at in seen.items()})
        return out
