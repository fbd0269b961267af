"""The config table: the live orgs, tenants, keys and temporary budgets in DynamoDB, a version
every change moves, and the audit log of who changed what.

One table (``HARDCAP_CONFIG_TABLE``), two string keys. Items:

* ``pk = meta``, ``sk = version``: ``version`` (N), ``updated_at`` (epoch seconds) and
  ``audit_from`` (the first month with an audit item, ``YYYYMM``). Absent: version 0, the table
  was never written and the file's orgs and tenants apply (:class:`LiveState`).
* ``pk = org``, ``sk = <id>``: ``doc`` (JSON of the org's ``orgs:`` entry without its id),
  ``version`` (the table version that last wrote it).
* ``pk = tenant``, ``sk = <id>``: ``doc`` (the ``tenants:`` entry without its id and keys),
  ``version``.
* ``pk = key``, ``sk = <hash>`` (``sha256:...``): ``doc`` (JSON of :class:`KeyRecord`'s fields),
  ``tenant``, ``key_id``, ``version``. Never the key itself: a write whose documents hold
  anything shaped like a plaintext key is refused before it is sent.
* ``pk = override``, ``sk = <override id>``: ``doc`` (JSON of :class:`Override`), ``version``
  and ``expires_at``, the table's TTL attribute: DynamoDB deletes a temporary budget some time
  after it ended (it stopped applying at ``expires_at`` already: :func:`join` skips it).
* ``pk = audit#<YYYYMM>``, ``sk = <ISO-8601 UTC ms>#<uuid>``: ``who``, ``action``, ``kind``,
  ``target``, ``before``, ``after`` (JSON, ``null`` for none), ``version``, ``seq`` (its place
  among the changes of one write). A month per partition, so the log grows without a hot key
  and is read newest first month by month.

Every write is one ``TransactWriteItems``: the version moves from the one the writer read to
the next (conditioned on it: two writers that read the same version cannot both succeed), each
change's put or delete, and one audit item per change. So a reader that sees a version sees
all of its changes, and the audit holds exactly the changes that happened.

This module is the one boundary where botocore's errors become :class:`ConfigStoreUnavailable`
or :class:`ConfigConflict`. Calls are synchronous (boto3); async callers run them in a thread.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from hardcap_core import env
from hardcap_core.auth import KEY_PREFIX
from hardcap_core.control.state import KeyRecord, LiveState, Override
from hardcap_core.errors import ConfigConflict, ConfigStoreUnavailable

# The variable naming the table (hardcap_core/env.py holds every variable's name).
CONFIG_TABLE = env.CONFIG_TABLE

KEY_SCHEMA = [
    {"AttributeName": "pk", "KeyType": "HASH"},
    {"AttributeName": "sk", "KeyType": "RANGE"},
]
ATTRIBUTE_DEFINITIONS = [
    {"AttributeName": "pk", "AttributeType": "S"},
    {"AttributeName": "sk", "AttributeType": "S"},
]
TTL_ATTRIBUTE = "expires_at"
# TransactWriteItems takes at most 100 actions: the version's update, then two per change.
MAX_CHANGES = 45
# A load that keeps seeing the version move (writes faster than it reads) gives up after this.
LOAD_ATTEMPTS = 5
Kind = Literal["org", "tenant", "key", "override"]
KINDS: tuple[Kind, ...] = ("org", "tenant", "key", "override")
_META_KEY = {"pk": {"S": "meta"}, "sk": {"S": "version"}}
# What auth.new_key mints: a document holding one was handed a key where a hash belongs.
# (exactly its 43 characters: a longer id that happens to begin with the prefix is no key).
_PLAINTEXT_KEY = re.compile(
    r"(?<![A-Za-z0-9_\-])" + re.escape(KEY_PREFIX) + r"[A-Za-z0-9_\-]{43}(?![A-Za-z0-9_\-])"
)


@dataclass(frozen=True, slots=True)
class Change:
    """One item's change: ``before`` None creates it, ``after`` None deletes it."""

    kind: Kind
    id: str  # org/tenant id, key hash, override id
    before: Any  # doc Mapping / KeyRecord / Override, or None (created)
    after: Any  # same, or None (deleted)
    action: str  # what the audit says: "tenant.create", "key.revoke", "config.apply"...


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One change as the audit log holds it; ``before`` and ``after`` are plain JSON values."""

    at: float  # epoch seconds
    who: str  # an IAM principal's ARN, or "local:<operator>"
    action: str
    kind: str
    target: str  # the org, tenant or override id; for a key, its key id (never the key)
    before: Any
    after: Any
    version: int


class ConfigStore:
    """The config table over a boto3 DynamoDB client, made on first use when none is given."""

    def __init__(
        self, table_name: str, client: Any | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.name = table_name
        self._client = client
        self._clock = clock

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ConfigStore | None:
        """The table ``HARDCAP_CONFIG_TABLE`` names, or None when it is unset."""
        name = (os.environ if environ is None else environ).get(env.CONFIG_TABLE)
        return cls(name) if name else None

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("dynamodb")
        return self._client

    def create_table(self) -> None:
        """Create the table as the SAM template defines it (``ConfigTable``: the same keys and
        TTL attribute), for moto and local runs."""
        self._call(
            "CreateTable", TableName=self.name, KeySchema=KEY_SCHEMA,
            AttributeDefinitions=ATTRIBUTE_DEFINITIONS, BillingMode="PAY_PER_REQUEST",
        )  # fmt: skip
        self.client.get_waiter("table_exists").wait(TableName=self.name)
        self._call(
            "UpdateTimeToLive", TableName=self.name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
        )  # fmt: skip

    # -- reading ------------------------------------------------------------------------------

    def version(self) -> int:
        """The table's version: one strongly consistent read (0: never written)."""
        item = self._call("GetItem", TableName=self.name, Key=_META_KEY,
                          ConsistentRead=True).get("Item")  # fmt: skip
        return int(item["version"]["N"]) if item else 0

    def load(self) -> LiveState:
        """Everything the table holds, at one version.

        The items are read by several queries; a write between them would mix two versions, so
        the version is read before and after, and the whole read is repeated when it moved
        (:class:`ConfigConflict` after :data:`LOAD_ATTEMPTS` reads that all saw a write).
        """
        for _ in range(LOAD_ATTEMPTS):
            version = self.version()
            if version == 0:
                return LiveState(0)
            orgs = {i["sk"]["S"]: json.loads(i["doc"]["S"]) for i in self._query("org")}
            tenants = {i["sk"]["S"]: json.loads(i["doc"]["S"]) for i in self._query("tenant")}
            keys = {i["sk"]["S"]: _key_record(i) for i in self._query("key")}
            overrides = [Override(**json.loads(i["doc"]["S"])) for i in self._query("override")]
            if self.version() == version:
                overrides.sort(key=lambda o: (o.created_at, o.id))
                return LiveState(version, orgs, tenants, keys, tuple(overrides))
        raise ConfigConflict(f"the config table changed during each of {LOAD_ATTEMPTS} reads")

    def key_by_hash(self, key_hash: str) -> KeyRecord | None:
        """The key whose hash is ``key_hash`` (revoked and expired ones too), or None."""
        key = {"pk": {"S": "key"}, "sk": {"S": key_hash}}
        item = self._call("GetItem", TableName=self.name, Key=key,
                          ConsistentRead=True).get("Item")  # fmt: skip
        return _key_record(item) if item else None

    def audit(self, limit: int = 100, since: float | None = None) -> list[AuditEntry]:
        """The last ``limit`` changes (at or after ``since``, epoch seconds), newest first."""
        meta = self._call("GetItem", TableName=self.name, Key=_META_KEY,
                          ConsistentRead=True).get("Item")  # fmt: skip
        if not meta or "audit_from" not in meta or limit <= 0:
            return []
        first = meta["audit_from"]["S"]
        if since is not None:
            first = max(first, _month(since))
        # One write's items share their instant, and the uuid after it orders them at random:
        # read on to the end of the write the last one wanted belongs to, then order by
        # instant, version, place in the write (the later change first), and cut.
        wanted = limit + MAX_CHANGES - 1
        items: list[dict[str, Any]] = []
        for month in _months_back(_month(self._clock()), first):
            args: dict[str, Any] = {"ScanIndexForward": False, "Limit": wanted - len(items)}
            if since is not None:
                args["KeyConditionExpression"] = "pk = :pk AND sk >= :since"
                args["ExpressionAttributeValues"] = {":since": {"S": _instant(since)}}
            for item in self._query(f"audit#{month}", **args):
                items.append(item)
                if len(items) == wanted:
                    break
            if len(items) == wanted:
                break
        items.sort(key=_audit_order, reverse=True)
        return [_audit_entry(i) for i in items[:limit]]

    # -- writing ------------------------------------------------------------------------------

    def write(self, changes: Sequence[Change], who: str, expect_version: int) -> int:
        """Apply ``changes`` as version ``expect_version + 1``, with an audit item each, all or
        nothing; returns the new version.

        :class:`ConfigConflict` when the table is no longer at ``expect_version`` (another
        writer went first: reload, rebuild the changes, retry). ``ValueError`` for more than
        :data:`MAX_CHANGES` changes (split them: each part is a version of its own) or a change
        that cannot be stored (a plaintext key in it, a record under another id). No changes:
        nothing is written and ``expect_version`` is returned.
        """
        if not changes:
            return expect_version
        if len(changes) > MAX_CHANGES:
            raise ValueError(f"{len(changes)} changes in one write: at most {MAX_CHANGES}")
        now = self._clock()
        new = expect_version + 1
        items: list[dict[str, Any]] = [{"Update": self._version_update(expect_version, now)}]
        items += [self._change_action(c, new) for c in changes]
        stamp = _instant(now)
        items += [
            {"Put": self._audit_put(c, who, new, seq, stamp, now)} for seq, c in enumerate(changes)
        ]
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            # botocore gives the call a ClientRequestToken (an idempotency token, kept across
            # its retries): a retry of a write that did land succeeds, not a conflict with itself.
            self.client.transact_write_items(TransactItems=items)
        except ClientError as e:
            codes = [r.get("Code") for r in e.response.get("CancellationReasons") or []]
            # The version's update is the first action; a transaction racing this one on the
            # same items is a writer that read the same version.
            if codes[:1] == ["ConditionalCheckFailed"] or "TransactionConflict" in codes:
                raise ConfigConflict(
                    f"the config table is no longer at version {expect_version}"
                ) from e
            raise ConfigStoreUnavailable(f"DynamoDB refused the config write: {e}") from e
        except BotoCoreError as e:
            raise ConfigStoreUnavailable(f"DynamoDB unreachable (config write): {e}") from e
        return new

    def _version_update(self, expect_version: int, now: float) -> dict[str, Any]:
        values: dict[str, Any] = {
            ":new": {"N": str(expect_version + 1)},
            ":t": {"N": _number(now)},
            ":m": {"S": _month(now)},
        }
        if expect_version:
            condition = "version = :old"
            values[":old"] = {"N": str(expect_version)}
        else:
            condition = "attribute_not_exists(version)"
        return {
            "TableName": self.name,
            "Key": _META_KEY,
            "UpdateExpression": "SET version = :new, updated_at = :t, "
            "audit_from = if_not_exists(audit_from, :m)",
            "ConditionExpression": condition,
            "ExpressionAttributeValues": values,
        }

    def _change_action(self, change: Change, version: int) -> dict[str, Any]:
        if change.kind not in KINDS:
            raise ValueError(f"unknown kind of change {change.kind!r}")
        key = {"pk": {"S": change.kind}, "sk": {"S": change.id}}
        for value in (change.before, change.after):
            if value is not None:
                _check_value(change, value)
        if change.after is None:
            return {"Delete": {"TableName": self.name, "Key": key}}
        item: dict[str, Any] = {
            **key,
            "doc": {"S": _dumps(_plain(change.after, change.kind))},
            "version": {"N": str(version)},
        }
        if isinstance(change.after, KeyRecord):
            item["tenant"] = {"S": change.after.tenant}
            item["key_id"] = {"S": change.after.id}
        elif isinstance(change.after, Override):
            item[TTL_ATTRIBUTE] = {"N": str(int(change.after.expires_at))}
        return {"Put": {"TableName": self.name, "Item": item}}

    def _audit_put(
        self, change: Change, who: str, version: int, seq: int, stamp: str, now: float
    ) -> dict[str, Any]:
        target = change.id
        record = change.after if change.after is not None else change.before
        if isinstance(record, KeyRecord):
            target = record.id  # readable, and the hash is in before/after anyway
        item = {
            "pk": {"S": f"audit#{_month(now)}"},
            "sk": {"S": f"{stamp}#{uuid.uuid4()}"},
            "at": {"N": _number(now)},
            "who": {"S": who},
            "action": {"S": change.action},
            "kind": {"S": change.kind},
            "target": {"S": target},
            "before": {"S": _dumps(_plain(change.before, change.kind))},
            "after": {"S": _dumps(_plain(change.after, change.kind))},
            "version": {"N": str(version)},
            "seq": {"N": str(seq)},
        }
        return {"TableName": self.name, "Item": item}

    # -- calls --------------------------------------------------------------------------------

    def _query(self, pk: str, **extra: Any) -> Iterator[dict[str, Any]]:
        """Every item of partition ``pk``, page after page (``extra``: more Query arguments)."""
        values = {":pk": {"S": pk}, **extra.pop("ExpressionAttributeValues", {})}
        args: dict[str, Any] = {
            "TableName": self.name,
            "KeyConditionExpression": "pk = :pk",
            "ConsistentRead": True,
            **extra,
            "ExpressionAttributeValues": values,
        }
        while True:
            page = self._call("Query", **args)
            yield from page.get("Items", [])
            if "LastEvaluatedKey" not in page:
                return
            args["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        method = getattr(self.client, _snake(operation))
        try:
            result: dict[str, Any] = method(**kwargs)
        except ClientError as e:
            raise ConfigStoreUnavailable(f"DynamoDB {operation} failed: {e}") from e
        except BotoCoreError as e:
            raise ConfigStoreUnavailable(f"DynamoDB unreachable ({operation}): {e}") from e
        return result


def _check_value(change: Change, value: Any) -> None:
    """Refuse what must never be stored: a record of the wrong type or under another id, a
    tenant document with keys in it (they are items of their own), a plaintext key."""
    expected: type[Any] = {"key": KeyRecord, "override": Override}.get(change.kind, Mapping)
    if not isinstance(value, expected):
        raise ValueError(f"a {change.kind} change holds a {type(value).__name__}")
    if isinstance(value, KeyRecord) and value.hash != change.id:
        raise ValueError(f"key {value.id!r}: its record is stored under its hash, not {change.id}")
    if isinstance(value, Override) and value.id != change.id:
        raise ValueError(f"override {value.id!r} changed under the id {change.id!r}")
    if change.kind == "tenant" and "keys" in value:
        raise ValueError(f"tenant {change.id!r}: its keys are stored as key records")
    if _has_plaintext_key(_plain(value, change.kind)):
        raise ValueError(f"{change.kind} {change.id!r}: holds a plaintext key; store its hash")


def _has_plaintext_key(value: Any) -> bool:
    if isinstance(value, str):
        return _PLAINTEXT_KEY.search(value) is not None
    if isinstance(value, Mapping):
        return any(_has_plaintext_key(k) or _has_plaintext_key(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_plaintext_key(v) for v in value)
    return False


def _plain(value: Any, kind: str) -> Any:
    """A change's side as JSON-able data: a record's fields, or a document without its id."""
    if value is None:
        return None
    if isinstance(value, KeyRecord | Override):
        return _jsonable({f.name: getattr(value, f.name) for f in fields(value)})
    return _jsonable({k: v for k, v in value.items() if k != "id"})


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Decimal):
        # pydantic's limits: a whole number stays an integer, a fraction a float (USD).
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)


def _key_record(item: Mapping[str, Any]) -> KeyRecord:
    return KeyRecord(**json.loads(item["doc"]["S"]))


def _audit_entry(item: Mapping[str, Any]) -> AuditEntry:
    return AuditEntry(
        at=float(item["at"]["N"]),
        who=item["who"]["S"],
        action=item["action"]["S"],
        kind=item["kind"]["S"],
        target=item["target"]["S"],
        before=json.loads(item["before"]["S"]),
        after=json.loads(item["after"]["S"]),
        version=int(item["version"]["N"]),
    )


def _audit_order(item: Mapping[str, Any]) -> tuple[str, int, int]:
    instant = item["sk"]["S"].partition("#")[0]
    return instant, int(item["version"]["N"]), int(item["seq"]["N"])


def _instant(at: float) -> str:
    """``at`` as the audit's sort key text: ISO-8601 UTC to the millisecond."""
    text = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def _month(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y%m")


def _months_back(last: str, first: str) -> Iterator[str]:
    """``YYYYMM`` months from ``last`` down to ``first``, both included."""
    year, month = int(last[:4]), int(last[4:])
    while f"{year:04d}{month:02d}" >= first:
        yield f"{year:04d}{month:02d}"
        year, month = (year, month - 1) if month > 1 else (year - 1, 12)


def _number(value: float) -> str:
    return repr(round(value, 3))


def _snake(operation: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in operation).lstrip("_")
