"""A stream's life in the relay, on a real ledger on a real Valkey: however it ends, it ends once.

The provider is a scripted stream (an async context manager yielding reads of events, as a
:class:`~hardcap_core.providers.base.Provider` does) that counts how often it was opened and
closed. For each ending the test checks what a user would notice: the outcome, the bytes the
client got, that the hold went back to the budget and the charge was settled once, and that the
provider connection was closed once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest

from hardcap_core.budgets import Dimension, Scope
from hardcap_core.errors import GatewayError, TooManyRequests, UpstreamFailed, UpstreamTimeout
from hardcap_core.events import Event, FinishReason, Output, OutputKind, Read, Usage
from hardcap_core.gateway.meter import HEARTBEATS_PER_TTL, Meter, MeterSettings
from hardcap_core.gateway.relay import Relay
from hardcap_core.ledger import FREE, Admitted, Ledger, Reservation, Settled, SettleNote
from hardcap_core.ledger.client import COMPLETED
from hardcap_core.ledger.estimators import MaxTokensEstimator
from hardcap_core.outcome import Outcome
from hardcap_core.sse import DONE, SSEParser
from hardcap_core.wire.openai_chat import OpenAIChat
from hardcap_core.wire.openai_request import parse_chat_request
from tests.conftest import TENANT, scope

PUBLIC = "small"
INPUT_ESTIMATE = 20  # what the gateway estimated of the prompt
REPORTED = Usage(input_tokens=7, output_tokens=5, raw={"prompt_tokens": 7, "completion_tokens": 5})


# -- the provider's stream -----------------------------------------------------------------------


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-up",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "vendor-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def role() -> Event:
    return Event(raw=chunk({"role": "assistant"}))


def content(text: str, tokens: int = 1) -> Event:
    return Event(
        raw=chunk({"content": text}),
        output=[Output(OutputKind.CONTENT, text, tokens)],
        tokens=tokens,
    )


def finish() -> Event:
    return Event(raw=chunk({}, "stop"), finish=FinishReason.STOP)


def usage(reported: Usage = REPORTED) -> Event:
    return Event(raw={**chunk({}), "choices": [], "usage": reported.raw}, usage=reported)


def done() -> Event:
    return Event(done=True)


def error(message: str = "overloaded") -> Event:
    return Event(raw={"error": {"message": message}}, error=f"The provider failed: {message}")


Step = Read | BaseException | float | Callable[[], Awaitable[None]]


class Script:
    """A provider stream: ``reads`` one by one (an exception in place of a read is raised by
    that read; a number is a silence of that many seconds; a callable runs there, as a fault
    elsewhere would happen meanwhile), then EOF, or (``stall``) a wait that only a deadline
    ends."""

    def __init__(
        self,
        reads: Sequence[Step],
        *,
        stall: bool = False,
        fail_on_enter: GatewayError | None = None,
    ) -> None:
        self.reads = list(reads)
        self.stall = stall
        self.fail_on_enter = fail_on_enter
        self.entered = 0
        self.exited = 0
        self.taken = 0  # reads the relay asked for and got
        self.stalled = False

    @asynccontextmanager
    async def stream(self) -> AsyncIterator[AsyncIterator[Read]]:
        self.entered += 1
        if self.fail_on_enter is not None:
            raise self.fail_on_enter
        reads = self._reads()
        try:
            yield reads
        finally:
            await reads.aclose()  # as a real provider closes its connection
            self.exited += 1

    async def _reads(self) -> AsyncGenerator[Read, None]:
        for read in self.reads:
            if isinstance(read, BaseException):
                raise read
            if isinstance(read, float):
                await asyncio.sleep(read)
                continue
            if callable(read):
                await read()
                continue
            self.taken += 1
            yield read
        if self.stall:
            self.stalled = True
            await asyncio.Event().wait()


# -- the gateway side ----------------------------------------------------------------------------


class CountingLedger(Ledger):
    """The real ledger, counting the settles it is asked for."""

    settles = 0

    async def settle(
        self,
        reservation: Reservation,
        *,
        input_tokens: int,
        output_tokens: int,
        note: SettleNote = COMPLETED,
        cost_nusd: int | None = None,
    ) -> Settled:
        self.settles += 1
        return await super().settle(
            reservation,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            note=note,
            cost_nusd=cost_nusd,
        )


class FixedClock:
    """The meter's clock stands still: its in-flight estimate depends only on the reads."""

    def __call__(self) -> float:
        return 1000.0


class Stream:
    """A relay on a fresh reservation, and the client's view of it."""

    def __init__(self, relay: Relay, ledger: CountingLedger, scope: Scope, script: Script) -> None:
        self.relay = relay
        self.ledger = ledger
        self.scope = scope
        self.script = script
        self.received = b""

    @property
    def meter(self) -> Meter:
        return self.relay.meter

    async def run(self) -> None:
        """Open and read to the end, as the gateway and the client do."""
        await self.relay.open()
        async for data in self.relay.chunks():
            self.received += data

    def sent(self) -> list[str]:
        """What the client got, event by event: content text, finish, usage, error, [DONE]."""
        parser = SSEParser()
        out = []
        for data in [*parser.feed(self.received), *parser.flush()]:
            if data == DONE:
                out.append(DONE)
                continue
            event = json.loads(data)
            if "error" in event:
                out.append("error")
            elif event.get("usage"):
                out.append("usage")
            else:
                (choice,) = event["choices"]
                if choice["delta"].get("content"):
                    out.append(choice["delta"]["content"])
                if choice["finish_reason"]:
                    out.append(f"finish:{choice['finish_reason']}")
        return out

    def usage_sent(self) -> dict[str, Any]:
        parser = SSEParser()
        for data in [*parser.feed(self.received), *parser.flush()]:
            if data != DONE and json.loads(data).get("usage"):
                found: dict[str, Any] = json.loads(data)["usage"]
                return found
        raise AssertionError("no usage chunk")

    async def check_ended_once(self, outcome: Outcome) -> None:
        """The stream ended with ``outcome``, settled once, the provider closed once; the
        budget holds nothing for it any more and was charged what the meter says."""
        assert self.relay.outcome is outcome and self.meter.outcome is outcome
        assert await self.relay.end(Outcome.COMPLETED) == b""  # a second end: nothing
        assert self.relay.outcome is outcome
        assert self.ledger.settles == 1
        if self.script.entered and self.script.fail_on_enter is None:
            assert self.script.exited == 1
        else:
            assert self.script.exited == 0
        rows = {r.budget.dimension: r for r in (await self.ledger.usage(self.scope)).rows}
        assert all(r.reserved == 0 for r in rows.values())
        assert rows[Dimension.INPUT_TOKENS].used == self.meter.charged_input
        assert rows[Dimension.OUTPUT_TOKENS].used == self.meter.charged_output

    def forwarded(self) -> int:
        """Content tokens the client got (one per content event in these scripts)."""
        return sum(1 for e in self.sent() if e not in (DONE, "usage", "error", "finish:stop"))


async def stream(
    client: Any,
    script: Script,
    *,
    budget: int = 1000,
    reserve: int = 100,
    include_usage: bool = True,
    deadline: float | None = None,
    cap: int | None = None,
    ttl_s: float | None = None,
) -> Stream:
    """A relay on a fresh reservation. ``ttl_s``: a short-lived hold, refreshed every third of
    it on the real clock (otherwise the meter's clock stands still)."""
    ledger = CountingLedger(client, reservation_ttl_s=ttl_s or 120.0)
    s = scope(
        (TENANT, Dimension.INPUT_TOKENS, 1000, "day"),
        (TENANT, Dimension.OUTPUT_TOKENS, budget, "day"),
        levels=(TENANT,),
    )
    admitted = await ledger.admit(s, input_tokens=INPUT_ESTIMATE, output_estimate=reserve)
    assert isinstance(admitted, Admitted)
    settings = (
        MeterSettings(heartbeat_s=ttl_s / HEARTBEATS_PER_TTL, ttl_s=ttl_s)
        if ttl_s
        else MeterSettings()
    )
    meter = Meter(
        ledger,
        s,
        admitted.reservation,
        settings,
        input_estimate=INPUT_ESTIMATE,
        estimator=MaxTokensEstimator(),
        route=PUBLIC,
        prices=FREE,
        cap=cap,
        clock=time.monotonic if ttl_s else FixedClock(),
    )
    body = {
        "model": PUBLIC,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": include_usage},
    }
    request = parse_chat_request(json.dumps(body).encode())
    encoder = OpenAIChat().encoder(request, model=PUBLIC, same_dialect=True)
    relay = Relay(script.stream(), meter, encoder, deadline=deadline)
    return Stream(relay, ledger, s, script)


def words_sent(s: Stream) -> list[str]:
    return [e for e in s.sent() if e.startswith(("w", "reservation"))]


def words(n: int) -> list[Read]:
    return [[content(f"w{i} ")] for i in range(n)]


# -- completed -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tail",
    [
        [[usage(), done()]],  # the usage chunk and [DONE] in one read
        [[usage()], [done()], [content("after done")]],  # nothing after [DONE] goes out
        [[usage()]],  # the provider closes without [DONE], after its finish reason
    ],
    ids=["done", "done-then-more", "eof"],
)
async def test_a_stream_the_provider_finishes_is_charged_its_report(
    standalone_client: Any, tail: list[Read]
) -> None:
    script = Script([[role()], *words(3), [finish()], *tail])
    s = await stream(standalone_client, script)
    await s.run()
    assert s.sent() == ["w0 ", "w1 ", "w2 ", "finish:stop", "usage", DONE]
    await s.check_ended_once(Outcome.COMPLETED)
    assert (s.meter.charged_input, s.meter.charged_output) == (7, 5)
    assert s.usage_sent() == {
        "prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12,
        # the extension field: what the settle charged (the test's prices are free)
        "hardcap": {"cost_usd": 0.0, "input_tokens": 7, "output_tokens": 5, "estimate": False},
    }  # fmt: skip


async def test_a_stream_without_a_usage_report_is_charged_what_went_out(
    standalone_client: Any,
) -> None:
    s = await stream(standalone_client, Script([[role()], *words(4), [finish()]]))
    await s.run()
    assert s.sent()[-3:] == ["finish:stop", "usage", DONE]
    await s.check_ended_once(Outcome.COMPLETED)
    assert (s.meter.charged_input, s.meter.charged_output) == (INPUT_ESTIMATE, 4)
    assert s.usage_sent()["completion_tokens"] == 4


async def test_a_client_that_did_not_ask_for_usage_gets_none(standalone_client: Any) -> None:
    script = Script([[role()], *words(2), [finish(), usage(), done()]])
    s = await stream(standalone_client, script, include_usage=False)
    await s.run()
    assert s.sent() == ["w0 ", "w1 ", "finish:stop", DONE]
    await s.check_ended_once(Outcome.COMPLETED)
    assert s.meter.charged_output == 5


# -- cut by the gateway ----------------------------------------------------------------------------


async def test_a_stream_the_budget_cannot_cover_ends_with_length(standalone_client: Any) -> None:
    script = Script([[role()], *words(50), [finish(), usage(), done()]])
    s = await stream(standalone_client, script, budget=20, reserve=20)
    await s.run()
    sent = s.sent()
    assert sent[-3:] == ["finish:length", "usage", DONE]
    assert "finish:stop" not in sent
    forwarded = s.forwarded()
    assert 0 < forwarded < 20
    assert script.taken < len(script.reads)  # the relay stopped reading: the provider closed
    await s.check_ended_once(Outcome.TRUNCATED)
    # The estimate of what the provider generated: at least what went out, within the budget.
    assert forwarded <= s.meter.charged_output <= 20
    assert s.meter.charged_input == INPUT_ESTIMATE
    assert s.usage_sent()["completion_tokens"] == s.meter.charged_output


def backlog(n: int, tokens: int) -> Read:
    """The rest of a reply in one network read: ``n`` pieces the gateway counts at ``tokens``
    each, the finish reason and the provider's final report."""
    pieces = [content(f"w{i} ", tokens=tokens) for i in range(n)]
    return [
        *pieces,
        finish(),
        usage(Usage(7, 18, raw={"prompt_tokens": 7, "completion_tokens": 18})),
        done(),
    ]


async def test_a_reply_whose_final_report_fits_the_hold_goes_out_whole(
    standalone_client: Any,
) -> None:
    """The gateway's count of the backlog (18 pieces at 2 tokens: 36) is past the 20-token
    hold, but the provider had finished and reports 18: the reply is billed at 18 whether or
    not it goes out, so it goes out whole and is charged the report, not the count."""
    script = Script([[role()], backlog(18, tokens=2)])
    s = await stream(standalone_client, script, budget=20, reserve=20)
    await s.run()
    assert s.sent()[-3:] == ["finish:stop", "usage", DONE]
    assert len(words_sent(s)) == 18
    await s.check_ended_once(Outcome.COMPLETED)
    assert (s.meter.charged_input, s.meter.charged_output) == (7, 18)


async def test_a_cut_stream_whose_final_report_was_read_is_charged_the_report(
    standalone_client: Any,
) -> None:
    """The provider ignored the hold (it reports 18 against a 10-token budget) and finished
    within one read: the stream is cut at the hold as ever, and charged what the provider
    reports it billed (18, the overshoot shown as it is), not the gateway's count (36)."""
    script = Script([[role()], backlog(18, tokens=2)])
    s = await stream(standalone_client, script, budget=10, reserve=10)
    await s.run()
    assert s.sent()[-3:] == ["finish:length", "usage", DONE]
    assert len(words_sent(s)) < 18
    await s.check_ended_once(Outcome.TRUNCATED)
    assert (s.meter.charged_input, s.meter.charged_output) == (7, 18)
    assert s.usage_sent()["completion_tokens"] == 18


async def test_a_deadline_already_passed_ends_the_stream_with_length(
    standalone_client: Any,
) -> None:
    script = Script([*words(5), [finish(), usage(), done()]])
    deadline = asyncio.get_running_loop().time() - 1
    s = await stream(standalone_client, script, deadline=deadline)
    await s.run()
    assert s.sent() == ["finish:length", "usage", DONE]
    await s.check_ended_once(Outcome.DEADLINE)
    assert s.meter.charged_output >= 1  # the read in hand was generated, though not forwarded


async def test_a_deadline_that_comes_while_the_provider_stalls_ends_with_length(
    standalone_client: Any,
) -> None:
    script = Script(words(2), stall=True)
    deadline = asyncio.get_running_loop().time() + 0.1
    s = await stream(standalone_client, script, deadline=deadline)
    await s.run()
    assert script.stalled
    assert s.sent() == ["w0 ", "w1 ", "finish:length", "usage", DONE]
    await s.check_ended_once(Outcome.DEADLINE)
    assert s.meter.charged_output >= 2


@pytest.mark.parametrize("order", ["close-then-end", "end-then-read"])
async def test_a_client_that_leaves_gets_nothing_more(standalone_client: Any, order: str) -> None:
    # Several events per read; each read goes out as one piece: after the client leaves,
    # nothing of the following reads (or closing events) goes out.
    reads: list[Read] = [[role()], *[[content(f"a{i} "), content(f"b{i} ")] for i in range(20)]]
    script = Script(reads)
    s = await stream(standalone_client, script)
    await s.relay.open()
    chunks = s.relay.chunks()
    for _ in range(2):  # the role's read, then the read of a0 and b0
        s.received += await anext(chunks)
    if order == "close-then-end":  # as the ASGI response does when the client disconnects
        await chunks.aclose()
        assert await s.relay.end(Outcome.CLIENT_GONE) == b""
    else:
        assert await s.relay.end(Outcome.CLIENT_GONE) == b""
        after = b"".join([data async for data in chunks])
        assert after == b""
    assert s.sent() == ["a0 ", "b0 "]  # no a1, and no closing events
    await s.check_ended_once(Outcome.CLIENT_GONE)
    assert s.meter.charged_output >= 2  # b0 was in hand: generated, though not forwarded
    assert s.meter.charged_input == INPUT_ESTIMATE


# -- failed by the provider ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [[error()], UpstreamFailed("The provider connection failed mid-stream.")],
    ids=["error-event", "connection-lost"],
)
async def test_a_provider_that_fails_mid_stream_ends_with_an_error_event(
    standalone_client: Any, failure: Read | BaseException
) -> None:
    script = Script([[role()], *words(3), failure, *words(3)])
    s = await stream(standalone_client, script)
    await s.run()
    assert s.sent() == ["w0 ", "w1 ", "w2 ", "error"]  # no [DONE]: the reply is not complete
    await s.check_ended_once(Outcome.UPSTREAM_ERROR)
    assert s.meter.charged_output >= 3
    assert s.meter.charged_input == INPUT_ESTIMATE


@pytest.mark.parametrize(
    ("script", "raised"),
    [
        (Script([], fail_on_enter=TooManyRequests("busy")), TooManyRequests),
        (Script([], fail_on_enter=UpstreamFailed("answered 500")), UpstreamFailed),
        (Script([], fail_on_enter=UpstreamTimeout("no answer")), UpstreamTimeout),
    ],
    ids=["429-on-open", "500-on-open", "timeout-on-open"],
)
async def test_a_provider_that_refuses_or_cannot_be_reached_costs_nothing(
    standalone_client: Any, script: Script, raised: type[GatewayError]
) -> None:
    s = await stream(standalone_client, script)
    with pytest.raises(raised):
        await s.relay.open()
    assert script.entered == 1
    assert [data async for data in s.relay.chunks()] == []
    await s.check_ended_once(Outcome.UPSTREAM_UNAVAILABLE)
    assert (s.meter.charged_input, s.meter.charged_output) == (0, 0)


@pytest.mark.parametrize(
    ("script", "raised"),
    [
        (Script([UpstreamTimeout("no first byte")]), UpstreamTimeout),
        (Script([[error("refused")]]), UpstreamFailed),
    ],
    ids=["first-read-fails", "first-event-error"],
)
async def test_a_provider_that_fails_after_answering_200_is_charged_like_a_failed_stream(
    standalone_client: Any, script: Script, raised: type[GatewayError]
) -> None:
    """Once it answered 200 it has taken the request and may bill it: count it."""
    s = await stream(standalone_client, script)
    with pytest.raises(raised):
        await s.relay.open()
    assert [data async for data in s.relay.chunks()] == []
    await s.check_ended_once(Outcome.UPSTREAM_ERROR)
    assert s.meter.charged_input == INPUT_ESTIMATE
    assert s.meter.charged_output >= 1


# -- ended without a word from the provider ------------------------------------------------------


@pytest.mark.parametrize("tail", [[], [[usage()]]], ids=["bare-eof", "usage-then-eof"])
async def test_a_stream_cut_off_without_a_finish_reason_is_not_a_whole_reply(
    standalone_client: Any, tail: list[Read]
) -> None:
    """It used to end with [DONE] and no finish reason, as if complete, and fed the estimator."""
    s = await stream(standalone_client, Script([[role()], *words(3), *tail]))
    await s.run()
    assert s.sent() == ["w0 ", "w1 ", "w2 ", "error"]  # no [DONE]
    await s.check_ended_once(Outcome.INCOMPLETE)
    assert s.meter.charged_output >= 3


# -- the cap and the hold, whatever the provider does ----------------------------------------------


async def test_a_provider_that_ignores_the_cap_is_cut_at_it(standalone_client: Any) -> None:
    script = Script([[role()], *words(40), [finish(), usage(), done()]])
    s = await stream(standalone_client, script, budget=1000, reserve=100, cap=12)
    await s.run()
    assert len(words_sent(s)) == 12
    assert s.sent()[-3:] == ["finish:length", "usage", DONE]
    await s.check_ended_once(Outcome.TRUNCATED)


async def test_a_provider_that_obeys_the_cap_is_not_cut(standalone_client: Any) -> None:
    # Twelve pieces of more than one token each (long words): counted high, never cut early.
    long_words = [[content(f"reservation{i} ", tokens=4)] for i in range(12)]
    script = Script([[role()], *long_words, [finish(), usage(), done()]])
    s = await stream(standalone_client, script, budget=1000, reserve=100, cap=12)
    await s.run()
    assert s.sent()[-3:] == ["finish:stop", "usage", DONE]
    await s.check_ended_once(Outcome.COMPLETED)


async def test_a_silent_provider_keeps_its_hold_past_the_ttl(standalone_client: Any) -> None:
    """The hold was refreshed only when tokens flowed: a provider thinking silently for longer
    than the TTL lost it, and another request could spend it."""
    observed: list[int] = []
    s: Stream

    async def look() -> None:
        rows = (await s.ledger.usage(s.scope)).rows
        observed.append(sum(r.reserved for r in rows))

    script = Script([[role()], 1.0, look, 1.0, look, *words(2), [finish(), usage(), done()]])
    s = await stream(standalone_client, script, reserve=100, ttl_s=0.6)
    await s.run()
    assert observed == [INPUT_ESTIMATE + 100] * 2  # still held after more than three TTLs
    await s.check_ended_once(Outcome.COMPLETED)


async def test_a_stream_whose_hold_is_lost_stops(standalone_client: Any) -> None:
    s: Stream

    async def reclaim() -> None:  # the hold vanishes, as if it had expired and been reclaimed
        rid = s.meter.reservation.id if s.meter.reservation else ""
        _, res_key, exp_key, _ = s.ledger.keys.core(s.scope)
        await standalone_client.hdel(res_key, rid)
        await standalone_client.zrem(exp_key, rid)

    script = Script([[role()], *words(2), reclaim, 0.5, *words(20), [finish(), usage(), done()]])
    s = await stream(standalone_client, script, ttl_s=0.3)
    await s.run()
    assert words_sent(s) == ["w0 ", "w1 "]
    assert s.sent()[-3:] == ["finish:length", "usage", DONE]
    assert s.relay.outcome is Outcome.TRUNCATED
    assert s.meter.hold_lost
