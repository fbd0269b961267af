"""The durable ledger in DynamoDB: usage totals, the rollup's cursors, settles the cache missed.

One table, two string keys. Items:

* ``pk = usage#<tenant>``, ``sk = <g>#<bucket>#<key>#<route>#<model>#<provider>``, and
  ``#<user>`` after it for a user's requests (``<tenant>~<user>``; items without a user keep
  the six parts, and rows are read from the items' attributes, so items of every release
  read alike): what one key (and user) spent on one route and model in one minute (g ``m``),
  hour (``h``) or day (``d``) — counters written only by the rollup, each write in a
  transaction with the cursor below, so a record is counted exactly once however runs crash
  or overlap.
* ``pk = cursor#<root tag>``, ``sk = <stream generation>``: the last stream entry applied.
* ``pk = epoch#<root tag>``, ``sk = epoch``: how many times the hierarchy's counters were
  restored. Every restore adds one before it reads what DynamoDB holds, and every write of a
  run is conditioned on the epoch the run read when it began: a run that began before a restore
  changes nothing after it, so what the restore read stays what DynamoDB holds.
* ``pk = pending#<root tag>``, ``sk = <reservation id>``: a settle that could not reach the cache,
  charged to the ledger by the next rollup (or restore) and then deleted.
* ``pk = tenants``, ``sk = <tenant>``: every tenant with usage, for listing without a scan.
* ``pk = lastused#<tenant>``, ``sk = <key id>``: ``at_ms``, when the key was last used (the
  latest record the rollup applied for it; only ever moved forward), for ``hardcap admin keys``.
* ``pk = notified#<root tag>``, ``sk = <budget field>#<window id>#<percent>``: a threshold
  notification (rollup/notify.py), ``claimed`` by the one run whose conditional put made it,
  then ``sent``; kept until a week after its window ends (``expires_at``).

This module is the one boundary where botocore's errors become :class:`DurableStoreUnavailable`.
Calls are synchronous (boto3); async callers run them in a thread.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from hardcap_core.errors import DurableStoreUnavailable
from hardcap_core.rollup.records import UsageRecord

KEY_SCHEMA = [
    {"AttributeName": "pk", "KeyType": "HASH"},
    {"AttributeName": "sk", "KeyType": "RANGE"},
]
ATTRIBUTE_DEFINITIONS = [
    {"AttributeName": "pk", "AttributeType": "S"},
    {"AttributeName": "sk", "AttributeType": "S"},
]
TTL_ATTRIBUTE = "expires_at"
# DynamoDB deletes minute rows after a week and hour rows after ~3 months (day rows stay): a
# window is summed from the coarsest rows that fit, so finer rows are needed only at its edges.
KEEP_S = {"m": 7 * 86400, "h": 93 * 86400}
GRANULARITY_MS = {"m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LABEL = {"m": "%Y%m%dT%H%M", "h": "%Y%m%dT%H", "d": "%Y%m%d"}
# TransactWriteItems takes at most 100 actions: the cursor's update, the epoch's check, 98 more.
MAX_WRITES = 98
_HIGHEST = "\U0010ffff"  # sorts after any sort key text


@dataclass(slots=True)
class Totals:
    """Counters of one usage item; what :meth:`add` adds is what a record adds to spend."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cached_input_tokens: int = 0
    cost_nusd: int = 0
    truncated: int = 0
    estimated: int = 0
    refused_busy: int = 0
    refused_exceeded: int = 0
    refused_never: int = 0
    refused_rate: int = 0
    refused_client_gone: int = 0  # its client left the admission queue
    refused_other: int = 0  # a reason this version does not know (a newer gateway's)

    def add(self, r: UsageRecord) -> None:
        if r.refused:
            name = f"refused_{r.outcome}"
            name = name if name in REFUSALS else "refused_other"  # never fail a whole pass
            setattr(self, name, getattr(self, name) + 1)
            return
        self.requests += r.requests
        self.input_tokens += r.input_tokens
        self.output_tokens += r.output_tokens
        self.reasoning_tokens += r.reasoning_tokens
        self.cached_input_tokens += r.cached_input_tokens
        self.cost_nusd += r.cost_nusd
        self.truncated += 1 if r.outcome == "truncated" else 0
        self.estimated += 1 if r.estimate else 0

    def merge(self, other: Totals) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def refused(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self) if f.name.startswith("refused_"))


COUNTERS = tuple(f.name for f in fields(Totals))
REFUSALS = frozenset(name for name in COUNTERS if name.startswith("refused_"))


class Write(StrEnum):
    """How :meth:`UsageTable.apply` ended."""

    APPLIED = "applied"
    MOVED = "moved"  # another run moved the cursor first: nothing written
    FENCED = "fenced"  # a restore began after this run did: nothing written


@dataclass(frozen=True, slots=True)
class Bucket:
    """Where a record's counts go: who, where, and which minute, hour or day."""

    tenant: str
    org: str
    key_id: str
    route: str
    model: str
    provider: str
    granularity: str  # m | h | d
    start_ms: int
    user: str = ""  # the user level's id (tenant~user), "" for requests without a user
    lease: str = ""  # the lease the requests drew from, "" for none

    @classmethod
    def of(cls, r: UsageRecord, granularity: str) -> Bucket:
        size = GRANULARITY_MS[granularity]
        start = r.at_ms // size * size
        return cls(
            r.tenant, r.org, r.key_id, r.route, r.model, r.provider, granularity, start, r.user,
            r.lease,
        )  # fmt: skip

    @property
    def pk(self) -> str:
        return f"usage#{self.tenant}"

    @property
    def sk(self) -> str:
        label = label_of(self.granularity, self.start_ms)
        parts = (self.granularity, label, self.key_id, self.route, self.model, self.provider)
        if self.lease:  # '#<user>#<lease>' (user '' if none): items without a lease as before
            return "#".join((*parts, self.user, self.lease))
        return "#".join((*parts, self.user) if self.user else parts)


@dataclass(frozen=True, slots=True)
class UsageRow:
    """What one key (and user, if any) spent on one route, model and upstream over a window."""

    tenant: str
    org: str
    key_id: str
    route: str
    model: str
    provider: str
    requests: int
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cached_input_tokens: int
    cost_nusd: int
    truncated: int
    estimated: int
    refused: int
    user: str = ""  # the user level's id (tenant~user); "" for requests without a user
    lease: str = ""  # the lease the requests drew from; "" for none


def label_of(granularity: str, start_ms: int) -> str:
    """A bucket's start as sort-key text (UTC), e.g. ``20261201T1145`` for a minute."""
    return datetime.fromtimestamp(start_ms / 1000, UTC).strftime(_LABEL[granularity])


def cover(start_ms: int, end_ms: int) -> list[tuple[str, int, int]]:
    """The fewest buckets that cover [start, end): (granularity, first start, last start)
    runs of minutes, then hours, then days, then hours and minutes again. A start or end inside
    a minute takes that whole minute (a usage total errs toward more)."""
    m, h, d = GRANULARITY_MS["m"], GRANULARITY_MS["h"], GRANULARITY_MS["d"]
    t, end = start_ms // m * m, -(-end_ms // m) * m
    out: list[tuple[str, int, int]] = []

    def run(g: str, until: int) -> None:
        nonlocal t
        size = GRANULARITY_MS[g]
        if until > t:
            out.append((g, t, until - size))
            t = until

    # Minutes up to the first hour boundary, hours up to the first day boundary, if the window
    # reaches them; then whole days, then the hours and minutes of the end's partial day.
    for g, size in (("m", h), ("h", d)):
        boundary = -(-t // size) * size
        if boundary <= end:
            run(g, boundary)
    run("d", max(end // d * d, t))
    run("h", max(end // h * h, t))
    run("m", end)
    return out


class UsageTable:
    """The durable ledger over a boto3 DynamoDB client (``boto3.client("dynamodb")``), made on
    first use when none is given: boto3 costs a cold start ~0.2 s, and a gateway needs the table
    only to restore a lost cache or keep a settle the cache missed."""

    def __init__(self, client: Any, name: str) -> None:
        self._client = client
        self.name = name

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("dynamodb")
        return self._client

    # -- the rollup's writes ------------------------------------------------------------------

    def cursor(self, root: str, generation: str) -> str | None:
        """The last entry of ``root``'s stream (this generation) applied, or None."""
        key = {"pk": {"S": f"cursor#{root}"}, "sk": {"S": generation}}
        item = self._call("GetItem", TableName=self.name, Key=key, ConsistentRead=True).get("Item")
        return item["last_id"]["S"] if item else None

    def apply(
        self,
        root: str,
        generation: str,
        previous: str | None,
        last_id: str,
        totals: Mapping[Bucket, Totals],
        records: int,
        epoch: int = 0,
    ) -> Write:
        """Add ``totals`` and move the cursor from ``previous`` to ``last_id``, all or nothing,
        if the hierarchy's restore epoch is still ``epoch``.

        Nothing is written when the cursor is no longer ``previous`` (another run applied these
        entries first: :attr:`Write.MOVED`) or a restore began since the run read ``epoch``
        (:attr:`Write.FENCED`). At most :data:`MAX_WRITES` buckets and tenants together.
        """
        now_s = int(time.time())
        tenants = sorted({b.tenant for b in totals})
        if len(totals) + len(tenants) > MAX_WRITES:
            raise ValueError(f"{len(totals)} buckets and {len(tenants)} tenants in one write")
        cursor = self._cursor_update(root, generation, previous, last_id, records, now_s)
        fence = self._epoch_is(root, epoch)
        items: list[dict[str, Any]] = [{"Update": cursor}, {"ConditionCheck": fence}]
        items += [{"Update": self._bucket_update(b, t)} for b, t in totals.items()]
        items += [{"Update": self._tenant_update(t, now_s)} for t in tenants]
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.transact_write_items(TransactItems=items)
        except ClientError as e:
            # One reason per action, in order: the cursor's update, then the epoch's check.
            codes = [r.get("Code") for r in e.response.get("CancellationReasons") or []]
            if codes[1:2] == ["ConditionalCheckFailed"]:
                return Write.FENCED
            if codes[:1] == ["ConditionalCheckFailed"]:
                return Write.MOVED
            raise DurableStoreUnavailable(f"DynamoDB refused the usage write: {e}") from e
        except BotoCoreError as e:
            raise DurableStoreUnavailable(f"DynamoDB unreachable: {e}") from e
        return Write.APPLIED

    # -- restores fence the runs that began before them ---------------------------------------

    def epoch(self, root: str) -> int:
        """How many restores ``root``'s hierarchy has had (0: none recorded)."""
        item = self._call("GetItem", TableName=self.name, Key=_epoch_key(root),
                          ConsistentRead=True).get("Item")  # fmt: skip
        return int(item["epoch"]["N"]) if item else 0

    def fence(self, root: str) -> int:
        """Count one more restore of ``root``'s hierarchy; returns the new epoch. From now on no
        run that read an older epoch writes anything."""
        reply = self._call(
            "UpdateItem", TableName=self.name, Key=_epoch_key(root),
            UpdateExpression="ADD epoch :one SET restored_at = :t",
            ExpressionAttributeValues={":one": {"N": "1"}, ":t": {"N": str(int(time.time()))}},
            ReturnValues="UPDATED_NEW",
        )  # fmt: skip
        return int(reply["Attributes"]["epoch"]["N"])

    def _epoch_is(self, root: str, epoch: int) -> dict[str, Any]:
        check: dict[str, Any] = {"TableName": self.name, "Key": _epoch_key(root)}
        if epoch:
            check["ConditionExpression"] = "epoch = :e"
            check["ExpressionAttributeValues"] = {":e": {"N": str(epoch)}}
        else:
            check["ConditionExpression"] = "attribute_not_exists(epoch)"
        return check

    def _cursor_update(
        self, root: str, generation: str, previous: str | None, last_id: str, n: int, now_s: int
    ) -> dict[str, Any]:
        values: dict[str, Any] = {
            ":id": {"S": last_id},
            ":n": {"N": str(n)},
            ":t": {"N": str(now_s)},
        }
        if previous is None:
            condition = "attribute_not_exists(last_id)"
        else:
            condition = "last_id = :prev"
            values[":prev"] = {"S": previous}
        return {
            "TableName": self.name,
            "Key": {"pk": {"S": f"cursor#{root}"}, "sk": {"S": generation}},
            "UpdateExpression": "SET last_id = :id, updated_at = :t ADD applied :n",
            "ConditionExpression": condition,
            "ExpressionAttributeValues": values,
        }

    def _bucket_update(self, b: Bucket, t: Totals) -> dict[str, Any]:
        names = {f"#{c}": c for c in COUNTERS}
        values: dict[str, Any] = {f":{c}": {"N": str(getattr(t, c))} for c in COUNTERS}
        sets = {"tenant": b.tenant, "org": b.org, "key_id": b.key_id, "route": b.route,
                "model": b.model, "provider": b.provider, "granularity": b.granularity}  # fmt: skip
        if b.user:
            sets["user"] = b.user  # only then: an item without a user is as before
        if b.lease:
            sets["lease"] = b.lease  # likewise
        for k, v in sets.items():
            names[f"#{k}"] = k
            values[f":{k}"] = {"S": v}
        names["#start"] = "bucket_start_ms"
        values[":start"] = {"N": str(b.start_ms)}
        assignments = [f"#{k} = :{k}" for k in sets] + ["#start = :start"]
        keep = KEEP_S.get(b.granularity)
        if keep is not None:
            names["#ttl"] = TTL_ATTRIBUTE
            values[":ttl"] = {"N": str(b.start_ms // 1000 + keep)}
            assignments.append("#ttl = :ttl")
        adds = ", ".join(f"#{c} :{c}" for c in COUNTERS)
        return {
            "TableName": self.name,
            "Key": {"pk": {"S": b.pk}, "sk": {"S": b.sk}},
            "UpdateExpression": f"SET {', '.join(assignments)} ADD {adds}",
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }

    def _tenant_update(self, tenant: str, now_s: int) -> dict[str, Any]:
        return {
            "TableName": self.name,
            "Key": {"pk": {"S": "tenants"}, "sk": {"S": tenant}},
            "UpdateExpression": "SET last_seen = :t",
            "ExpressionAttributeValues": {":t": {"N": str(now_s)}},
        }

    # -- settles the cache missed -------------------------------------------------------------

    def put_pending(self, root: str, reservation_id: str, payload: Mapping[str, Any]) -> None:
        """Keep a settle that could not reach the cache. Writing the same one twice is harmless."""
        item = {
            "pk": {"S": f"pending#{root}"},
            "sk": {"S": reservation_id},
            "settle": {"S": json.dumps(payload, separators=(",", ":"))},
            "created_at": {"N": str(int(time.time()))},
        }
        self._call("PutItem", TableName=self.name, Item=item)

    def pending(self, root: str) -> list[tuple[str, dict[str, Any]]]:
        """The settles kept for ``root``'s hierarchy: (reservation id, payload), oldest id first."""
        out = []
        for item in self._query(f"pending#{root}"):
            out.append((item["sk"]["S"], json.loads(item["settle"]["S"])))
        return out

    def delete_pending(self, root: str, reservation_id: str) -> None:
        key = {"pk": {"S": f"pending#{root}"}, "sk": {"S": reservation_id}}
        self._call("DeleteItem", TableName=self.name, Key=key)

    # -- when each key was last used ----------------------------------------------------------

    def touch_last_used(self, tenant: str, key_id: str, at_ms: int) -> None:
        """Record that ``key_id`` was used at ``at_ms``, unless a later use is recorded."""
        self._call(
            "UpdateItem", TableName=self.name,
            Key={"pk": {"S": f"lastused#{tenant}"}, "sk": {"S": key_id}},
            UpdateExpression="SET at_ms = :t", ExpressionAttributeValues={":t": {"N": str(at_ms)}},
            ConditionExpression="attribute_not_exists(at_ms) OR at_ms < :t",
            refused_ok="ConditionalCheckFailedException",  # a later use is recorded already
        )  # fmt: skip

    def last_used(self, tenant: str) -> dict[str, float]:
        """When each key of ``tenant`` was last used (epoch seconds), by key id."""
        return {
            item["sk"]["S"]: int(item["at_ms"]["N"]) / 1000
            for item in self._query(f"lastused#{tenant}")
        }

    # -- threshold notifications: one claim per threshold and window --------------------------

    def claim_notice(
        self, root: str, sk: str, owner: str, now_s: int, stale_s: int, expires_s: int
    ) -> bool:
        """Claim the notification ``sk`` of ``root``'s hierarchy for ``owner``: True for the one
        caller whose write made it (or took over a claim older than ``stale_s``, left by a run
        that died before sending), False when it is claimed or sent already."""
        return self._conditional(
            "PutItem", TableName=self.name,
            Item={"pk": {"S": f"notified#{root}"}, "sk": {"S": sk}, "state": {"S": "claimed"},
                  "owner": {"S": owner}, "claimed_at": {"N": str(now_s)},
                  TTL_ATTRIBUTE: {"N": str(expires_s)}},
            ConditionExpression=(
                "attribute_not_exists(pk) OR (#s = :claimed AND claimed_at < :stale)"
            ),
            ExpressionAttributeNames={"#s": "state"},
            ExpressionAttributeValues={":claimed": {"S": "claimed"},
                                       ":stale": {"N": str(now_s - stale_s)}},
        )  # fmt: skip

    def notice_sent(self, root: str, sk: str, owner: str) -> bool:
        """Mark ``owner``'s claim sent; False if another run took it over meanwhile."""
        return self._conditional(
            "UpdateItem", TableName=self.name, Key=_notice_key(root, sk),
            UpdateExpression="SET #s = :sent", ConditionExpression="#o = :owner",
            ExpressionAttributeNames={"#s": "state", "#o": "owner"},
            ExpressionAttributeValues={":sent": {"S": "sent"}, ":owner": {"S": owner}},
        )  # fmt: skip

    def release_notice(self, root: str, sk: str, owner: str) -> None:
        """Give up ``owner``'s unsent claim (its send failed): the next pass claims it anew."""
        self._conditional(
            "DeleteItem", TableName=self.name, Key=_notice_key(root, sk),
            ConditionExpression="#o = :owner AND #s = :claimed",
            ExpressionAttributeNames={"#s": "state", "#o": "owner"},
            ExpressionAttributeValues={":owner": {"S": owner}, ":claimed": {"S": "claimed"}},
        )  # fmt: skip

    def notices(self, root: str) -> dict[str, str]:
        """Every notification of ``root``'s hierarchy still kept: sort key -> state."""
        return {i["sk"]["S"]: i["state"]["S"] for i in self._query(f"notified#{root}")}

    def _conditional(self, operation: str, **kwargs: Any) -> bool:
        """One conditional write: whether its condition held."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            getattr(self.client, _snake(operation))(**kwargs)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False
            raise DurableStoreUnavailable(f"DynamoDB {operation} failed: {e}") from e
        except BotoCoreError as e:
            raise DurableStoreUnavailable(f"DynamoDB unreachable ({operation}): {e}") from e
        return True

    # -- reading usage ------------------------------------------------------------------------

    def tenants(self) -> list[str]:
        """Every tenant the table holds usage for."""
        return [item["sk"]["S"] for item in self._query("tenants")]

    def usage(self, tenants: Iterable[str] | None, start_ms: int, end_ms: int) -> list[UsageRow]:
        """What each key (and user) spent per route, model and upstream in [start, end), summed
        from the coarsest buckets that cover it (a partial minute at either end counts whole).
        ``tenants=None``: every tenant with usage."""
        sums: dict[tuple[str, ...], Totals] = {}
        for tenant in self.tenants() if tenants is None else tenants:
            for g, first, last in cover(start_ms, end_ms):
                lo, hi = f"{g}#{label_of(g, first)}", f"{g}#{label_of(g, last)}#{_HIGHEST}"
                for item in self._query(f"usage#{tenant}", (lo, hi)):
                    who = tuple(item.get(k, {}).get("S", "") for k in _WHO)
                    total = sums.setdefault(who, Totals())
                    total.merge(Totals(**{c: int(item.get(c, {}).get("N", "0")) for c in COUNTERS}))
        return [_row(who, t) for who, t in sorted(sums.items())]

    def _query(self, pk: str, between: tuple[str, str] | None = None) -> Iterator[dict[str, Any]]:
        args: dict[str, Any] = {
            "TableName": self.name,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": pk}},
            "ConsistentRead": True,
        }
        if between:
            args["KeyConditionExpression"] += " AND sk BETWEEN :lo AND :hi"
            args["ExpressionAttributeValues"].update(
                {":lo": {"S": between[0]}, ":hi": {"S": between[1]}}
            )
        while True:
            page = self._call("Query", **args)
            yield from page.get("Items", [])
            if "LastEvaluatedKey" not in page:
                return
            args["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _call(self, operation: str, refused_ok: str = "", **kwargs: Any) -> dict[str, Any]:
        """One call; ``refused_ok``: an error code that is an answer (an empty reply), not a
        failure."""
        from botocore.exceptions import BotoCoreError, ClientError

        method = getattr(self.client, _snake(operation))
        try:
            result: dict[str, Any] = method(**kwargs)
        except ClientError as e:
            if refused_ok and e.response.get("Error", {}).get("Code") == refused_ok:
                return {}
            raise DurableStoreUnavailable(f"DynamoDB {operation} failed: {e}") from e
        except BotoCoreError as e:
            raise DurableStoreUnavailable(f"DynamoDB unreachable ({operation}): {e}") from e
        return result


_WHO = ("tenant", "org", "key_id", "route", "model", "provider", "user", "lease")  # "" absent


def _notice_key(root: str, sk: str) -> dict[str, Any]:
    return {"pk": {"S": f"notified#{root}"}, "sk": {"S": sk}}


def _epoch_key(root: str) -> dict[str, Any]:
    return {"pk": {"S": f"epoch#{root}"}, "sk": {"S": "epoch"}}


def _row(who: tuple[str, ...], t: Totals) -> UsageRow:
    tenant, org, key_id, route, model, provider, user, lease = who
    return UsageRow(
        tenant, org, key_id, route, model, provider, t.requests, t.input_tokens,
        t.output_tokens, t.reasoning_tokens, t.cached_input_tokens, t.cost_nusd, t.truncated,
        t.estimated, t.refused, user, lease,
    )  # fmt: skip


def _snake(operation: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in operation).lstrip("_")


def create_table(client: Any, name: str) -> None:
    """Create the table as the SAM template defines it (for moto and local runs)."""
    client.create_table(
        TableName=name,
        KeySchema=KEY_SCHEMA,
        AttributeDefinitions=ATTRIBUTE_DEFINITIONS,
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(TableName=name)
    client.update_time_to_live(
        TableName=name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
    )
