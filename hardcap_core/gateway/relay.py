"""Relay a provider's stream to the client, metering every billed delta as it passes.

:class:`Relay` owns a stream's life. The budget decides, read by read, whether output may go on
(see :mod:`.meter`); when it may not, or the provider finishes, fails, or the deadline comes,
:meth:`Relay.end` is the one place the stream ends: it sets the outcome, closes the provider
connection (so the provider stops generating), settles, and returns the closing bytes. It
settles BEFORE the last bytes go out: once a Lambda response ends, the environment may freeze.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import anyio

from hardcap_core.errors import GatewayError, UpstreamFailed
from hardcap_core.events import Event, OutputKind, Read, Usage
from hardcap_core.gateway.meter import Meter
from hardcap_core.logs import logger
from hardcap_core.outcome import Outcome
from hardcap_core.wire.base import Charged, StreamEncoder

# The client gets the stream's closing events for these endings; for the others it is gone,
# or it gets an error event instead.
CLOSED_CLEANLY = frozenset({Outcome.COMPLETED, Outcome.TRUNCATED, Outcome.DEADLINE})
INCOMPLETE_MESSAGE = "The provider's stream ended before the reply was complete."


class Relay:
    """One streamed reply: :meth:`open`, iterate :meth:`chunks`, and :meth:`end` in a finally."""

    def __init__(
        self,
        opened: AbstractAsyncContextManager[AsyncIterator[Read]],
        meter: Meter,
        encoder: StreamEncoder,
        *,
        deadline: float | None = None,
        log_completion: bool = False,
        keep: Callable[[], Awaitable[None]] | None = None,
        trace_content: bool = False,
    ) -> None:
        self._opened = opened
        self.meter = meter
        self.encoder = encoder
        # Event-loop time (monotonic) by which the stream must have ended and been settled.
        self.deadline = deadline
        self.outcome: Outcome | None = None  # set once, by end()
        self._reads: AsyncIterator[Read] | None = None  # set while the provider is open
        self._run_gen: AsyncGenerator[bytes, None] | None = None
        self._head: list[bytes] = []
        self._usage: Usage | None = None
        self._log_completion = log_completion
        # The completion's text, kept for the log or (the route opted in) the trace.
        self._text: list[str] | None = [] if log_completion or trace_content else None
        self._timed_out = False  # the deadline came while waiting for the provider
        self._finished = False  # the provider gave a finish reason
        self._finish: str | None = None  # which, for the trace
        self._keep_alive: asyncio.Task[None] | None = None
        # What keeps the reply once its closing events are made (a stored Response): before
        # they go out, so the client's next turn finds it.
        self._keep = keep

    async def open(self) -> None:
        """Connect to the provider and read up to the first bytes for the client.

        Done before the gateway answers 200, so a provider that refuses or cannot be reached
        becomes a proper error status rather than a broken stream. On failure the stream has
        ended (nothing is charged if nothing was generated) and the error propagates.
        """
        entered = False
        # The hold is refreshed on a timer while the stream lives, tokens or not — from the
        # start: opening may take a while (fallbacks tried in turn, a first read held back).
        self._keep_alive = asyncio.create_task(self.meter.keep_alive())
        try:
            self._reads = await self._opened.__aenter__()
            entered = True
            self._run_gen = self._run()
            first = await anext(self._run_gen, None)
            if first is not None:
                self._head.append(first)
        except BaseException:
            # Refused or unreachable: nothing was generated. Once it answered 200, the provider
            # has taken the request and may bill it: charged like a stream that failed.
            await self.end(Outcome.UPSTREAM_ERROR if entered else Outcome.UPSTREAM_UNAVAILABLE)
            raise

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The bytes for the client, starting with those :meth:`open` read. A failure after the
        response began ends the stream and becomes an error event."""
        for data in self._head:
            yield data
        self._head = []
        if self._run_gen is None:
            return
        try:
            async for data in self._run_gen:
                yield data
        except GatewayError as e:
            await self.end(Outcome.UPSTREAM_ERROR)
            yield self.encoder.error(e)
        except Exception:
            logger.exception("stream failed in the gateway", extra={"route": self.meter.route})
            await self.end(Outcome.GATEWAY_ERROR)
            yield self.encoder.error(GatewayError("Internal error in the gateway."))
        finally:
            await self._run_gen.aclose()

    async def end(self, outcome: Outcome) -> bytes:
        """End the stream with ``outcome`` unless it has ended already: close the provider,
        settle, and return the closing bytes the client gets (empty when it gets none).

        Shielded from cancellation: a client that leaves must not stop the settle.
        """
        if self.outcome is not None:
            return b""
        self.outcome = outcome
        if (trace := self.meter.trace) is not None:  # before the settle, which ends its span
            trace.finished(self._finish)
            if self._text is not None:
                trace.output("".join(self._text))
        with anyio.CancelScope(shield=True):
            await self._stop_keep_alive()
            await self._close_upstream()
            await self.meter.settle(outcome, self._usage)
        if self._text is not None and self._log_completion:
            logger.info("completion", extra={"content": "".join(self._text)})
        if outcome not in CLOSED_CLEANLY:
            return b""
        meter = self.meter
        # The provider's report as the client sees it: only one the meter believed.
        usage = meter.believe(self._usage) if outcome is Outcome.COMPLETED else None
        charged = Charged(
            meter.charged_input, meter.charged_output, usage, meter.charged_cost,
            estimate=meter.estimated,  # as the usage record's `est`
        )  # fmt: skip
        closing = self.encoder.close(for_length=outcome.cut, charged=charged)
        if self._keep is not None:
            with anyio.CancelScope(shield=True):
                await self._keep()
        return closing

    async def _stop_keep_alive(self) -> None:
        task, self._keep_alive = self._keep_alive, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _close_upstream(self) -> None:
        """The one place the provider connection is closed."""
        if self._reads is not None:
            self._reads = None
            await self._opened.__aexit__(None, None, None)
            # A transport closes its socket on the loop's next turn: the settle that follows
            # charges the time until then (the cut charge, gateway/pace.py), so it comes after.
            await asyncio.sleep(0)

    async def _run(self) -> AsyncGenerator[bytes, None]:
        """Read by read: count the whole read first, so the meter decides knowing what is in
        hand, then forward event by event while the budget allows."""
        # What one read allows goes out as one piece: one write to the client per network read
        # of the provider, however many events it held (a backlog can be hundreds).
        async for read in self._timed_reads():
            self.meter.note_read(*tally(read, finished=self._finished))
            out: list[bytes] = []
            for event in read:
                if self.outcome is not None:
                    return  # ended from outside (the client left): nothing more goes out
                ending = await self._check(event)
                if ending is not None:
                    out.append(await self.end(ending))
                    yield b"".join(out)
                    return
                data = self.encoder.event(event)
                if data:
                    out.append(data)
            if out:
                yield out[0] if len(out) == 1 else b"".join(out)
            if self.outcome is not None:
                return  # ended from outside while that piece was going out
        # The provider closed the stream, or the deadline came while waiting for it.
        if self._timed_out:
            yield await self.end(Outcome.DEADLINE)
        elif self._finished:
            # No [DONE], but it said why it stopped: complete (some servers omit [DONE]).
            yield await self.end(Outcome.COMPLETED)
        else:
            # Cut off without a finish reason: the client must not take it for a whole reply.
            await self.end(Outcome.INCOMPLETE)
            yield self.encoder.error(UpstreamFailed(INCOMPLETE_MESSAGE))

    async def _check(self, event: Event) -> Outcome | None:
        """How the stream ends at ``event``, or None to forward it."""
        if event.error is not None:
            raise UpstreamFailed(event.error)
        if event.usage is not None:
            self._usage = event.usage
        if event.finish is not None:
            self._finished = True
            self._finish = event.finish
        if event.done:
            return Outcome.COMPLETED
        if self._past_deadline():
            return Outcome.DEADLINE
        if event.tokens and not await self.meter.make_room(
            event.tokens, at_least=sum(o.least for o in event.output)
        ):
            return Outcome.TRUNCATED
        if self._text is not None:
            self._text += [o.text for o in event.output if o.kind is OutputKind.CONTENT]
        return None

    async def _timed_reads(self) -> AsyncIterator[Read]:
        """The provider's reads, until they end or the Lambda deadline comes."""
        reads = self._reads
        if reads is None:
            return
        while True:
            try:
                if self.deadline is None:
                    read = await anext(reads)
                else:
                    async with asyncio.timeout_at(self.deadline):
                        read = await anext(reads)
            except StopAsyncIteration:
                return
            except TimeoutError:
                self._timed_out = True
                return
            yield read

    def _past_deadline(self) -> bool:
        return self.deadline is not None and asyncio.get_running_loop().time() >= self.deadline


def tally(read: Read, *, finished: bool) -> tuple[int, int, Usage | None]:
    """One pass over a read: its output tokens, their lower bound (one per piece), and the
    provider's final usage report if the read holds one: usage at or after a finish reason
    (OpenAI sends it in the chunk after the finish, Anthropic with it, Bedrock in the metadata
    after messageStop). ``finished``: a finish reason came in an earlier read."""
    tokens = least = 0
    final = None
    for event in read:
        tokens += event.tokens
        for piece in event.output:
            least += piece.least
        finished = finished or event.finish is not None
        if finished and event.usage is not None:
            final = event.usage
    return tokens, least, final
