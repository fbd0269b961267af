"""The Python side of the ledger scripts' contract, in one place: each script's KEYS and ARGV as
one typed structure, encoded by :func:`encode`; the order of the keys every ledger script takes
first (``lua/lib.lua``'s K_*); and each reply's layout, field names in order, as the scripts'
headers document them (read by :mod:`.replies` through :func:`named`).

A script's arguments are a dataclass whose fields are declared in wire order and marked with
what they are on the Lua side: a key (:func:`key`, :func:`keys`), a positional ARGV entry
(:func:`arg`), or a member of the JSON object sent as the last ARGV entry (:func:`member`,
with Lua's short name). One encoder turns any of them into ``(keys, argv)``; a script's field
names and their order exist nowhere else. The JSON is built by joining pre-encoded parts rather
than by ``json.dumps`` of a dict: the static parts of a scope (its budget rows, rate limits,
level tags) are encoded once per scope (:mod:`.plan`, with :func:`dumps`) and passed in as
``raw`` members, which keeps the encode of an admit at a few microseconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hardcap_core import json_codec

# The keys every ledger script takes first, in order: lua/lib.lua's K_RESERVED = 1, ... .
LEDGER_KEYS = (
    "K_RESERVED", "K_RES", "K_EXP", "K_RL", "K_EXPIRED", "K_EXPIRED_AT", "K_LIVE", "K_USAGE",
    "K_RESTORED",
)  # fmt: skip

Kind = Literal["key", "keys", "arg", "int", "raw", "json", "flag", "set"]
_LUA = "lua"


def dumps(value: Any) -> str:
    """Compact JSON, as the scripts are sent it (also for parts encoded ahead, :mod:`.plan`):
    orjson's, a fifth of ``json.dumps``'s time on a settle's record (non-ASCII text as UTF-8,
    not ``\\u`` escapes: cjson and the rollup's ``json.loads`` read either)."""
    return json_codec.dumps(value).decode()


def key() -> Any:
    """One key (KEYS[i])."""
    return dataclasses.field(metadata={_LUA: ("key", "")})


def keys() -> Any:
    """Several keys, in order."""
    return dataclasses.field(metadata={_LUA: ("keys", "")})


def arg() -> Any:
    """One positional ARGV entry, sent as it is (a str, int or float)."""
    return dataclasses.field(metadata={_LUA: ("arg", "")})


def member(name: str, kind: Kind = "int") -> Any:
    """A member ``name`` of the JSON object sent as the last ARGV entry. ``kind``: ``int``;
    ``raw`` (JSON text encoded ahead); ``json`` (any value, encoded here); ``flag`` (a bool
    sent 1 or 0); ``set`` (a bool sent 1 when true, absent when false: False by default)."""
    if kind == "set":
        return dataclasses.field(default=False, metadata=lua(name, kind))
    return dataclasses.field(metadata=lua(name, kind))


def lua(name: str, kind: Kind = "int") -> dict[str, tuple[str, str]]:
    """The field metadata of a member (:func:`member`); an optional one, absent from the JSON
    when None, is ``dataclasses.field(default=None, metadata=lua(name, kind))``."""
    return {_LUA: (kind, name)}


# -- each script's arguments, in wire order ---------------------------------------------------


@dataclass(slots=True, kw_only=True)
class AdmitArgs:
    """admit.lua."""

    ledger: Sequence[str] = keys()
    settled: str = key()
    queue: Sequence[str] = keys()
    config: str = key()
    used: Sequence[str] = keys()
    reservation_id: str = arg()
    ttl_ms: int = arg()
    rows: str = member("b", "raw")
    windows: str = member("w", "raw")
    settle_memory_ms: int = member("xm")
    ask_grant: bool = member("ag", "set")
    rates: str = member("r", "raw")
    input_tokens: int = member("i")
    output_estimate: int = member("o")
    min_output: int = member("mo")
    price_in: int = member("pi")
    price_out: int = member("po")
    meta: str = member("m", "raw")  # ReservationMeta.record(), encoded once per admit
    charge_on_expiry: bool = member("x", "flag")
    levels: str = member("lv", "raw")
    queue_ticket_ms: int = member("q")
    queue_priority: int = member("qp")
    headroom: int = member("hr")
    config_version: int | None = dataclasses.field(default=None, metadata=lua("cv"))
    no_refusal_record: bool = member("nr", "set")
    lease: str | None = dataclasses.field(default=None, metadata=lua("L", "json"))
    not_after_ms: int = member("na")


@dataclass(slots=True, kw_only=True)
class ExtendArgs:
    """extend.lua."""

    ledger: Sequence[str] = keys()
    used: Sequence[str] = keys()
    reservation_id: str = arg()
    tokens: int = arg()
    least: int = arg()
    ttl_ms: int = arg()
    rows: str = member("b", "raw")
    windows: str = member("w", "raw")
    settle_memory_ms: int = member("xm")
    ask_grant: bool = member("ag", "set")


@dataclass(slots=True, kw_only=True)
class SettleArgs:
    """settle.lua."""

    ledger: Sequence[str] = keys()
    settled: str = key()
    used: Sequence[str] = keys()
    reservation_id: str = arg()
    input_tokens: int = arg()
    output_tokens: int = arg()
    memory_ms: int = arg()
    rows: str = member("b", "raw")
    windows: str = member("w", "raw")
    settle_memory_ms: int = member("xm")
    price_in: int = member("pi")
    price_out: int = member("po")
    record: str = member("u", "raw")  # SettleNote.record(), encoded once per settle
    cost_nusd: int | None = dataclasses.field(default=None, metadata=lua("c"))


@dataclass(slots=True, kw_only=True)
class UsageArgs:
    """usage.lua."""

    ledger: Sequence[str] = keys()
    used: Sequence[str] = keys()
    rows: str = member("b", "raw")
    windows: str = member("w", "raw")
    settle_memory_ms: int = member("xm")
    levels: str = member("lv", "raw")
    rates: str | None = dataclasses.field(default=None, metadata=lua("r", "raw"))


@dataclass(slots=True, kw_only=True)
class HydrateArgs:
    """hydrate.lua."""

    ledger: Sequence[str] = keys()
    used: Sequence[str] = keys()
    windows: Sequence[Sequence[Any]] = member("w", "json")
    rows: Sequence[Sequence[Any]] = member("r", "json")
    source: str = member("src", "json")


@dataclass(slots=True, kw_only=True)
class LeaveArgs:
    """leave.lua."""

    ledger: Sequence[str] = keys()
    queue: Sequence[str] = keys()
    reservation_id: str = arg()
    record: str = arg()  # the reservation meta's JSON (contract.dumps)
    outcome: str = arg()


@dataclass(slots=True, kw_only=True)
class LeaseOpenArgs:
    """lease_open.lua."""

    ledger: Sequence[str] = keys()
    used: Sequence[str] = keys()
    lease_id: str = arg()
    rows: str = member("b", "raw")
    windows: str = member("w", "raw")
    settle_memory_ms: int = member("xm")
    ttl_ms: int = member("ttl")
    max_depth: int = member("md")
    tenant: str = member("tn", "json")
    user: str = member("us", "json")
    tokens: int | None = dataclasses.field(default=None, metadata=lua("et"))
    usd_nusd: int | None = dataclasses.field(default=None, metadata=lua("eu"))
    parent: str | None = dataclasses.field(default=None, metadata=lua("p", "json"))


@dataclass(slots=True, kw_only=True)
class LeaseCloseArgs:
    """lease_close.lua."""

    ledger: Sequence[str] = keys()
    lease_id: str = arg()
    close: int = arg()  # 1 closes, 0 reads
    tenant: str = arg()
    user: str = arg()


@dataclass(slots=True, kw_only=True)
class EstimatorRecordArgs:
    """estimator_record.lua."""

    samples: str = key()
    stats: str = key()
    tokens: int = arg()
    keep: int = arg()
    quantile: float = arg()
    recompute_every: int = arg()


@dataclass(slots=True, kw_only=True)
class EstimatorVoteArgs:
    """estimator_vote.lua."""

    votes: str = key()
    consensus: str = key()
    tenant: str = arg()
    value: int = arg()


@dataclass(slots=True, kw_only=True)
class ConfigVersionArgs:
    """config_version.lua."""

    version_key: str = key()
    version: int = arg()


@dataclass(slots=True, kw_only=True)
class BreakerArgs:
    """breaker.lua."""

    breaker: str = key()
    op: str = arg()  # check | ok | fail | pass
    failures: int = arg()
    cooldown_ms: int = arg()
    probes: int = arg()
    probe_ttl_ms: int = arg()
    tenant: str = arg()
    seen_for_ms: int = arg()


@dataclass(slots=True, kw_only=True)
class AllowanceGrantArgs:
    """allowance_grant.lua."""

    granted: Sequence[str] = keys()
    mode: str = arg()  # grant | return
    root: str = arg()
    windows: Sequence[Sequence[int]] = member("w", "json")
    rows: Sequence[Sequence[Any]] = member("b", "json")


@dataclass(slots=True, kw_only=True)
class AllowanceCreditArgs:
    """allowance_credit.lua."""

    used: Sequence[str] = keys()
    rows: Sequence[Sequence[Any]] = member("b", "json")


@dataclass(slots=True, kw_only=True)
class AllowanceReleaseArgs:
    """allowance_release.lua."""

    reserved: str = key()
    used: Sequence[str] = keys()
    rows: Sequence[Sequence[Any]] = member("b", "json")


@dataclass(slots=True, kw_only=True)
class UnlockArgs:
    """unlock.lua."""

    lock: str = key()
    owner: str = arg()


ScriptArgs = (
    AdmitArgs | ExtendArgs | SettleArgs | UsageArgs | HydrateArgs | LeaveArgs | LeaseOpenArgs
    | LeaseCloseArgs | EstimatorRecordArgs | EstimatorVoteArgs | ConfigVersionArgs | BreakerArgs
    | AllowanceGrantArgs | AllowanceCreditArgs | AllowanceReleaseArgs | UnlockArgs
)  # fmt: skip

# Each script's arguments, by script (scripts.py: SCRIPTS).
ARGS: dict[str, type] = {
    "admit": AdmitArgs, "extend": ExtendArgs, "settle": SettleArgs, "usage": UsageArgs,
    "hydrate": HydrateArgs, "leave": LeaveArgs, "lease_open": LeaseOpenArgs,
    "lease_close": LeaseCloseArgs, "estimator_record": EstimatorRecordArgs,
    "estimator_vote": EstimatorVoteArgs, "unlock": UnlockArgs, "breaker": BreakerArgs,
    "config_version": ConfigVersionArgs, "allowance_grant": AllowanceGrantArgs,
    "allowance_credit": AllowanceCreditArgs, "allowance_release": AllowanceReleaseArgs,
}  # fmt: skip


Codec = Callable[[Any], tuple[list[str], list[Any]]]
_CODECS: dict[type, Codec] = {}


def encode(args: ScriptArgs) -> tuple[list[str], list[Any]]:
    """The KEYS and ARGV of one script call."""
    codec = _CODECS.get(type(args))
    if codec is None:
        codec = _CODECS[type(args)] = _codec(type(args))
    return codec(args)


def _codec(cls: type) -> Codec:
    """The encoder of ``cls``, generated once from its fields' declarations (as ``dataclasses``
    generates ``__init__``): one function of f-strings, as fast as the hand-written f-strings it
    replaced (an admit's build measured the same, within noise, before and after)."""
    keys_at: list[str] = []
    argv_at: list[str] = []
    lines: list[str] = []  # building `s`, the JSON object
    run: list[str] = []  # members always present, joined into one f-string

    def flush() -> None:
        if run:
            lines.append(f"    s += f'{''.join(run)}'")
            run.clear()

    first = True
    for f in dataclasses.fields(cls):
        kind, name = f.metadata[_LUA]
        at = f"a.{f.name}"
        if kind == "key":
            keys_at.append(at)
        elif kind == "keys":
            keys_at.append(f"*{at}")
        elif kind == "arg":
            argv_at.append(at)
        else:
            # The first member is always sent, so the object always opens with it.
            assert not first or (f.default is dataclasses.MISSING and kind != "set"), cls
            head = ("{{" if first else ",") + f'"{name}":'
            first = False
            value = {
                "int": f"{{int({at})}}",
                "raw": f"{{{at}}}",
                "json": f"{{_dumps({at})}}",
                "flag": f"{{1 if {at} else 0}}",
                "set": "1",
            }[kind]
            if kind == "set":
                flush()
                lines.append(f"    if {at}: s += '{head}1'")
            elif f.default is None:
                flush()
                lines.append(f"    if {at} is not None: s += f'{head}{value}'")
            else:
                run.append(head + value)
    flush()
    body = ["def encode_one(a):", f"    keys = [{', '.join(keys_at)}]"]
    if lines:
        argv = "".join(a + ", " for a in argv_at)
        body += ["    s = ''", *lines, f"    return keys, [{argv}s + '}}']"]
    else:
        body.append(f"    return keys, [{', '.join(argv_at)}]")
    scope: dict[str, Any] = {"_dumps": dumps}
    exec("\n".join(body), scope)  # the text is built above from field declarations only
    codec: Codec = scope["encode_one"]
    return codec


# -- each script's replies: field names in order, as its header documents them -----------------

# A reply field holding a group read as a whole (lib.lua / the headers name them so).
BUDGET_STATE = "<budget state>"
RATE_STATE = "<rate state>"

# script -> status -> the fields after the status, in order. Scripts whose replies carry no
# status (estimator_*, breaker, config_version, unlock) are under the status "".
REPLIES: dict[str, dict[str, tuple[str, ...]]] = {
    "admit": {
        "ok": ("now_ms", "output_reserved", BUDGET_STATE, RATE_STATE),
        "queued": ("now_ms", "what", "waiting_ahead", BUDGET_STATE, RATE_STATE),
        "busy": ("now_ms", "what", "retry_after_ms", BUDGET_STATE, RATE_STATE),
        "exceeded": ("now_ms", "what", "retry_after_ms", BUDGET_STATE, RATE_STATE),
        "never": ("now_ms", "what", "retry_after_ms", BUDGET_STATE, RATE_STATE),
        "rate": ("now_ms", "what", "retry_after_ms", BUDGET_STATE, RATE_STATE),
        "config": ("now_ms", "version"),
        "grant": ("now_ms", "row", "need"),  # then more (row, need) pairs
    },
    "extend": {
        "ok": ("now_ms", "granted", "output_reserved_total", BUDGET_STATE),
        "no": ("now_ms", "what", BUDGET_STATE),
        "grant": ("now_ms", "row", "need"),
        "gone": ("now_ms",),
    },
    "settle": {
        "ok": ("now_ms", "had_reservation", "expiry_charged", BUDGET_STATE),
        "dup": ("now_ms",),
    },
    "leave": {"ok": ("now_ms", "waiting")},  # 1 if the id was waiting, else 0
    "lease_open": {
        "ok": ("now_ms", "expires_at_ms", BUDGET_STATE),
        "exceeded": ("now_ms", "what", "retry_after_ms", BUDGET_STATE),
        "never": ("now_ms", "what", "retry_after_ms", BUDGET_STATE),
        "depth": ("now_ms", "md"),
        "nolease": ("now_ms",),
        "exists": ("now_ms",),
    },
    "lease_close": {
        "ok": (
            "now_ms",
            "expires_at_ms",
            "tokens",
            "usd",
            "spent_tokens",
            "spent_usd",
            "held_tokens",
            "held_usd",
            "depth",
            "parent",
        ),
        "nolease": ("now_ms",),
    },
    "hydrate": {"ok": ("now_ms", "rows applied"), "done": ("now_ms",)},
    "allowance_grant": {"ok": ("now_ms", "given per row")},
    "allowance_release": {"ok": ("taken per row",)},
    "estimator_record": {"": ("quantile_value", "sample_size")},
    "estimator_vote": {"": ("consensus_value", "votes")},
    "breaker": {"": ("allowed", "state", "failures", "ms until", "tenants", "needed")},
}


def named(layout: Sequence[str], reply: Sequence[Any], at: int = 0) -> dict[str, Any]:
    """The scalar fields of ``reply`` from position ``at`` by ``layout``'s names, up to its
    first group (bytes decoded to str)."""
    out: dict[str, Any] = {}
    for name, value in zip(layout, reply[at:], strict=False):
        if name.startswith("<"):
            break
        out[name] = value.decode() if isinstance(value, bytes) else value
    return out
