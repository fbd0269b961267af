"""Trying a route's targets in turn: the route itself, then its fallbacks.

A target is skipped while its upstream's breaker is open, and left for the next one when it
answers 429 or 5xx, times out, or cannot be reached — all before any byte reached the client:
once a stream is open, nothing is retried (the provider may have generated, and bills, what it
sent). The reservation belongs to the request, not the target: it was made at the chain's
highest prices, and the meter is told which target served, so the charge is priced by the
target actually used.

A failure counts toward the upstream's shared breaker unless the request shaped it
(:func:`blame`): a 4xx other than 408 and 429, and a timeout it asked for by its output cap,
say nothing of the upstream. A counted failure is evidence from the request's tenant, and the
breaker opens only on evidence from two tenants while two use the upstream
(:mod:`hardcap_core.ledger.breakers`), so one tenant cannot open it for the others.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from hardcap_core.budgets import LevelKind, Scope
from hardcap_core.chat import ChatRequest
from hardcap_core.config import Route
from hardcap_core.errors import (
    GatewayError,
    TooManyRequests,
    UpstreamFailed,
    UpstreamMalformed,
    UpstreamRefused,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from hardcap_core.events import Completion, Read
from hardcap_core.gateway.meter import Meter
from hardcap_core.ledger.breakers import Breakers, BreakerState
from hardcap_core.logs import logger
from hardcap_core.providers.base import Provider

if TYPE_CHECKING:  # imported only when tracing is on
    from hardcap_core.gateway.tracing import Child

T = TypeVar("T")
# How long a stream's opening reads are held back while waiting for its first output (a model
# that thinks silently longer than this is taken as served).
PEEK_S = 2.0
# The slowest a healthy upstream is taken to generate, tokens per second: a request whose
# output cap takes longer than the upstream's timeout at this rate may time out by its own
# asking. (Hosted models stream 20-200 tokens/s; large ones on a busy provider, ~15.)
SLOWEST_TOKENS_PER_S = 10.0


class AllTargetsDown(UpstreamFailed):
    """Every target of the route failed or had its breaker open."""

    code = "upstreams_unavailable"


def can_fail_over(error: BaseException) -> bool:
    """Whether another target may be tried after ``error``: the upstream was rate limited,
    failed, timed out or could not be reached — not a bad request, not a reply it generated."""
    if isinstance(error, UpstreamMalformed):
        return False
    if isinstance(error, TooManyRequests):
        return error.code == "upstream_rate_limited"
    return isinstance(error, UpstreamFailed | UpstreamTimeout)


class Blame(enum.Enum):
    """Whose failure a failed attempt was, as the upstream's breaker counts it."""

    REQUEST = "request"  # the request's own shape: not counted
    TENANT = "tenant"  # counted, as evidence from the request's tenant
    NOBODY = "nobody"  # counted, as evidence no tenant shaped: no connection could be opened


def blame(error: GatewayError, route: Route, cap: int, generating: bool) -> Blame:
    """Whose failure ``error`` (one :func:`can_fail_over` allows) was. A 4xx other than 408
    and 429 is the request's: the upstream answered. A timeout is the request's when the wait
    that ran out may have been the upstream ``generating`` what it asked for (a whole reply, or
    a stream's silence after its 200: a model thinking) and its output ``cap`` takes longer than
    the upstream's timeout at :data:`SLOWEST_TOKENS_PER_S`. A stream's timeout before its
    status is the upstream's: a provider answers a stream before it generates."""
    if isinstance(error, UpstreamRefused):
        return Blame.REQUEST
    if isinstance(error, UpstreamUnreachable):
        return Blame.NOBODY
    asked_for_long = cap > route.upstream.timeout_seconds * SLOWEST_TOKENS_PER_S
    if isinstance(error, UpstreamTimeout) and generating and asked_for_long:
        return Blame.REQUEST
    return Blame.TENANT


def witness(scope: Scope) -> str:
    """Who a request's failures are evidence from: its tenant (a scope has one; else its first
    level, which stands alone)."""
    return next((lv.tag for lv in scope.levels if lv.kind is LevelKind.TENANT), scope.levels[0].tag)


class Targets:
    """A request's chain of targets, its breakers and the meter that charges it."""

    def __init__(
        self,
        chain: Sequence[Route],
        providers: Mapping[str, Provider],
        breakers: Breakers,
        meter: Meter,
    ) -> None:
        self.chain = chain
        self.providers = providers
        self.breakers = breakers
        self.meter = meter
        self.tenant = witness(meter.scope)
        self.opened: Child | None = None  # the trace's span of the attempt that answered

    async def first(
        self,
        attempt: Callable[[Route, Provider], Awaitable[T]],
        cap: int,
        generating: Callable[[], bool],
    ) -> T:
        """``attempt`` on each target in turn until one answers; raises the last error.
        ``cap``: the output the request asks for; ``generating()``, after a failed attempt:
        whether the upstream may have been generating it when the attempt failed."""
        last: GatewayError | None = None
        trace = self.meter.trace
        for position, target in enumerate(self.chain):
            upstream = target.upstream
            before = await self.breakers.check(upstream.name, upstream.breaker, self.tenant)
            if not before.allowed:
                logger.info("upstream skipped: breaker open",
                            extra={"upstream": upstream.name, "route": target.name})  # fmt: skip
                last = last or AllTargetsDown(f"The provider for '{target.name}' is unavailable.")
                continue
            self.meter.serve_with(target)
            span = None if trace is None else trace.attempt(target, position)
            try:
                result = await attempt(target, self.providers[upstream.kind])
            except BaseException as e:
                if span is not None:
                    span.detach()
                    span.end(e)
                if not isinstance(e, GatewayError):
                    raise
                if not can_fail_over(e):
                    # A bad request, or a reply the upstream generated: nothing to count.
                    await self._counts(target, before, Blame.REQUEST)
                    raise
                await self._counts(target, before, blame(e, target, cap, generating()))
                logger.warning("upstream failed; trying the next target",
                               extra={"upstream": upstream.name, "route": target.name,
                                      "error": str(e)})  # fmt: skip
                last = e
                continue
            if span is not None and trace is not None:
                span.detach()
                trace.answered(span)
            self.opened = span  # ended when the reply or the stream ends
            await self._succeeded(target, before)
            return result
        assert last is not None, "a chain has at least one target"
        if isinstance(last, AllTargetsDown) or len(self.chain) == 1:
            raise last
        raise AllTargetsDown(f"Every provider for this model failed; the last: {last}") from last

    async def _succeeded(self, target: Route, before: BreakerState) -> None:
        upstream = target.upstream
        await self.breakers.succeeded(upstream.name, upstream.breaker, before, self.tenant)

    async def _counts(self, target: Route, before: BreakerState, whose: Blame) -> None:
        """Tell the target's breaker of a failed attempt, ``whose`` it was."""
        upstream = target.upstream
        if whose is Blame.REQUEST:
            await self.breakers.released(upstream.name, upstream.breaker, before, self.tenant)
        else:
            who = self.tenant if whose is Blame.TENANT else None
            await self.breakers.failed(upstream.name, upstream.breaker, who)

    async def complete(self, chat: ChatRequest, cap: int) -> Completion:
        """A whole reply from the first target that gives one."""
        completion = await self.first(
            lambda route, provider: provider.complete(route, chat, cap), cap, lambda: True
        )
        if self.opened is not None:
            self.opened.end()
        return completion

    def stream(self, chat: ChatRequest, cap: int) -> FailoverStream:
        """A stream from the first target that opens one (the relay enters it)."""
        return FailoverStream(self, chat, cap)


class FailoverStream:
    """An async context manager like :meth:`Provider.stream`, over a chain of targets."""

    def __init__(self, targets: Targets, chat: ChatRequest, cap: int) -> None:
        self.targets = targets
        self.chat = chat
        self.cap = cap
        self._exit: Callable[..., Awaitable[bool | None]] | None = None
        self._answered = False  # the target being tried answered with a success status

    async def __aenter__(self) -> AsyncIterator[Read]:
        async def attempt(route: Route, provider: Provider) -> AsyncIterator[Read]:
            self._answered = False
            opened = provider.stream(route, self.chat, self.cap)
            reads = await opened.__aenter__()
            self._answered = True
            # Its first reads too, up to its first output: a provider that answered 200 and
            # died before sending any has sent nothing the client sees (the reads so far are
            # held back), so the next target may serve.
            try:
                held = await _until_output(reads)
            except BaseException as e:
                await opened.__aexit__(type(e), e, e.__traceback__)
                if isinstance(e, GatewayError) and can_fail_over(e):
                    # It had the request and may bill its input: so does the ledger.
                    self.targets.meter.billed_elsewhere(route, self.chat.input_tokens)
                raise
            self._exit = opened.__aexit__
            return _prepend(held, reads)

        return await self.targets.first(attempt, self.cap, lambda: self._answered)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._exit is None:
            return None
        span, self.targets.opened = self.targets.opened, None
        try:
            return await self._exit(kind, error, tb)
        finally:
            if span is not None:
                span.end()


async def _until_output(reads: AsyncIterator[Read]) -> list[Read]:
    """The reads up to and with the first that carries output (or ends, or reports usage),
    or what came in :data:`PEEK_S`; a stream that ends before that gives what it sent."""
    held: list[Read] = []
    deadline = asyncio.get_running_loop().time() + PEEK_S
    async for read in reads:
        held.append(read)
        if any(e.output or e.finish or e.usage or e.error or e.done for e in read):
            break
        if asyncio.get_running_loop().time() > deadline:
            break
    return held


async def _prepend(held: list[Read], rest: AsyncIterator[Read]) -> AsyncIterator[Read]:
    """``rest`` with the ``held`` reads back in front of it."""
    for read in held:
        yield read
    async for read in rest:
        yield read
