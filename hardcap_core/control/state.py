"""The live configuration: orgs, tenants, keys and temporary budget changes, as the config table
holds them, and how they join the file's routes and upstreams into one config.

The YAML file stays the source of what changes with a deploy (the gateway's settings, upstreams,
routes, prices, issuers); what changes while the gateway runs (who may call it and how much)
lives in DynamoDB (:mod:`hardcap_core.control.store`) once the table holds a version: until the
first ``hardcap config apply`` or admin change, the file's orgs and tenants are used as they are.

Documents are the YAML's own shapes (:mod:`hardcap_core.config.schema`: an org, a tenant without
its ``keys``, a key), so the table is validated by the same models as the file, and ``hardcap
config export`` writes back a file that loads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hardcap_core.budgets import Window

# The level kinds a budget change may name.
OVERRIDE_LEVELS = ("org", "tenant", "key")


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A key as the table holds it: never the key, only its hash."""

    id: str
    tenant: str
    hash: str
    doc: Mapping[str, Any]  # KeyConfig's fields but id and hash: budgets, rate_limits, priority
    created_at: float  # epoch seconds
    created_by: str = ""
    expires_at: float | None = None  # a rotated key stops working then (the overlap's end)
    revoked_at: float | None = None  # revoked: refused from the next request on

    def active(self, now: float) -> bool:
        """Whether the key authenticates at ``now``."""
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or now < self.expires_at

    def config(self) -> dict[str, Any]:
        """The key as a ``keys:`` entry of the file."""
        return {"id": self.id, "hash": self.hash, **self.doc}


@dataclass(frozen=True, slots=True)
class Override:
    """A temporary budget: at ``level`` ``id``, ``budget`` (a ``budgets:`` entry) replaces the
    one of the same dimension and window (or is added) until ``expires_at``, then the level's
    own budgets apply again by themselves."""

    id: str  # unique: the admin API's handle on it
    level: str  # org | tenant | key
    level_id: str  # for a key, its key id
    budget: Mapping[str, Any]  # {dimension, limit, window}
    expires_at: float
    created_at: float
    created_by: str = ""
    reason: str = ""

    def active(self, now: float) -> bool:
        return now < self.expires_at


@dataclass(frozen=True, slots=True)
class LiveState:
    """Everything the config table holds for the gateway, at one ``version``.

    ``version`` is 0 while the table was never written: the file's orgs and tenants apply then.
    """

    version: int
    orgs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # id -> OrgConfig doc
    tenants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # id -> TenantConfig
    # doc without `keys`
    keys: Mapping[str, KeyRecord] = field(default_factory=dict)  # by hash
    overrides: tuple[Override, ...] = ()

    @property
    def initialized(self) -> bool:
        return self.version > 0


@dataclass(frozen=True, slots=True)
class Joined:
    """The file's data with the live orgs and tenants in it, and when it next changes by itself
    (a temporary budget or a rotated key's end), epoch seconds (``inf``: never)."""

    data: dict[str, Any]
    changes_at: float


def join(file_data: Mapping[str, Any], state: LiveState, now: float) -> Joined:
    """The config data to validate: the file's, with ``state``'s orgs and tenants (and their
    active keys, and the overrides active at ``now``) in place of the file's, once the table
    was initialized."""
    data = dict(file_data)
    if not state.initialized:
        return Joined(data, math.inf)
    changes_at = math.inf
    keys_of: dict[str, list[dict[str, Any]]] = {}
    for record in sorted(state.keys.values(), key=lambda r: (r.tenant, r.id)):
        if not record.active(now):
            continue
        if record.expires_at is not None:
            changes_at = min(changes_at, record.expires_at)
        keys_of.setdefault(record.tenant, []).append(record.config())
    orgs = {i: _copy(doc) for i, doc in sorted(state.orgs.items())}
    tenants = {
        i: {**_copy(doc), "keys": keys_of.get(i, [])} for i, doc in sorted(state.tenants.items())
    }
    key_docs = {k["id"]: k for ks in keys_of.values() for k in ks}
    for o in state.overrides:
        if not o.active(now):
            continue
        changes_at = min(changes_at, o.expires_at)
        target = {"org": orgs, "tenant": tenants, "key": key_docs}[o.level].get(o.level_id)
        if target is not None:
            target["budgets"] = _with_budget(target.get("budgets", []), o.budget)
    data["orgs"] = [{"id": i, **doc} for i, doc in orgs.items()]
    data["tenants"] = [{"id": i, **doc} for i, doc in tenants.items()]
    return Joined(data, changes_at)


def _copy(doc: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in doc.items() if k != "id"}
    if "budgets" in out:
        out["budgets"] = [dict(b) for b in out["budgets"]]
    return out


def _with_budget(budgets: list[Any], budget: Mapping[str, Any]) -> list[Any]:
    """``budgets`` with ``budget`` in place of the one of its dimension and window."""
    what = (budget["dimension"], Window.parse(str(budget["window"])).spec)
    kept = [b for b in budgets if (b["dimension"], Window.parse(str(b["window"])).spec) != what]
    return [*kept, dict(budget)]
