"""A request's money, in one place: what it holds, what it may generate, and what it is charged.

One object per route policy (:class:`HoldPolicy`; :func:`policy_for` picks it, and one for a
tenant that failed open) answers every question whose answer is money, for admission
(:meth:`.pipeline.Gateway._admit`), the quote (:mod:`.quote`, which calls the same code) and the
meter (:class:`.meter.Meter`, which keeps the live counters and the ledger I/O and asks here):

- admission: the output cap (:func:`output_cap`), the server tools' uses and what they hold
  (:func:`tool_hold`), the prices held and charged (:func:`request_prices`), the output
  estimate and least output (:meth:`HoldPolicy.hold`, with what the provider bills unseen,
  :mod:`.unseen`);
- the cap asked of the upstream: a stream's (:meth:`HoldPolicy.room`,
  :meth:`HoldPolicy.stream_cap`) and a whole reply's (:meth:`HoldPolicy.upstream_cap`);
- while a stream runs: whether the hold grows, refreshes, ends the stream, whether the
  provider's final report fits (the flags, :meth:`HoldPolicy.fits`);
- what an ended request is charged, by how it ended (:meth:`HoldPolicy.charge`: cut, failed,
  incomplete, or the provider's report), what an attempt that failed over is charged
  (:func:`failed_attempt`), and the price of it all (:meth:`Charge.cost`).

Its inputs are the normalized request (:class:`~hardcap_core.chat.ChatRequest`), the route,
and the provider's :class:`~hardcap_core.events.Usage`: any wire format calls it the same way.
A new policy is one new subclass of :class:`HoldPolicy` that overrides what it does
differently; naming it (``name``) makes it the one a route of that policy gets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, NamedTuple

from hardcap_core.budgets import Prices
from hardcap_core.chat import ChatRequest, ServerTool
from hardcap_core.config import Config, Policy, Route
from hardcap_core.errors import InvalidRequest
from hardcap_core.events import Usage
from hardcap_core.gateway.answers import output_room
from hardcap_core.gateway.unseen import SEEN, Unseen, unseen_output
from hardcap_core.ledger import Admitted
from hardcap_core.outcome import Outcome
from hardcap_core.wire.openai_request import price_terms

# -- admission ----------------------------------------------------------------------------------


def output_cap(route: Route, chat: ChatRequest) -> int:
    """The most output ``chat`` may have on ``route``: what it asked, else the route's most; a
    400 naming the field it asked in when that is past the route's most."""
    limit = route.max_output_tokens
    if chat.max_tokens is not None and chat.max_tokens > limit:
        raise InvalidRequest(
            f"'{chat.max_tokens_field}' is {chat.max_tokens}; the most this model allows "
            f"here is {limit}.",
            param=chat.max_tokens_field,
        )
    return chat.max_tokens or limit


logger = logging.getLogger("hardcap.money")


@dataclass(frozen=True, slots=True)
class ToolUses:
    """One server tool of a request as it is held: at most ``uses`` uses (the bound the
    provider is sent as ``max_uses``) at ``nusd`` each (the dearest of the route's chain)."""

    tool: ServerTool
    uses: int
    nusd: int


@dataclass(frozen=True, slots=True)
class ToolHold:
    """What a request's server tools hold (:func:`tool_hold`) and are charged
    (:meth:`charged`)."""

    tools: tuple[ToolUses, ...] = ()
    input_tokens: int = 0  # held for the results the uses add to the prompt (billed as input)
    content_tokens: int = 0  # the max_content_tokens a web fetch is sent when it sets none

    @property
    def nusd(self) -> int:
        """The most the uses cost: every one of them, at the price held."""
        return sum(t.uses * t.nusd for t in self.tools)

    def bounded(self, chat: ChatRequest) -> ChatRequest:
        """``chat`` with every server tool's bound in the body its provider is sent: the
        ``max_uses`` held where it set none (and a web fetch's ``max_content_tokens``), so the
        provider cannot use a tool more often than the budget holds."""
        if not self.tools or chat.native is None:
            return chat
        tools: list[Any] = list(chat.native["tools"])
        for held in self.tools:
            entry = dict(tools[held.tool.index])
            entry["max_uses"] = held.uses
            if held.tool.kind == "web_fetch" and entry.get("max_content_tokens") is None:
                entry["max_content_tokens"] = self.content_tokens
            tools[held.tool.index] = entry
        return replace(chat, native={**chat.native, "tools": tools})

    def charged(self, report: Usage | None) -> int:
        """What the uses cost by the provider's ``report`` (its usage.server_tool_use), each
        kind's count no more than the bound held: a count past it is a provider that used a
        tool more often than it was allowed, charged the bound (and logged). Without a count
        of a kind (no final report, a stream cut), every use held is charged."""
        said = dict(report.tool_uses or ()) if report is not None else {}
        total = 0
        for kind in dict.fromkeys(t.tool.kind for t in self.tools):
            of_kind = [t for t in self.tools if t.tool.kind == kind]
            bound = sum(t.uses for t in of_kind)
            nusd = max(t.nusd for t in of_kind)
            count = said.get(kind)
            if count is None:
                count = bound
            elif count > bound:
                logger.warning(
                    "the provider reports more server-tool uses than it was allowed; "
                    "charged the bound",
                    extra={"tool": kind, "reported": count, "bound": bound},
                )
                count = bound
            total += max(count, 0) * nusd
        return total


NO_TOOLS = ToolHold()


def tool_hold(config: Config, route: Route, chat: ChatRequest) -> ToolHold:
    """What ``chat``'s server tools hold on ``route``, or a 400 naming the tool: every target
    of the route's chain must be an Anthropic upstream (which runs them; any other would drop
    the tool or fail) and price the tool per use (its price table's ``<kind>_per_1000``). Each
    tool is held for its ``max_uses``, or the route's ``server_tool_max_uses`` (then sent as
    ``max_uses``, :meth:`ToolHold.bounded`), at the dearest price of the chain; and each use
    for ``server_tool_input_tokens`` of input, what its results add to the prompt of the
    next sampling turn (a web fetch is sent that as its ``max_content_tokens``)."""
    if not chat.server_tools:
        return NO_TOOLS
    held: list[ToolUses] = []
    input_held = 0
    for tool in chat.server_tools:
        nusd = 0
        for target in config.chain(route):
            if target.upstream.kind != "anthropic":
                raise InvalidRequest(
                    f"'{tool.where}.type': the server tool {tool.type!r} is run by Anthropic, "
                    f"and the model '{target.name}' here is served by a {target.upstream.kind} "
                    "upstream, which does not run it.",
                    param=f"{tool.where}.type",
                )
            price = target.prices.per_use_nusd(tool.kind)
            if price is None:
                raise InvalidRequest(
                    f"'{tool.where}.type': the server tool {tool.type!r} is billed per use, "
                    f"which the model '{target.name}' does not price here.",
                    param=f"{tool.where}.type",
                )
            nusd = max(nusd, price)
        uses = tool.max_uses or route.server_tool_max_uses
        per_use = route.server_tool_input_tokens
        native = chat.native["tools"][tool.index] if chat.native is not None else {}
        if tool.kind == "web_fetch" and native.get("max_content_tokens") is not None:
            per_use = int(native["max_content_tokens"])  # the fetch's own bound
        held.append(ToolUses(tool, uses, nusd))
        input_held += uses * per_use
    return ToolHold(tuple(held), input_held, route.server_tool_input_tokens)


def request_prices(
    config: Config,
    route: Route,
    chat: ChatRequest,
    input_tokens: int,
    tools: ToolHold = NO_TOOLS,
) -> tuple[Prices, Prices]:
    """The prices ``chat`` (``input_tokens`` its input estimate) on ``route`` is held at, and
    those it is charged at on ``route`` (the meter moves them to a fallback that serves it). A
    service tier that a target of the chain is sent and has no price for is a 400 naming
    ``service_tier``: it would be billed at a price no budget holds.

    The server tools' uses (``tools``, :func:`tool_hold`) are held in USD on the input: the
    input price held rises by their cost spread over the input held (rounded up), so the
    ledger's one hold, input x price + output x price, covers every use at its price; the
    per-token budgets are not touched."""
    terms = price_terms(chat.body)
    for target in config.chain(route) if terms.tier is not None else ():
        if not target.prices.prices_tier(terms.tier):
            listed = ", ".join(name for name, _ in target.prices.tiers)
            raise InvalidRequest(
                f"'service_tier' {terms.tier!r} has no price on the model '{target.name}' "
                f"here (priced: auto, default{', ' + listed if listed else ''}).",
                param="service_tier",
            )
    held = config.hold_prices(route, terms, input_tokens)
    if tools.nusd:
        spread = -(-tools.nusd // max(input_tokens, 1))
        held = Prices(held.input_nusd + spread, held.output_nusd)
    return held, route.prices.with_terms(terms)


@dataclass(frozen=True, slots=True)
class Hold:
    """What admission asks the ledger to hold for a request's output."""

    estimate: int  # the output it reserves (admit.lua's `o`)
    least: int  # the least it may be admitted with at the tail of a budget (`mo`)
    unseen: Unseen = SEEN  # what of it the provider may bill without streaming it


# -- the charge ---------------------------------------------------------------------------------


class Charge(NamedTuple):
    """The tokens a request is charged, with what the provider said of how it billed them."""

    input: int
    output: int
    cached: int = 0  # input read from the prompt cache
    written: int = 0  # input written to it
    written_1h: int | None = None  # of those, kept an hour (None: the provider did not say)
    tier: str | None = None  # the service tier the provider says it served
    estimated: bool = False  # a cut stream without the provider's final report: our estimate
    fees: int = 0  # nUSD of server-tool uses (ToolHold.charged), on top of the tokens

    def cost(self, prices: Prices) -> int:
        """What it costs at ``prices`` (the target that served it, with the request's terms),
        server-tool uses included."""
        return self.fees + prices.cost(
            self.input, self.output, cached=self.cached, written=self.written,
            written_1h=self.written_1h, tier=self.tier,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Ended:
    """What the meter knows of a request's output when it ends, for :meth:`HoldPolicy.charge`."""

    input_estimate: int  # the input admission estimated
    received: int  # output that arrived, counted high, and what it may bill unseen from the start
    in_flight: Callable[[], int]  # the guess of what a cut stream generated past it (.pace)
    reserved: int  # the output held
    unseen: Unseen = SEEN
    final: Usage | None = None  # the provider's final report, if one was read
    ledger_failed: bool = False  # a call to grow or keep the hold got no answer
    asked: int | None = None  # the max_tokens the provider was sent
    received_least: int = 0  # a lower bound of the output received (a token a piece)
    tools: ToolHold = NO_TOOLS  # the server tools it held


def failed_attempt(input_tokens: int, guard: int) -> Charge:
    """What a target that took the request (it answered 200) and failed before sending anything
    is charged, as a cut stream is: its input, all of which may have been a cache write (the
    dearest way), and the least a provider generates (``guard``)."""
    return Charge(input=input_tokens, output=guard, written=input_tokens)


def settle_charge(
    outcome: Outcome,
    usage: Usage | None,
    *,
    final: Usage | None,
    input_estimate: int,
    received: int,
    ended_output: Callable[[], int],
    least_output: int = 0,
) -> Charge:
    """Input, output, cached-input and cache-written input tokens to charge (and of those
    written, how many for an hour; the service tier), from the report they are read from.

    ``usage`` is the last usage report the provider sent, whenever it came; ``final`` is its
    final report (a whole reply's usage; in a stream, one read at or after its finish reason,
    :func:`.relay.tally`), after which nothing is generated. ``received`` is the output that
    arrived as the gateway counts it (forwarded and in hand; the count runs high, never low);
    ``ended_output()`` is the estimate of what a stream the gateway cut generated
    (:meth:`HoldPolicy.ended_output`); ``least_output`` the least output a stream that ended
    without a final report is charged (its hold, on a route whose provider bills output it
    does not stream: :mod:`.unseen`).

    - The provider refused or could not be reached: nothing.
    - A final report is the bill, whether the stream completed or was cut after it was read
      (docs/design.md, "Tokens in flight"): its counts, with the input estimate where it gave
      no input count and ``received`` where it gave no output count, or 0 with output
      received (what arrived proves that low). The lower bound of what streamed (a token a
      piece) is no such proof: it counts every piece of every field, some of which a provider
      does not bill (a field that repeats another's text).
    - No final report: the input the provider reported (Anthropic counts the prompt, cache
      reads and writes apart, in ``message_start``, before any output), else the estimate;
      and ``ended_output()`` if the gateway cut the stream (truncated, deadline, client gone, a
      failure mid-stream), else (it ended without a finish reason, or said it was done with
      no final report) ``received``.

    A report that is not final is a running count, and a floor, never a ceiling: Anthropic's
    ``message_start`` says ``output_tokens: 1`` before any text, and a stream that then
    dropped was charged that 1 however much had streamed. So without a final report the
    output charged is never less than the last reported output, nor the input less than the
    last reported input. Input not reported as billed may all have been a cache write, the
    dearest way to bill it, so it is charged as one (an hour-long one if the request marked
    such writes, :meth:`~hardcap_core.budgets.Prices.cost`).
    """
    if outcome.billed_nothing:
        return Charge(0, 0)
    reported_in = (usage.input_tokens if usage else None) or 0
    reported_out = (usage.output_tokens if usage else None) or 0
    report: Usage | None
    if final is not None:
        report = final
        charged_in = input_estimate if final.input_tokens is None else final.input_tokens
        charged_out = final.output_tokens or received
    else:
        report = usage
        charged_in = input_estimate if usage is None or usage.input_tokens is None else reported_in
        counted = ended_output() if outcome.cut else received
        charged_out = max(counted, reported_out, least_output)
    estimated = outcome.cut and final is None
    if report is None:
        return Charge(charged_in, charged_out, 0, charged_in, estimated=estimated)
    cached = report.cached_input_tokens or 0
    if report.input_tokens is None:  # all of it may have been written, for an hour if marked
        return Charge(charged_in, charged_out, cached, charged_in, None, report.service_tier,
                      estimated)  # fmt: skip
    return Charge(
        charged_in, charged_out, cached, report.cache_write_input_tokens or 0,
        report.cache_write_1h_input_tokens, report.service_tier, estimated,
    )  # fmt: skip


def estimated_output(
    known: int, in_flight: int, held: int | None, asked: int | None, least: int
) -> int:
    """Output to charge for a stream the gateway cut, by the meter's estimate of what the
    provider generated. ``known`` (what arrived, counted high; and what it may bill unseen,
    :mod:`.unseen`) is charged in full, even past the hold ``held`` (the ledger then shows
    the overshoot); the guess of the tokens ``in_flight`` only up to the hold, unless there
    is none: ``held`` None when the tenant fails open, or after a ledger call hung (the
    provider really generated for that long): then all of it (the policy decides which).

    A provider bills at most the ``max_tokens`` it was sent (``asked``) unless what arrived
    proves it ignored it (``least``, a token a piece, is past it): the count of the text,
    which must never be low and so runs high, is not charged past it."""
    charge = known + in_flight
    if asked is not None and least <= asked:
        known, charge = min(known, asked), min(charge, asked)
    return charge if held is None else max(known, min(charge, held))


def unseen_billed(unseen: Unseen, held: int | None, asked: int | None, received_least: int) -> int:
    """The least output a stream that ended without the provider's final report is charged for
    what its provider bills unseen: its hold (``held``; when it fails open and holds nothing,
    the cap it was sent), no more than the ``asked`` cap unless what arrived proves the
    provider ignored it (``received_least``, one token a piece, is past it); 0 when nothing
    is unseen."""
    most = held if held is not None else asked
    if not unseen.any or most is None:
        return 0
    return most if asked is None or received_least > asked else min(most, asked)


# -- what a provider's report may say ------------------------------------------------------------

# A provider's usage report is believed only within what it could have billed the request
# (docs/design.md, "Usage an upstream reports"). Input: the gateway's own bound of the
# request's input (``Ended.input_estimate``) times this, plus the allowance below. The bound
# is an upper bound of the text on every tokenizer the gateway ships; what a provider adds
# that the request does not carry is a few hundred to a couple of thousand tokens (Anthropic's
# tool-use system prompt, 313-346; its computer-use, bash and text-editor tools, 245-1,234) and
# is covered by the allowance; cache reads and writes are part of the input, never beside it.
# The factor covers what the bound may still count low (patch-billed images are up to 3.3x the
# tile rule the bound uses: a 1024 x 1024 image on gpt-4.1-nano).
REPORTED_INPUT_FACTOR = 4
REPORTED_INPUT_ALLOWANCE = 4096
# Output: the cap the provider was sent (reasoning is inside it on OpenAI, thinking inside
# max_tokens on Anthropic), or what arrived if that proves the provider ignored it, plus this.
REPORTED_OUTPUT_ALLOWANCE = 16
# What arrived is counted from its text, which runs high for prose but low for tool calls: the
# framing of a call is billed and never streamed (the providers' documented tool-call streams
# report 1.9x and 2.3x what their text counts), so a report of up to this many times it is
# believed once the provider has shown it ignored the cap.
REPORTED_OUTPUT_FACTOR = 4
# No count past this is believed whatever the bounds: no model's window comes near it, and a
# count past 2^53 cannot even be carried exactly by the ledger's scripts (Lua numbers).
MOST_BELIEVED_TOKENS = 1 << 31


class Implausible(NamedTuple):
    """The first count of a provider's report that it could not have billed, as it sent it."""

    field: str  # the gateway's name of the count (``Usage``'s field)
    value: int
    most: int  # the most it could have been


def implausible(usage: Usage, *, input_bound: int, output_bound: int | None) -> Implausible | None:
    """The first count of ``usage`` outside what the provider could have billed the request,
    or None when every count is believable. ``input_bound`` is the gateway's own bound of
    the request's input; ``output_bound`` the most output it could have generated (the cap it
    was sent, or what arrived past it: :func:`reported_output_bound`), None if unknown.

    A count is believed when it is a non-negative integer within
    ``input_bound`` x :data:`REPORTED_INPUT_FACTOR` + :data:`REPORTED_INPUT_ALLOWANCE` (input,
    cache reads and writes, which are parts of the input and so within it too) or
    ``output_bound`` (output, and reasoning, which is part of it), and never past
    :data:`MOST_BELIEVED_TOKENS`. A report outside that is not a bill: the request is charged
    as one whose provider reported nothing (:meth:`HoldPolicy.charge` with no report)."""
    most_in = min(input_bound * REPORTED_INPUT_FACTOR + REPORTED_INPUT_ALLOWANCE,
                  MOST_BELIEVED_TOKENS)  # fmt: skip
    most_out = (
        MOST_BELIEVED_TOKENS if output_bound is None else min(output_bound, MOST_BELIEVED_TOKENS)
    )
    reported_in = usage.input_tokens
    most_part = most_in if reported_in is None else min(max(reported_in, 0), most_in)
    counts = (
        ("input_tokens", reported_in, most_in),
        ("output_tokens", usage.output_tokens, most_out),
        ("reasoning_tokens", usage.reasoning_tokens, most_out),
        ("cached_input_tokens", usage.cached_input_tokens, most_part),
        ("cache_write_input_tokens", usage.cache_write_input_tokens, most_part),
        ("cache_write_1h_input_tokens", usage.cache_write_1h_input_tokens, most_part),
    )
    for field, value, most in counts:
        if value is not None and not 0 <= value <= most:
            return Implausible(field, value, most)
    read, written = usage.cached_input_tokens or 0, usage.cache_write_input_tokens or 0
    if reported_in is not None and read + written > reported_in:
        # Reads and writes are parts of the input: together they cannot be more than it.
        return Implausible("cache_write_input_tokens", written, max(reported_in - read, 0))
    return None


def reported_output_bound(asked: int | None, received: int, received_least: int) -> int | None:
    """The most output a provider's report may say: the cap it was sent (``asked``) plus
    :data:`REPORTED_OUTPUT_ALLOWANCE`; past that only if what arrived proves it ignored the cap
    (``received_least``, a token a piece, is past it), then :data:`REPORTED_OUTPUT_FACTOR`
    times what arrived as the gateway counts it (``received``) plus the allowance. None: no cap
    was sent."""
    if asked is None:
        return None
    most = max(asked, received * REPORTED_OUTPUT_FACTOR) if received_least > asked else asked
    return most + REPORTED_OUTPUT_ALLOWANCE


# -- the policies -------------------------------------------------------------------------------


class HoldPolicy:
    """The money decisions of a request under a route's policy. This base is a hold admission
    reserved that grows as output nears it and never ends a stream on its own; each policy
    below changes only what it does differently."""

    name: ClassVar[str | None] = None  # the config's policy it is (None: picked otherwise)
    holds = True  # admission reserved budget: the settle releases it (else: an orphan's settle)
    extends = True  # grow the hold near its end; refresh it on a timer while the stream lives
    truncates = False  # end the stream (finish "length") once the budget cannot cover it

    def __init_subclass__(cls) -> None:
        if cls.name is not None:
            _BY_NAME[cls.name] = cls()

    # admission

    def asks_estimate(self, stream: bool) -> bool:
        """Whether admission asks the route's estimator for the output: a stream's can be cut
        where the estimate runs out, a whole reply's cannot."""
        return stream

    def output_estimate(self, stream: bool, cap: int, expected: int | None) -> int:
        """The output admission reserves before what the provider bills unseen: the estimator's
        ``expected`` for a stream; a whole reply, which cannot be cut, its ``cap``."""
        if not self.asks_estimate(stream):
            return cap
        assert expected is not None, "a stream is held at the estimator's estimate"
        return expected

    def hold(self, route: Route, chat: ChatRequest, cap: int, expected: int | None) -> Hold:
        """What admission asks the ledger to hold for ``chat`` on ``route`` with an output cap
        of ``cap`` (:func:`output_cap`), ``expected`` the estimator's estimate (asked only
        where :meth:`asks_estimate`). Output the provider bills without streaming it is
        reserved up front (:mod:`.unseen`) on a hold that grows; only a policy that cuts
        shrinks a hold at the tail of a budget, never below what the provider bills unseen."""
        estimate = self.output_estimate(chat.stream, cap, expected)
        unseen = unseen_output(route, chat, cap) if chat.stream and self.extends else SEEN
        least_output = route.min_output_reservation
        estimate = unseen.hold(estimate, cap, least_output)
        least = min(unseen.least(least_output, cap), estimate) if self.truncates else estimate
        return Hold(estimate, least, unseen)

    # the cap asked of the upstream

    def room(self, admitted: Admitted, prices: Prices, unseen: Unseen) -> int | None:
        """The most output a stream's provider may be asked for, by what the budgets held for
        it at admission (None: no more than its cap)."""
        return None

    def stream_cap(self, cap: int, room: int | None) -> int:
        """The ``max_tokens`` a stream's provider is sent: its cap, within its ``room``."""
        return cap if room is None else min(cap, room)

    def upstream_cap(self, reserved: int, max_tokens: int) -> int:
        """The ``max_tokens`` a whole (non-streamed) reply is asked for: it cannot be cut."""
        return max_tokens

    # while it runs

    def fits(self, final_output: int, reserved: int) -> bool:
        """Whether the provider's final report of ``final_output`` tokens fits the hold, so the
        rest of the read may go out whatever the gateway's own count says."""
        return final_output <= reserved

    # what it is charged

    def charge_bound(self, reserved: int, *, ledger_failed: bool) -> int | None:
        """The most of the in-flight guess a cut stream is charged (None: all of it). Past the
        hold the budget would have ended the stream; once a ledger call hung, the provider
        really generated for that long, so all of the guess counts."""
        return None if ledger_failed else reserved

    def ended_output(self, ended: Ended) -> int:
        """Output to charge a stream the gateway cut: what arrived and what may be billed
        unseen, and the guess of what the provider generated past it, up to
        :meth:`charge_bound` (:func:`estimated_output`)."""
        bound = self.charge_bound(ended.reserved, ledger_failed=ended.ledger_failed)
        return estimated_output(
            ended.received, ended.in_flight(), bound, ended.asked, ended.received_least
        )

    def least_billed(self, ended: Ended) -> int:
        """The least output a stream that ended without the provider's final report is
        charged (:func:`unseen_billed`: its hold, or without one the cap)."""
        held = self.charge_bound(ended.reserved, ledger_failed=False)
        return unseen_billed(ended.unseen, held, ended.asked, ended.received_least)

    def charge(self, outcome: Outcome, usage: Usage | None, ended: Ended) -> Charge:
        """What a request that ended with ``outcome`` is charged, ``usage`` the provider's last
        report (:func:`settle_charge`), and its server tools' uses by the final report (without
        one, all it held: :meth:`ToolHold.charged`)."""
        bill = settle_charge(
            outcome, usage, final=ended.final, input_estimate=ended.input_estimate,
            received=ended.received, ended_output=lambda: self.ended_output(ended),
            least_output=self.least_billed(ended),
        )  # fmt: skip
        if not ended.tools.tools or outcome.billed_nothing:
            return bill
        if ended.final is None:  # the results' input comes after the input reported first
            bill = bill._replace(input=max(bill.input, ended.input_estimate))
        return bill._replace(fees=ended.tools.charged(ended.final))


_BY_NAME: dict[str, HoldPolicy] = {}


class Truncate(HoldPolicy):
    """``truncate``: the hold grows while the budget allows; the stream ends when it cannot,
    or when the hold is lost. A stream's provider is asked for no more than the budgets held
    for it; a whole reply, which cannot be cut, for the hold."""

    name = Policy.TRUNCATE.value
    truncates = True

    def room(self, admitted: Admitted, prices: Prices, unseen: Unseen) -> int | None:
        # Defence in depth: even output the meter failed to count cannot take the stream past
        # the budgets. One it cannot see it cannot cut: it is asked for the hold.
        if unseen.whole:
            return admitted.reservation.output_reserved
        return output_room(admitted, prices)

    def upstream_cap(self, reserved: int, max_tokens: int) -> int:
        return reserved


class Allow(HoldPolicy):
    """``allow``: the hold grows while the budget allows; past it the stream runs on and is
    charged all it made (the ledger shows the overshoot)."""

    name = Policy.ALLOW.value


class CountAfter(HoldPolicy):
    """``count_after``: the benchmarks' baseline: it holds one output token and nothing more,
    and the reply is counted when it ends."""

    name = Policy.COUNT_AFTER.value
    extends = False

    def asks_estimate(self, stream: bool) -> bool:
        return False

    def output_estimate(self, stream: bool, cap: int, expected: int | None) -> int:
        return 1  # the budget sees nothing of the reply until it ends


class NoHold(HoldPolicy):
    """The tenant fails open and the budget server did not answer the admission: nothing is
    held, so nothing grows, refreshes or stops the stream but the request's cap, any final
    report fits, a cut is charged all of the in-flight guess, and the settle charges an orphan
    hold (:meth:`.meter.Meter.settle`)."""

    holds = False
    extends = False

    def fits(self, final_output: int, reserved: int) -> bool:
        return True

    def charge_bound(self, reserved: int, *, ledger_failed: bool) -> int | None:
        return None


NO_HOLD = NoHold()


def policy_for(policy: Policy | str | HoldPolicy, *, reserved: bool = True) -> HoldPolicy:
    """The object a request's money is asked of: the route's ``policy`` (its name, or an object
    already) if admission ``reserved`` budget, else :data:`NO_HOLD` (a fail-open tenant whose
    admission got no answer)."""
    if not reserved:
        return NO_HOLD
    return policy if isinstance(policy, HoldPolicy) else _BY_NAME[str(policy)]
