"""The budget ledger: admit -> extend -> settle, each one atomic Lua script on Valkey/Redis.

The invariant ``used + reserved <= limit`` holds after every admit and every extend, for every
budget a request touches, because the server runs one script at a time. (Settle may push used
past a limit: it charges what was really billed. Admit then refuses, and extend never adds to a
budget beyond its limit.) This module turns scopes into keys and arguments and calls the
scripts; :mod:`.replies` turns replies into typed results, so callers never see a raw reply.
Connection failures become :class:`LedgerUnavailable` in :mod:`.connection` and nowhere else.

A reservation whose settle never comes (its instance died) expires after the TTL. Admitted with
``charge_on_expiry``, it is then charged its hold (the gateway's own upper estimate of what the
provider generated) instead of being returned; a settle that arrives after all charges only the
difference. An admit carries the latest server time it may still reserve at (its "not after":
the expected server time plus the call's timeout, less a margin), so an admit that ran after the
caller gave up (a frozen server that resumed) reserves nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

from hardcap_core.budgets import Prices, Scope
from hardcap_core.config.settings import DEFAULT_GATEWAY
from hardcap_core.errors import LedgerProtocolError, LedgerUnavailable
from hardcap_core.ledger.allowances import Allowances, SharedBudget, SharedLimits
from hardcap_core.ledger.connection import SOCKET_TIMEOUT_S, guarded
from hardcap_core.ledger.contract import (
    REPLIES,
    AdmitArgs,
    ConfigVersionArgs,
    EstimatorRecordArgs,
    EstimatorVoteArgs,
    ExtendArgs,
    HydrateArgs,
    LeaveArgs,
    SettleArgs,
    UsageArgs,
    dumps,
    encode,
    named,
)
from hardcap_core.ledger.keys import Keyspace, window_of_spec
from hardcap_core.ledger.limits import LATE_MARGIN_MS, SCRIPT_ATTEMPTS, SETTLE_MEMORY_MS
from hardcap_core.ledger.plan import Plans, ScopePlan, shared_rows, shared_windows
from hardcap_core.ledger.replies import (
    NO_META,
    AdmitResult,
    Consensus,
    EstimatorStats,
    ExtendResult,
    ReplyReader,
    Reservation,
    ReservationMeta,
    Settled,
    SettleNote,
    Unguarded,
    Usage,
    parse_admit,
    parse_consensus,
    parse_estimator,
    parse_extend,
    parse_settle,
    parse_usage,
)
from hardcap_core.ledger.restore import CounterSource, NoCounterSource
from hardcap_core.ledger.scripts import Script, Scripts

# The config's `gateway.reservation_ttl_seconds` default, for a ledger built without a config.
DEFAULT_RESERVATION_TTL_S = DEFAULT_GATEWAY.reservation_ttl_seconds
FREE = Prices()
COMPLETED = SettleNote()  # a settle's record says nothing more than 'completed'

# (server time guess, extra window specs) -> (keys, args)
Build = Callable[[int, tuple[str, ...]], tuple[list[str], list[Any]]]


class Ledger:
    """Typed client of the ledger scripts. One per process; safe to share between tasks.

    ``client`` is a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster``.
    """

    def __init__(
        self,
        client: Any,
        *,
        reservation_ttl_s: float = DEFAULT_RESERVATION_TTL_S,
        prefix: str = "hc",
        call_timeout_s: float = SOCKET_TIMEOUT_S,
        counters: CounterSource | None = None,
    ) -> None:
        self.client = client
        # Where a hierarchy's counters come back from when the cache has lost them.
        self.counters: CounterSource = counters or NoCounterSource()
        # One restore per hierarchy at a time in this process; the others wait for it.
        self._restoring: dict[str, asyncio.Future[None]] = {}
        self.scripts = Scripts.register(client)
        self.keys = Keyspace(prefix)
        self.plans = Plans(self.keys)
        # Limits spanning tenants (a route's, an upstream's): each hierarchy's allowance of them.
        self.allowances = Allowances(self.scripts, self.keys)
        self.ttl_ms = int(reservation_ttl_s * 1000)
        # How long after sending a call gives up (the client's socket timeout); an admit must
        # run before then, less LATE_MARGIN_MS, or reserve nothing.
        self.call_timeout_ms = int(call_timeout_s * 1000)
        # Server time minus local time, learned from every reply; only used to guess which
        # window keys to name. The scripts check the guess against the server's own clock.
        self._offset_ms = 0

    # -- public API ---------------------------------------------------------------------------

    async def admit(
        self,
        scope: Scope,
        *,
        input_tokens: int,
        output_estimate: int,
        min_output: int | None = None,
        prices: Prices = FREE,
        reservation_id: str | None = None,
        fail_open: bool = False,
        meta: ReservationMeta = NO_META,
        charge_on_expiry: bool = False,
        queue_ticket_ms: int = 0,
        queue_priority: int = 0,
        headroom: int = 0,
        config_version: int | None = None,
        record_refusal: bool = True,
        shared: SharedLimits | None = None,
    ) -> AdmitResult:
        """Check rate limits and every budget of ``scope``; reserve the estimate if it fits.

        Output is reserved up to ``output_estimate``, shrunk to what the budgets still hold, but
        never below ``min_output`` (default: the whole estimate, i.e. no shrinking). ``meta``
        goes on the reservation record for the usage record its settle writes (its tenant is
        filled from ``scope`` when empty).
        ``charge_on_expiry``: if no settle comes before the hold expires, charge the hold (the
        caller's upper estimate of what the provider generated) instead of returning it.
        Refused with ``never_fits`` when the input and least output exceed a budget's whole
        limit. An admit the server runs after this call gave up reserves nothing.
        ``queue_ticket_ms`` > 0: where the request would wait for holds in flight to settle, it
        takes (or renews) a ticket in its tenant's first-come-first-served queue that lapses
        after that long, and gets :class:`Queued`; call again with the same
        ``reservation_id`` to be admitted in turn, or :meth:`leave_queue`. 0: it is refused
        ``budget_busy`` instead. ``queue_priority``: its class in the queue (a higher one
        goes ahead of every lower one). ``headroom``: output tokens each hold in flight on a budget
        keeps free for its extends; a request waits rather than take them.
        ``config_version``: the version of the caller's live config; if an admin change
        published a newer one for this hierarchy, nothing is reserved and
        :class:`ConfigStale` is raised (reload the config, authenticate again, call again).
        ``record_refusal`` False: a refusal appends no usage record (the caller asks again at
        once, with a smaller input, and that answer is the one recorded).
        ``shared``: limits over every tenant (the route's and its upstream's) checked in the same
        admit against this hierarchy's allowances of them, which are topped up from each limit
        first where short (:mod:`.allowances`); a refusal by one names it (``Refused.shared``).
        If the server cannot be reached: :class:`Unguarded` when ``fail_open``, else raise
        :class:`LedgerUnavailable`.
        """
        if input_tokens < 0 or output_estimate < 1:
            raise ValueError("input_tokens must be >= 0 and output_estimate >= 1")
        least = output_estimate if min_output is None else max(1, min(min_output, output_estimate))
        rid = reservation_id or uuid.uuid4().hex
        plan = self.plans.of(scope, shared)
        meta = _with_levels(meta, plan)
        record = dumps(meta.record())
        settled = plan.settled_prefix + rid
        ask = [shared is not None]  # admit.lua: answer 'grant' where an allowance is short

        def build(now_ms: int, more: tuple[str, ...]) -> tuple[list[str], list[Any]]:
            used_keys, rows, windows = self._spec(plan, now_ms, more)
            return encode(
                AdmitArgs(
                    ledger=plan.ledger_keys, settled=settled, queue=plan.queue_keys,
                    config=plan.config_key, used=used_keys, reservation_id=rid,
                    ttl_ms=self.ttl_ms, rows=rows, windows=windows,
                    settle_memory_ms=SETTLE_MEMORY_MS, ask_grant=ask[0], rates=plan.rates_json,
                    input_tokens=input_tokens, output_estimate=output_estimate,
                    min_output=least, price_in=prices.input_nusd, price_out=prices.output_nusd,
                    meta=record, charge_on_expiry=charge_on_expiry, levels=plan.levels_json,
                    queue_ticket_ms=queue_ticket_ms, queue_priority=queue_priority,
                    headroom=headroom, config_version=config_version,
                    no_refusal_record=not record_refusal,
                    # admitted against the lease too, and drawn from its hold
                    lease=meta.lease or None,
                    not_after_ms=now_ms + self.call_timeout_ms - LATE_MARGIN_MS,
                )
            )  # fmt: skip

        try:
            reply = await self._run(self.scripts.admit, build, scope=scope)
            # A shared limit's allowance is short: top it up, admit again. The last call (or one
            # after a limit had too little left) decides on the allowance there is.
            for last in (False, False, True):
                if reply[0] != "grant" or shared is None:
                    break
                if await self._top_up(plan, shared, reply) or last:
                    ask[0] = False
                reply = await self._run(self.scripts.admit, build, scope=scope)
        except LedgerUnavailable as e:
            if fail_open:
                return Unguarded(str(e), rid)
            raise
        asked = Reservation(rid, scope, prices, input_tokens, output_estimate, meta, shared)
        return parse_admit(reply, scope, asked)

    async def leave_queue(
        self,
        scope: Scope,
        reservation_id: str,
        *,
        meta: ReservationMeta = NO_META,
        outcome: Literal["busy", "client_gone"] = "busy",
    ) -> bool:
        """Give up ``reservation_id``'s place in its tenant's admission queue, recording the
        refusal once with ``outcome``: ``busy`` (it waited as long as it could) or
        ``client_gone`` (its client left); True if it was still waiting."""
        plan = self.plans.of(scope)
        record = dumps(_with_levels(meta, plan).record())
        keys, args = encode(
            LeaveArgs(ledger=plan.ledger_keys, queue=plan.queue_keys,
                      reservation_id=reservation_id, record=record, outcome=outcome)
        )  # fmt: skip
        reply = await guarded(self.scripts.leave(keys=keys, args=args))
        return bool(int(named(REPLIES["leave"]["ok"], reply, 1)["waiting"]))

    async def extend(
        self, reservation: Reservation, tokens: int, *, least: int = 1
    ) -> ExtendResult:
        """Grow ``reservation`` by up to ``tokens`` output tokens (at least ``least``), or refuse.

        ``tokens=0`` only refreshes the expiry (a heartbeat for slow streams).
        """
        if tokens < 0:
            raise ValueError("tokens must be >= 0")
        scope = reservation.scope
        plan = self.plans.of(scope, reservation.shared)

        ask = [plan.shared is not None and tokens > 0]  # extend.lua: 'grant' if short

        def build(now_ms: int, more: tuple[str, ...]) -> tuple[list[str], list[Any]]:
            used_keys, rows, windows = self._spec(plan, now_ms, more)
            return encode(
                ExtendArgs(
                    ledger=plan.ledger_keys, used=used_keys, reservation_id=reservation.id,
                    tokens=tokens, least=least, ttl_ms=self.ttl_ms, rows=rows, windows=windows,
                    settle_memory_ms=SETTLE_MEMORY_MS, ask_grant=ask[0],
                )
            )  # fmt: skip

        reply = await self._run(self.scripts.extend, build)
        if reply[0] == "grant" and plan.shared is not None:
            # This hierarchy's allowance of a shared limit is short: top it up, ask once more.
            await self._top_up(plan, plan.shared, reply)
            ask[0] = False
            reply = await self._run(self.scripts.extend, build)
        result = parse_extend(reply, scope, plan.shared)
        return result

    async def settle(
        self,
        reservation: Reservation,
        *,
        input_tokens: int,
        output_tokens: int,
        note: SettleNote = COMPLETED,
        cost_nusd: int | None = None,
    ) -> Settled:
        """Release ``reservation``, charge the real counts and append their usage record (with
        ``note``). Retry-safe: never charges or records twice. ``cost_nusd``: the cost when it
        is not the counts at the reservation's prices (cached input, another target's prices).

        If the hold expired and was charged at expiry, only the difference is charged
        (:attr:`Settled.expiry_charged`)."""
        scope = reservation.scope
        prices = reservation.prices
        plan = self.plans.of(scope, reservation.shared)
        record = dumps(note.record(_with_levels(reservation.meta, plan)))
        cost = None if cost_nusd is None else max(int(cost_nusd), 0)
        settled = plan.settled_prefix + reservation.id

        def build(now_ms: int, more: tuple[str, ...]) -> tuple[list[str], list[Any]]:
            used_keys, rows, windows = self._spec(plan, now_ms, more)
            return encode(
                SettleArgs(
                    ledger=plan.ledger_keys, settled=settled, used=used_keys,
                    reservation_id=reservation.id, input_tokens=max(input_tokens, 0),
                    output_tokens=max(output_tokens, 0), memory_ms=SETTLE_MEMORY_MS, rows=rows,
                    windows=windows, settle_memory_ms=SETTLE_MEMORY_MS,
                    price_in=prices.input_nusd, price_out=prices.output_nusd, record=record,
                    cost_nusd=cost,
                )
            )  # fmt: skip

        return parse_settle(await self._run(self.scripts.settle, build, scope=scope), scope)

    async def release_allowances(self, scope: Scope, shared: SharedLimits) -> dict[str, int]:
        """Return ``scope``'s hierarchy's unused allowance of ``shared`` to each limit (what is
        used and held stays); what each field gave back."""
        root = scope.root.tag
        return await self.allowances.release(root, shared.budgets, self.server_now_ms())

    async def _top_up(self, plan: ScopePlan, shared: SharedLimits, reply: list[Any]) -> bool:
        """Grant what an admit's 'grant' reply says each shared row lacks; True if some limit
        had too little left to give it."""
        first = len(plan.scope.budgets) + 1  # admit.lua's row numbers: the shared rows follow
        wanted: list[tuple[SharedBudget, int]] = []
        r = ReplyReader(plan.scope, reply)
        while r.pos < len(reply):  # REPLIES' (row, need), once per short row
            f = r.fields("admit")
            wanted.append((shared.budgets[int(f["row"]) - first], int(f["need"])))
        given = await self.allowances.grant(plan.scope.root.tag, wanted, r.now_ms)
        return any(given.get(b.field, 0) < need for b, need in wanted)

    async def publish_config_version(self, roots: Sequence[str], version: int) -> None:
        """Tell every gateway instance whose config is older than ``version`` that it is, in
        its next admit of a hierarchy under ``roots`` (root tags: ``o:acme``, ``t:beta``)
        (``lua/config_version.lua``; a version only moves forward)."""
        for root in dict.fromkeys(roots):  # each hierarchy in its own slot: a call each
            keys, args = encode(
                ConfigVersionArgs(version_key=self.keys.config_version(root), version=int(version))
            )
            await guarded(self.scripts.config_version(keys=keys, args=args))

    async def published_config_version(self, root: str) -> int:
        """The newest config version published for the hierarchy whose root's tag is ``root``
        (0: none yet): what a request the live config would refuse reads, having no admit to
        learn it from (``control/live.py``)."""
        raw = await guarded(self.client.get(self.keys.config_version(root)))
        return int(raw or 0)

    async def usage(self, scope: Scope, *, rates: bool = False) -> Usage:
        """Used, reserved and reset of every budget in ``scope`` (expired holds reclaimed first),
        and the live reservations of each of its levels (its tenant's as ``live_reservations``);
        with ``rates``, each rate limit's state too (as an admit would see it, read only)."""

        plan = self.plans.of(scope)
        rates_json = plan.rates_json if rates else None

        def build(now_ms: int, more: tuple[str, ...]) -> tuple[list[str], list[Any]]:
            used_keys, rows, windows = self._spec(plan, now_ms, more)
            return encode(
                UsageArgs(
                    ledger=plan.ledger_keys, used=used_keys, rows=rows, windows=windows,
                    settle_memory_ms=SETTLE_MEMORY_MS, levels=plan.levels_json, rates=rates_json,
                )
            )  # fmt: skip

        return parse_usage(await self._run(self.scripts.usage, build, scope=scope), scope)

    async def restore(self, scope: Scope) -> None:
        """Put the counters of ``scope``'s hierarchy back from :attr:`counters`, unless they are
        in place already (another instance, or another task here, got there first)."""
        tag = scope.root.tag
        running = self._restoring.get(tag)
        if running is not None:
            # Its outcome is not ours to raise: the script called again says whether it worked
            # (and if not, this caller restores in turn).
            await asyncio.wait([running])
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._restoring[tag] = done
        try:
            await self._restore(scope)
        finally:
            del self._restoring[tag]
            done.set_result(None)

    async def _restore(self, scope: Scope) -> None:
        restore = await self.counters.used(scope, self.server_now_ms())
        whole = restore.scope
        note = restore.source

        def build(now_ms: int, more: tuple[str, ...]) -> tuple[list[str], list[Any]]:
            used_keys, budget_rows, windows = self._budget_spec(whole, now_ms)
            rows = [
                [row[3], row[0], int(restore.used[row[0]])]
                for row in budget_rows
                if restore.used.get(row[0])
            ]
            return encode(
                HydrateArgs(ledger=self.keys.ledger(whole), used=used_keys, windows=windows,
                            rows=rows, source=note)
            )  # fmt: skip

        reply = await self._run(self.scripts.hydrate, build, restoring=True)
        if reply[0] not in ("ok", "done"):
            raise LedgerProtocolError(f"hydrate replied {reply[0]!r}")
        await self.counters.restored(scope)

    async def estimator_stats(self, route: str, tenant: str | None = None) -> EstimatorStats:
        """The output-length quantile of ``route``: ``tenant``'s own sample, or with no tenant
        the route's pooled one (0 and 0 before any sample)."""
        _, stats_key = self.keys.estimator(route, tenant)
        raw = await guarded(self.client.hmget(stats_key, "q", "n"))
        return EstimatorStats(int(float(raw[0] or 0)), int(raw[1] or 0))

    async def record_output(
        self,
        route: str,
        tokens: int,
        *,
        keep: int,
        quantile: float,
        recompute_every: int,
        tenant: str | None = None,
    ) -> EstimatorStats:
        """Add one completed reply's output length to ``tenant``'s sample of ``route`` (with no
        tenant: the route's pooled sample)."""
        samples, stats = self.keys.estimator(route, tenant)
        keys, args = encode(
            EstimatorRecordArgs(samples=samples, stats=stats, tokens=tokens, keep=keep,
                                quantile=quantile, recompute_every=recompute_every)
        )  # fmt: skip
        return parse_estimator(await guarded(self.scripts.estimator_record(keys=keys, args=args)))

    async def vote_output(self, route: str, tenant: str, value: int) -> Consensus:
        """Set ``tenant``'s vote on ``route``'s consensus to its own quantile (0 withdraws)."""
        votes, consensus = self.keys.estimator_votes(route)
        keys, args = encode(
            EstimatorVoteArgs(votes=votes, consensus=consensus, tenant=tenant, value=value)
        )
        reply = await guarded(self.scripts.estimator_vote(keys=keys, args=args))
        return parse_consensus(reply)

    async def output_consensus(self, route: str) -> Consensus:
        """The upper median of the tenants' quantiles on ``route`` and how many voted."""
        _, consensus_key = self.keys.estimator_votes(route)
        raw = await guarded(self.client.hmget(consensus_key, "q", "t"))
        return Consensus(int(float(raw[0] or 0)), int(raw[1] or 0))

    async def ping(self) -> None:
        """Raise :class:`LedgerUnavailable` unless the server answers."""
        await guarded(self.client.ping())

    # -- internals ----------------------------------------------------------------------------

    def server_now_ms(self) -> int:
        """Best guess of the server's clock, from the offset seen in earlier replies."""
        return int(time.time() * 1000) + self._offset_ms

    def _spec(
        self, plan: ScopePlan, now_ms: int, more: tuple[str, ...]
    ) -> tuple[list[str], str, str]:
        """Used keys, and the budget rows and window rows as JSON (the spec's ``b`` and ``w``).
        From the plan, unless ``more`` names other windows (an expired hold of another scope of
        the hierarchy)."""
        if more:
            used_keys, rows, windows = self._budget_spec(plan.scope, now_ms, more, plan.shared)
            return used_keys, dumps(rows), dumps(windows)
        used_keys, windows_json = plan.current(now_ms)
        return used_keys, plan.rows_json, windows_json

    def _budget_spec(
        self,
        scope: Scope,
        now_ms: int,
        more: tuple[str, ...] = (),
        shared: SharedLimits | None = None,
    ) -> tuple[list[str], list[list[Any]], list[list[Any]]]:
        """Used keys, budget rows (b) and window rows (w) of ``scope``'s windows at ``now_ms``,
        then of the windows ``more`` names (for expired holds of other scopes in the
        hierarchy)."""
        windows = list(shared_windows(scope, shared))
        index = {w.spec: i for i, w in enumerate(windows)}
        for spec in more:
            if spec not in index:
                index[spec] = len(windows)
                windows.append(window_of_spec(spec))
        bounds = [w.bounds(now_ms) for w in windows]
        used_keys = [self.keys.used(scope, b.spec, b.id) for b in bounds]
        rows = [
            [b.field, b.dimension.short, b.limit, index[b.window.spec] + 1] for b in scope.budgets
        ] + shared_rows(shared, {spec: i + 1 for spec, i in index.items()})
        w: list[list[Any]] = [[b.start_ms, b.end_ms, b.spec] for b in bounds]
        return used_keys, rows, w

    async def _run(
        self, script: Script, build: Build, *, scope: Scope | None = None, restoring: bool = False
    ) -> list[Any]:
        """Call ``script`` with keys and args built for the server's time; call again on
        'clock' and 'late' (a better time guess), 'windows' (naming those windows too) and
        'hydrate' (once ``scope``'s counters are restored)."""
        more: tuple[str, ...] = ()
        status = ""
        for _ in range(SCRIPT_ATTEMPTS):
            keys, args = build(self.server_now_ms(), more)
            reply = await guarded(script(keys=keys, args=args))
            if not isinstance(reply, list) or len(reply) < 2:
                raise LedgerProtocolError(f"a script replied {reply!r}")
            status = reply[0]
            if isinstance(status, bytes):
                status = reply[0] = status.decode()
            self._offset_ms = int(reply[1]) - int(time.time() * 1000)
            if status == "windows":
                more = (*more, *_window_specs(reply[2:], more))
            elif status == "hydrate" and scope is not None and not restoring:
                await self.restore(scope)
            elif status not in ("clock", "late"):
                return reply
        if status == "late":
            raise LedgerUnavailable("the budget server answered too late to reserve")
        if status == "windows":
            raise LedgerProtocolError("a script kept asking for more windows")
        if status == "hydrate":
            raise LedgerProtocolError("the counters were restored but a script still asks for it")
        raise LedgerUnavailable("the budget server's clock keeps moving across a window boundary")


def _window_specs(named: list[Any], known: tuple[str, ...]) -> list[str]:
    """The window specs a 'windows' reply names that are not in ``known``, checked."""
    out = []
    for x in (n.decode() if isinstance(n, bytes) else str(n) for n in named):
        try:
            window_of_spec(x)
        except ValueError as e:
            raise LedgerProtocolError(f"a script asked for window {x!r}: {e}") from e
        if x not in known and x not in out:
            out.append(x)
    return out


def _with_levels(meta: ReservationMeta, plan: ScopePlan) -> ReservationMeta:
    """``meta`` with its tenant and org filled from the plan's scope where empty."""
    tenant, org = plan.tenant, plan.org
    if (meta.tenant or not tenant) and (meta.org or not org):
        return meta
    if meta is NO_META:
        return plan.no_meta
    return dataclasses.replace(meta, tenant=meta.tenant or tenant, org=meta.org or org)
