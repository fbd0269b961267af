"""GitOps over the live state: the diff a file makes, applying it twice changes nothing, keys
removed from the file are revoked (never deleted, never revived), overrides are left alone,
export loads back as a config that plans no changes, and the plan's text for every change."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from hardcap_core.auth import hash_key
from hardcap_core.config import parse_config
from hardcap_core.control.plan import desired_state, diff, export, render
from hardcap_core.control.state import KeyRecord, LiveState, Override, join
from hardcap_core.control.store import Change
from hardcap_core.errors import ConfigError

NOW = datetime(2026, 3, 14, 12, 0, tzinfo=UTC).timestamp()
HASH = {name: hash_key(f"hc_test_{name}") for name in ("alpha-1", "alpha-2", "beta-1", "beta-2")}


def file_data() -> dict[str, Any]:
    """A deployed file's sections with the operator's orgs and tenants."""
    return {
        "upstreams": [{"name": "openai", "base_url": "https://api.openai.com/v1"}],
        "routes": [
            {
                "name": "small",
                "upstream": "openai",
                "model": "gpt-4o-mini",
                "price": {"input_per_million": 0.15, "output_per_million": 0.6},
            },
            {
                "name": "large",
                "upstream": "openai",
                "model": "gpt-4o",
                "price": {"input_per_million": 2.5, "output_per_million": 10},
            },
        ],
        "orgs": [
            {
                "id": "bigco",
                "budgets": [{"dimension": "cost_usd", "limit": 100.5, "window": "month"}],
            }
        ],
        "tenants": [
            {
                "id": "alpha",
                "org": "bigco",
                "budgets": [{"dimension": "total_tokens", "limit": 1000, "window": "day"}],
                "keys": [{"id": "alpha-1", "hash": HASH["alpha-1"]}],
            },
            {
                "id": "beta",
                "routes": ["small"],
                "budgets": [{"dimension": "output_tokens", "limit": 5, "window": "day"}],
                "keys": [
                    {"id": "beta-1", "hash": HASH["beta-1"], "queue_priority": 3},
                    {"id": "beta-2", "hash": HASH["beta-2"]},
                ],
            },
        ],
    }


def applied(state: LiveState, changes: Sequence[Change]) -> LiveState:
    """What the store holds after writing ``changes`` on ``state`` (one version more)."""
    orgs, tenants, keys = dict(state.orgs), dict(state.tenants), dict(state.keys)
    overrides = {o.id: o for o in state.overrides}
    for c in changes:
        target: dict[str, Any] = {"org": orgs, "tenant": tenants, "key": keys,
                                  "override": overrides}[c.kind]  # fmt: skip
        if c.after is None:
            del target[c.id]
        else:
            target[c.id] = c.after
    return LiveState(state.version + 1, orgs, tenants, keys, tuple(overrides.values()))


def live(data: dict[str, Any] | None = None) -> LiveState:
    """The state after applying ``data`` (default: :func:`file_data`) to an empty table."""
    empty = LiveState(0)
    return applied(empty, diff(empty, data or file_data(), NOW - 3600, who="local:ops"))


def test_the_first_apply_creates_everything_in_an_order_that_loads() -> None:
    changes = diff(LiveState(0), file_data(), NOW, who="local:ops")
    assert [(c.kind, c.before, c.action) for c in changes][:3] == [
        ("org", None, "config.apply"), ("tenant", None, "config.apply"),
        ("tenant", None, "config.apply")]  # fmt: skip
    created = {c.id: c.after for c in changes if c.kind == "key"}
    assert created[HASH["beta-1"]] == KeyRecord(
        "beta-1", "beta", HASH["beta-1"], {"queue_priority": 3}, NOW, "local:ops"
    )
    # Canonical documents: the id is the item's key, defaults left out, limits as numbers.
    assert changes[0].after == {"budgets": [{"dimension": "cost_usd", "limit": 100.5,
                                             "window": "month"}]}  # fmt: skip
    assert changes[2].after == {
        "routes": ["small"],
        "budgets": [{"dimension": "output_tokens", "limit": 5, "window": "day"}],
    }
    state = applied(LiveState(0), changes)
    parse_config(join(file_data(), state, NOW).data, environ={})


def test_apply_then_diff_again_changes_nothing() -> None:
    state = live()
    assert diff(state, file_data(), NOW) == []
    # The same with every kind of change on the way: edits, a new key, a removed one.
    data = file_data()
    data["tenants"][0]["budgets"][0]["limit"] = 2000
    data["tenants"][0]["keys"].append({"id": "alpha-2", "hash": HASH["alpha-2"]})
    del data["tenants"][1]["keys"][1]
    data["orgs"].append({"id": "other"})
    data["tenants"][1]["org"] = "other"
    changes = diff(state, data, NOW)
    assert len(changes) == 5
    assert diff(applied(state, changes), data, NOW + 60) == []


def test_what_is_written_differently_but_means_the_same_is_no_change() -> None:
    state = live()
    data = file_data()
    data["tenants"][0]["fail_mode"] = "closed"  # the default, written out
    data["tenants"][0]["budgets"][0]["window"] = " DAY "
    data["tenants"][0]["budgets"][0]["limit"] = 1000.0
    data["tenants"][1]["keys"][1]["queue_priority"] = 0
    data["orgs"][0]["rate_limits"] = None
    assert diff(state, data, NOW) == []


def test_a_key_removed_from_the_file_is_revoked_not_deleted() -> None:
    state = live()
    data = file_data()
    del data["tenants"][1]["keys"][0]  # beta-1
    changes = diff(state, data, NOW)
    assert len(changes) == 1
    (change,) = changes
    before = state.keys[HASH["beta-1"]]
    revoked = dataclasses.replace(before, revoked_at=NOW)
    assert change == Change("key", HASH["beta-1"], before, revoked, "config.apply")
    assert render(changes).splitlines()[0] == "- key beta-1 (revoke)"
    after = applied(state, changes)
    assert HASH["beta-1"] in after.keys  # the record stays, for the audit and `keys list`
    joined = join(data, after, NOW).data
    assert [k["id"] for k in joined["tenants"][1]["keys"]] == ["beta-2"]
    assert diff(after, data, NOW + 60) == []


def test_a_revoked_or_ended_key_is_never_brought_back() -> None:
    state = live()
    revoked = dataclasses.replace(state.keys[HASH["beta-1"]], revoked_at=NOW - 60)
    ended = dataclasses.replace(state.keys[HASH["alpha-1"]], expires_at=NOW - 1)
    state = dataclasses.replace(state, keys={**state.keys, revoked.hash: revoked,
                                             ended.hash: ended})  # fmt: skip
    with pytest.raises(ConfigError) as e:
        diff(state, file_data(), NOW)
    problems = str(e.value).splitlines()[1:]
    assert problems[0].startswith(
        "  tenants[0].keys[0]: key 'alpha-1' ended at 2026-03-14T11:59:59Z"
    )
    assert problems[1].startswith("  tenants[1].keys[0]: key 'beta-1' was revoked at")
    # A key still in its rotation overlap is active: listed or not, nothing to say about it.
    rotating = dataclasses.replace(state.keys[HASH["alpha-1"]], expires_at=NOW + 3600)
    fine = dataclasses.replace(state, keys={**live().keys, rotating.hash: rotating})
    assert diff(fine, file_data(), NOW) == []


def test_a_keys_metadata_is_not_a_difference() -> None:
    state = live()
    record = state.keys[HASH["alpha-1"]]
    older = dataclasses.replace(record, created_at=NOW - 86400 * 30, created_by="arn:aws:iam::1:x",
                                doc={"queue_priority": 0, "budgets": []})  # fmt: skip
    state = dataclasses.replace(state, keys={**state.keys, record.hash: older})
    assert diff(state, file_data(), NOW) == []


def test_a_key_id_given_a_new_hash_is_revoked_before_the_new_one_is_created() -> None:
    state = live()
    data = file_data()
    data["tenants"][0]["keys"][0]["hash"] = HASH["alpha-2"]  # alpha-1, a new key
    changes = diff(state, data, NOW)
    assert [(c.id, c.before is None) for c in changes] == [
        (HASH["alpha-1"], False),
        (HASH["alpha-2"], True),
    ]
    assert render(changes).splitlines()[:2] == [
        "- key alpha-1 (revoke)",
        "+ key alpha-1 (tenant alpha)",
    ]
    for prefix in (changes[:1], changes):  # each state on the way loads
        parse_config(join(data, applied(state, prefix), NOW).data, environ={})


def test_keys_move_between_tenants_and_keep_their_record() -> None:
    state = live()
    data = file_data()
    moved = data["tenants"][1]["keys"].pop(1)  # beta-2 to alpha, with a budget
    moved["budgets"] = [{"dimension": "total_tokens", "limit": 50, "window": "1h"}]
    data["tenants"][0]["keys"].append(moved)
    (change,) = diff(state, data, NOW)
    assert change.after == dataclasses.replace(
        state.keys[HASH["beta-2"]], tenant="alpha",
        doc={"budgets": [{"dimension": "total_tokens", "limit": 50, "window": "1h"}]},
    )  # fmt: skip
    assert render([change]).splitlines()[:2] == [
        '~ key beta-2: budgets (none) -> [{"dimension":"total_tokens","limit":50,"window":"1h"}]',
        "~ key beta-2: tenant beta -> alpha",
    ]


def test_removed_tenants_and_orgs_are_deleted_after_their_keys_are_revoked() -> None:
    state = live()
    data = file_data()
    data["tenants"] = data["tenants"][1:]  # alpha goes, and bigco with it
    data["orgs"] = []
    changes = diff(state, data, NOW)
    assert [(c.kind, c.id, c.after is None) for c in changes] == [
        ("key", HASH["alpha-1"], False),  # revoked
        ("tenant", "alpha", True),
        ("org", "bigco", True),
    ]
    assert render(changes) == "\n".join([
        "- key alpha-1 (revoke)", "- tenant alpha", "- org bigco", "",
        "Plan: 0 to add, 0 to change, 1 to revoke, 2 to delete.",
    ])  # fmt: skip


def test_overrides_are_left_alone() -> None:
    state = live()
    budget = {"dimension": "total_tokens", "limit": 5000, "window": "day"}
    ov = Override("ov-1", "tenant", "alpha", budget, NOW + 86400, NOW - 60, "local:ops", "demo")
    state = dataclasses.replace(state, overrides=(ov,))
    assert diff(state, file_data(), NOW) == []
    assert desired_state(file_data(), state, NOW).overrides == (ov,)
    data = file_data()
    data["tenants"][0]["budgets"][0]["limit"] = 10
    (change,) = diff(state, data, NOW)
    assert change.kind == "tenant"


def test_an_invalid_file_names_the_field() -> None:
    data = file_data()
    data["tenants"][1]["budgets"][0]["window"] = "fortnight"
    with pytest.raises(ConfigError, match=r"tenants\[1\]\.budgets\[0\]\.window"):
        diff(live(), data, NOW)
    data = file_data()
    data["tenants"][0]["org"] = "nobody"
    with pytest.raises(ConfigError, match=r"tenants\[0\]\.org"):
        diff(live(), data, NOW)


def test_export_loads_back_and_plans_no_changes() -> None:
    state = live()
    budget = {"dimension": "cost_usd", "limit": 2.5, "window": "month"}
    ov = Override("ov-7", "org", "bigco", budget, NOW + 86400, NOW, "local:ops", "quarter end")
    gone = Override("ov-0", "org", "bigco", budget, NOW - 1, NOW - 86400)
    rotating = dataclasses.replace(state.keys[HASH["beta-2"]], expires_at=NOW + 3600)
    revoked = KeyRecord("beta-0", "beta", HASH["alpha-2"], {}, NOW - 9e5, revoked_at=NOW - 9e4)
    state = dataclasses.replace(
        state, overrides=(gone, ov),
        keys={**state.keys, rotating.hash: rotating, revoked.hash: revoked},
    )  # fmt: skip
    text = export(state, NOW)
    exported = yaml.safe_load(text)
    others = {k: v for k, v in file_data().items() if k not in ("orgs", "tenants")}
    data = {**others, **exported}
    config = parse_config(copy.deepcopy(data), "exported.yaml", environ={})
    assert sorted(config.tenant_scopes) == ["alpha", "beta"]
    assert config.principal_by_id("beta-2") is not None
    assert diff(state, data, NOW) == []
    assert exported["orgs"] == file_data()["orgs"]  # the override is not the org's budget
    assert [k["id"] for k in exported["tenants"][1]["keys"]] == ["beta-1", "beta-2"]
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert comments == [
        "# The live orgs and tenants: config table version 1, at 2026-03-14T12:00:00Z.",
        "# Beside the deployed file's other sections, `hardcap config plan` shows no changes.",
        "# Temporary budgets in force (not part of the file; each ends by itself):",
        "#   ov-7: org bigco cost_usd/month 2.5 until 2026-03-15T12:00:00Z "
        "(by local:ops: quarter end)",
        "# Keys ending after a rotation (remove them from the file once ended):",
        "#   beta-2 (tenant beta) ends 2026-03-14T13:00:00Z",
    ]


def test_render_says_what_each_kind_of_change_does() -> None:
    key = KeyRecord("acme-1", "acme", HASH["alpha-1"], {}, NOW)
    budget = {"dimension": "total_tokens", "limit": 5000, "window": "day"}
    ov = Override("ov-1", "tenant", "acme", budget, NOW + 86400, NOW, "local:ops")
    tenant = {"org": "bigco", "budgets": [{"dimension": "total_tokens", "limit": 5,
                                           "window": "day"}]}  # fmt: skip
    raised = {**tenant, "budgets": [{**tenant["budgets"][0], "limit": 10}], "fail_mode": "open"}
    changes = [
        Change("org", "bigco", None, {}, "org.create"),
        Change("org", "old", {}, None, "org.delete"),
        Change("org", "bigco", {}, {"disabled": True}, "org.disable"),
        Change("tenant", "acme", None, tenant, "tenant.create"),
        Change("tenant", "beta", tenant, raised, "tenant.update"),
        Change("tenant", "gone", tenant, None, "tenant.delete"),
        Change("key", key.hash, None, key, "key.create"),
        Change(
            "key", key.hash, key, dataclasses.replace(key, expires_at=NOW + 86400), "key.rotate"
        ),
        Change("key", key.hash, key, dataclasses.replace(key, revoked_at=NOW), "key.revoke"),
        Change("key", key.hash, key, None, "key.delete"),
        Change("override", "ov-1", None, ov, "budgets.set"),
        Change(
            "override", "ov-1", ov, dataclasses.replace(ov, expires_at=NOW + 3600), "budgets.set"
        ),
        Change("override", "ov-1", ov, None, "override.cancel"),
    ]
    assert render(changes).splitlines() == [
        "+ org bigco",
        "- org old",
        "~ org bigco: disabled (none) -> true",
        "+ tenant acme",
        "~ tenant beta: budgets[0].limit 5 -> 10",
        "~ tenant beta: fail_mode (none) -> open",
        "- tenant gone",
        "+ key acme-1 (tenant acme)",
        "~ key acme-1: expires_at (none) -> 2026-03-15T12:00:00Z",
        "- key acme-1 (revoke)",
        "- key acme-1",
        "+ override ov-1: tenant acme total_tokens/day 5000 until 2026-03-15T12:00:00Z "
        "(by local:ops)",
        "~ override ov-1: expires_at 2026-03-15T12:00:00Z -> 2026-03-14T13:00:00Z",
        "- override ov-1 (cancel)",
        "",
        "Plan: 4 to add, 4 to change, 1 to revoke, 4 to delete.",
    ]
    assert render([]) == "No changes."
