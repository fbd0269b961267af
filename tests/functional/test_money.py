"""One owner of a request's money (gateway/money.py), by property:

- the quote asks what admission asks: on random requests and routes (every policy, every kind
  of unseen output, streamed or not, thinking or reasoning or neither, any cap), the real
  ``quote()`` and the real ``Gateway._admit`` send the admit the same input, output estimate,
  least output and prices (the quote's decision on them is checked against admit.lua in
  test_quote_decision.py);
- every policy's charge is at least what the provider billed and at most the hold, on random
  endings, given what the meter guarantees (its guess of the tokens in flight covers what
  the provider made past what arrived; a policy that cuts stops before that passes the hold);
- a new policy is one class: a test-only one here, passed to a real meter on a real ledger.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from hardcap_core.budgets import Dimension
from hardcap_core.chat import OPENAI_CHAT, ChatRequest, ServerTool
from hardcap_core.config import Policy, parse_config
from hardcap_core.events import Usage
from hardcap_core.gateway import quote as quote_module
from hardcap_core.gateway.meter import Meter, MeterSettings
from hardcap_core.gateway.money import (
    NO_HOLD,
    Ended,
    Hold,
    HoldPolicy,
    ToolHold,
    ToolUses,
    Truncate,
    output_cap,
    policy_for,
    tool_hold,
)
from hardcap_core.gateway.pipeline import Gateway
from hardcap_core.gateway.unseen import SEEN, Unseen
from hardcap_core.ledger import FREE, Admitted, Ledger, ReservationMeta, Unguarded
from hardcap_core.ledger.estimators import MaxTokensEstimator
from hardcap_core.ledger.replies import Usage as LedgerUsage
from hardcap_core.outcome import Outcome
from hardcap_core.wire.openai_chat import OpenAIChat
from tests.conftest import TENANT, scope
from tests.stack import config_data

POLICIES = [p.value for p in Policy]
UNSEEN = ["none", "summarized_thinking", "silent_reasoning"]
ROUTES = [(p, u) for p in POLICIES for u in UNSEEN]


def _config() -> Any:
    data = config_data("http://127.0.0.1:9", "redis://127.0.0.1:9")
    # On an Anthropic upstream, with web search priced: a request may carry the tool.
    data["upstreams"].append(
        {
            "name": "claude",
            "kind": "anthropic",
            "base_url": "http://127.0.0.1:9/v1",
            "timeout_seconds": 5,
        }
    )
    price = {"input_per_million": 1.0, "output_per_million": 4.0, "web_search_per_1000": 10.0}
    fixed = {"kind": "fixed", "fixed_tokens": 300}
    data["routes"] = [
        dict(name=f"{policy}-{unseen}", upstream="claude", model="mock-small", price=price,
             policy=policy, unseen_output=unseen, estimator=fixed, max_output_tokens=4096,
             min_output_reservation=24)
        for policy, unseen in ROUTES
    ]  # fmt: skip
    for tenant in data["tenants"]:
        tenant.pop("routes", None)
    return parse_config(data)


class RecordingLedger:
    """What the gateway's admission sends the ledger; it answers as a cache that is down for
    a tenant that fails open (nothing held, so nothing else is called)."""

    client = scripts = keys = None

    def __init__(self) -> None:
        self.admits: list[dict[str, Any]] = []

    async def admit(self, scope: Any, **kwargs: Any) -> Unguarded:
        self.admits.append(kwargs)
        return Unguarded("test", kwargs["reservation_id"])

    async def usage(self, scope: Any, rates: bool = False) -> LedgerUsage:
        return LedgerUsage(rows=(), live_reservations=0, server_time_ms=0)


CONFIG = _config()
LEDGER = RecordingLedger()
GATEWAY = Gateway(CONFIG, LEDGER, {})  # type: ignore[arg-type]
PRINCIPAL = CONFIG.principal_by_id("alpha-k")


@st.composite
def requests(draw: st.DrawFn) -> ChatRequest:
    policy, unseen = draw(st.sampled_from(ROUTES))
    body: dict[str, Any] = {"model": f"{policy}-{unseen}", "messages": []}
    thinking = draw(st.sampled_from([None, "disabled", "adaptive", "budget"]))
    if thinking == "budget":
        body["thinking"] = {"type": "enabled", "budget_tokens": draw(st.integers(1, 5000))}
    elif thinking is not None:
        body["thinking"] = {"type": thinking}
    if draw(st.booleans()):
        body["reasoning_effort"] = draw(st.sampled_from(["none", "low", "high"]))
    server: tuple[ServerTool, ...] = ()
    native = None
    if draw(st.booleans()):  # a web search, bounded by the request or by the route
        uses = draw(st.none() | st.integers(1, 20))
        server = (ServerTool("web_search", "web_search_20250305", "tools[0]", 0, uses),)
        native = {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    return ChatRequest(
        body=body, model=body["model"], stream=draw(st.booleans()), include_usage=True,
        max_tokens=draw(st.none() | st.integers(1, 4096)), max_tokens_field="max_tokens",
        input_tokens=draw(st.integers(1, 20_000)), dialect=OPENAI_CHAT, native=native,
        server_tools=server,
    )  # fmt: skip


def _request() -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    return Request({"type": "http", "method": "POST", "headers": [], "path": "/"}, receive)


DECIDE = quote_module.decide


async def _both(chat: ChatRequest) -> tuple[Any, Any]:
    asked: list[quote_module.Ask] = []

    def recording(ask: quote_module.Ask, *args: Any) -> quote_module.Decision:
        asked.append(ask)
        return DECIDE(ask, *args)

    assert PRINCIPAL is not None
    with mock.patch.object(quote_module, "decide", recording):
        await quote_module.quote(GATEWAY, b"", PRINCIPAL, lambda raw: chat)
    route = CONFIG.routes[chat.model]
    meta = ReservationMeta(route.name, route.model, PRINCIPAL.key_id, "r", PRINCIPAL.tenant_id)
    LEDGER.admits.clear()
    admission = await GATEWAY._admit(
        PRINCIPAL, route, chat, output_cap(route, chat), meta, OpenAIChat(), 0.0, None,
        _request(), tool_hold(CONFIG, route, chat),
    )  # fmt: skip
    return asked[-1], (LEDGER.admits[-1], admission)


@settings(max_examples=300, deadline=None)
@given(chat=requests())
def test_the_quote_asks_the_admit_what_admission_asks(chat: ChatRequest) -> None:
    ask, (admit, admission) = asyncio.run(_both(chat))
    held = admit["prices"]
    assert (ask.input_tokens, ask.output_estimate, ask.min_output) == (
        admit["input_tokens"], admit["output_estimate"], admit["min_output"])  # fmt: skip
    assert (ask.input_nusd, ask.output_nusd) == (held.input_nusd, held.output_nusd)
    assert ask.headroom == admit["headroom"]
    # The server tools' uses are held on the input, at their price, in both.
    route = CONFIG.routes[chat.model]
    tools = tool_hold(CONFIG, route, chat)
    uses = sum(t.uses for t in tools.tools)
    assert uses == (chat.server_tools[0].max_uses or 5 if chat.server_tools else 0)
    assert held.input_nusd * admit["input_tokens"] >= 1_000 * admit["input_tokens"] + tools.nusd
    assert admit["input_tokens"] >= tools.input_tokens + 1
    assert (
        admission.meter.unseen
        == policy_for(CONFIG.routes[chat.model].policy)
        .hold(CONFIG.routes[chat.model], chat, output_cap(CONFIG.routes[chat.model], chat), 300)
        .unseen
    )


# -- every policy's charge --------------------------------------------------------------------


class Reserved(HoldPolicy):
    """A test-only policy, and the whole of it: a stream holds its whole cap up front, never
    grows it, and is cut where it runs out (a hard cap with no extends)."""

    extends = False
    truncates = True

    def output_estimate(self, stream: bool, cap: int, expected: int | None) -> int:
        return cap


EVERY = [policy_for(p) for p in Policy] + [NO_HOLD, Reserved()]
ENDINGS = [o for o in Outcome if not o.billed_nothing]


@st.composite
def endings(draw: st.DrawFn) -> tuple[HoldPolicy, Outcome, Ended, int, Usage | None]:
    """A policy, how the stream ended, what the meter knew, what the provider billed for
    output, and the provider's last report."""
    policy = draw(st.sampled_from(EVERY))
    outcome = draw(st.sampled_from(ENDINGS))
    streamed = draw(st.integers(0, 2000))  # what the provider streamed before the close
    counted = streamed + draw(st.integers(0, 50))  # the gateway's count runs high
    unseen = draw(st.sampled_from([SEEN, Unseen(tokens=draw(st.integers(1, 500)))]))
    past = draw(st.integers(0, 300)) if outcome.cut else 0  # made past what arrived
    in_flight = past + draw(st.integers(0, 100))  # the guess covers it (gateway/pace.py)
    made = unseen.tokens + streamed + past
    bound = policy.charge_bound(10**9, ledger_failed=False)
    # The meter cuts before its estimate passes the hold; one that does not cut grows it.
    reserved = unseen.tokens + counted + in_flight + draw(st.integers(0, 400))
    if bound is None:
        reserved = 0
    asked = draw(st.none() | st.integers(max(made, 1), max(made, 1) + 500))  # it obeys
    report = None
    if draw(st.booleans()):  # a running count: a floor, below what it had made
        report = Usage(input_tokens=draw(st.none() | st.integers(1, 100)),
                       output_tokens=draw(st.integers(0, made)))  # fmt: skip
    final = None
    if draw(st.booleans()):
        final = Usage(input_tokens=draw(st.integers(1, 100)), output_tokens=made)
        report = final
    ended = Ended(
        input_estimate=draw(st.integers(1, 100)), received=unseen.tokens + counted,
        in_flight=lambda: in_flight, reserved=reserved, unseen=unseen, final=final,
        asked=asked, received_least=streamed,
    )  # fmt: skip
    return policy, outcome, ended, made, report


@settings(max_examples=2000, deadline=None)
@given(case=endings())
def test_every_policy_charges_at_least_the_bill_and_at_most_the_hold(
    case: tuple[HoldPolicy, Outcome, Ended, int, Usage | None],
) -> None:
    policy, outcome, ended, billed, report = case
    charge = policy.charge(outcome, report, ended)
    assert charge.output >= billed
    if ended.final is not None:
        # The report is the bill (a report of no output, with output received: what arrived).
        assert (charge.output == billed or billed == 0) and not charge.estimated
    if policy.holds and ended.final is None:
        assert charge.output <= max(ended.reserved, ended.received)  # past it: the overshoot
    assert charge.estimated == (outcome.cut and ended.final is None)


@settings(max_examples=500, deadline=None)
@given(
    case=endings(),
    held=st.integers(1, 20),
    reported=st.none() | st.integers(0, 40),
    outcome=st.sampled_from(list(Outcome)),
)
def test_server_tool_uses_are_charged_as_reported_never_past_the_uses_held(
    case: tuple[HoldPolicy, Outcome, Ended, int, Usage | None],
    held: int,
    reported: int | None,
    outcome: Outcome,
) -> None:
    """A web search held for ``held`` uses at $0.01: the final report's count is charged, no
    more than was held (a provider that reports more is charged the bound); without a final
    report, or one that gives no count, every use held; nothing where nothing was billed."""
    policy, _, ended, _, report = case
    search = ServerTool("web_search", "web_search_20250305", "tools[0]", 0, held)
    tools = ToolHold((ToolUses(search, held, 10_000_000),), held * 100, 100)
    final = ended.final
    if final is not None and reported is not None:
        final = dataclasses.replace(final, tool_uses=(("web_search", reported),))
    ended = dataclasses.replace(ended, final=final, tools=tools)
    charge = policy.charge(outcome, report, ended)
    if outcome.billed_nothing:
        assert charge.fees == 0
    elif final is not None and reported is not None:
        assert charge.fees == min(reported, held) * 10_000_000
    else:
        assert charge.fees == held * 10_000_000
    if not outcome.billed_nothing and final is None:
        assert charge.input >= ended.input_estimate  # the results' input, as held
    assert charge.fees <= tools.nusd
    assert charge.cost(FREE) == charge.fees


def test_a_new_policy_is_one_class() -> None:
    """The test-only :class:`Reserved`: admission holds the cap and a cut is charged within it,
    with no other code told of it."""
    route = CONFIG.routes["truncate-none"]
    chat = ChatRequest({"model": route.name, "messages": []}, route.name, True, True, 500,
                       "max_tokens", 10, OPENAI_CHAT)  # fmt: skip
    assert Reserved().hold(route, chat, 500, expected=300) == Hold(500, 24, SEEN)
    assert Truncate().hold(route, chat, 500, expected=300) == Hold(300, 24, SEEN)


async def test_a_new_policy_runs_a_real_meter(standalone_client: Any) -> None:
    ledger = Ledger(standalone_client)
    s = scope((TENANT, Dimension.OUTPUT_TOKENS, 10_000, "day"), levels=(TENANT,))
    admitted = await ledger.admit(s, input_tokens=10, output_estimate=100, min_output=24)
    assert isinstance(admitted, Admitted)
    meter = Meter(
        ledger, s, admitted.reservation, MeterSettings(), policy=Reserved(), input_estimate=10,
        estimator=MaxTokensEstimator(), route="r", prices=FREE, clock=lambda: 0.0,
    )  # fmt: skip
    meter.note_read(0)
    sent = 0
    for _ in range(200):
        meter.note_read(1)
        if not await meter.make_room(1):
            break
        sent += 1
    assert meter.truncated and meter.reserved == 100 and sent < 100  # cut, never grown
    await meter.settle(Outcome.TRUNCATED)
    assert sent <= meter.charged_output <= 100


def test_a_route_gets_the_class_named_for_its_policy() -> None:
    assert [type(policy_for(p)).__name__ for p in Policy] == ["Truncate", "Allow", "CountAfter"]
    assert policy_for(Policy.ALLOW, reserved=False) is NO_HOLD
    shaped = Reserved()
    assert policy_for(shaped) is shaped
    assert dataclasses.replace(Hold(1, 1), estimate=2) == Hold(2, 1)
