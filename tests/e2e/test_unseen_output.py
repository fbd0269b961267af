"""Output a provider bills and does not stream, and a provider that stalls, through the gateway
(the official `openai` SDK as client) to the mock upstream on real Valkey, against the mock's
ground truth.

- Summarized thinking (the mock's Anthropic mode with `[mock:summarize=20]`: Claude 4 bills the
  whole thinking and streams one token in twenty). 8 streams at once on a fixed-estimate route
  with a 3,000-token budget were billed 625-665% of it while the ledger recorded a third of the
  bill; now no stream is charged less than its bill, and the bill stays within the budget.
- Silent reasoning (the OpenAI mode's `[mock:hidden=N]`, on a route of an o-series model): the
  provider is asked for no more than the hold, so concurrent streams cannot bill past it.
- A provider that streams 5 tokens and stalls, cut by the Lambda deadline: charged about what
  it sent, with the prompt the provider reported, not its speed times the silence.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import redis

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from hardcap_core.rollup.records import UsageRecord, parse_entry
from tests.stack import (
    ANTHROPIC_KEY_ENV,
    Mock,
    anthropic_config,
    gateway_thread,
    mock_fixture,
    openai_client,
)

PRICE = {"input_per_million": 1.0, "output_per_million": 2.0}
BUDGET = 3_000
THINKING = {"type": "enabled", "budget_tokens": 1024}
GUARD = 4  # gateway.truncate_guard_tokens


mock = mock_fixture(MockSettings(pace_ms=0.5, seed=31))


@pytest.fixture
def stack(
    flushed: LocalValkey, mock: Mock, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, openai.OpenAI, LocalValkey]]:
    monkeypatch.setenv(ANTHROPIC_KEY_ENV, "sk-ant-test")
    data = anthropic_config(mock, flushed)
    data["routes"] += [
        # A Claude 4 model: summarized thinking by its family, no setting needed.
        {"name": "claude-4", "upstream": "claude", "model": "claude-sonnet-4-5", "price": PRICE,
         "estimator": {"kind": "fixed", "fixed_tokens": 150}},
        {"name": "claude", "upstream": "claude", "model": "mock-small", "price": PRICE,
         "estimator": {"kind": "fixed", "fixed_tokens": 150}},
        # An OpenAI reasoning model: silent reasoning by its family.
        {"name": "o4", "upstream": "mock", "model": "o4-mini", "price": PRICE,
         "estimator": {"kind": "fixed", "fixed_tokens": 100}, "max_output_tokens": 1000},
    ]  # fmt: skip
    data["tenants"][0]["budgets"] = [
        {"dimension": "total_tokens", "limit": BUDGET, "window": "day"}
    ]
    with gateway_thread(data) as base:
        yield base, openai_client(base), flushed


def records(valkey: LocalValkey) -> dict[str, UsageRecord]:
    """The ledger's settled charges (its usage records), by request id."""
    with redis.Redis.from_url(valkey.url) as r:
        entries = r.xrange("hc:{o:acme}:usage")
    parsed = [parse_entry(i, f) for i, f in entries]
    return {rec.request_id: rec for rec in parsed if not rec.refused}


def reserved(valkey: LocalValkey) -> int:
    with redis.Redis.from_url(valkey.url) as r:
        return sum(int(v) for v in r.hgetall("hc:{o:acme}:reserved").values())


def stream(sdk: openai.OpenAI, route: str, text: str, user: str, **more: Any) -> str:
    """One streamed request, read to its end; how it ended (a finish reason, or the error)."""
    try:
        chunks = list(
            sdk.chat.completions.create(
                model=route, messages=[{"role": "user", "content": text}], user=user,
                stream=True, stream_options={"include_usage": True}, **more,
            )
        )  # fmt: skip
    except openai.APIError as e:
        return str(getattr(e, "code", None) or type(e).__name__)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    return str(finishes[-1])


def at_once(count: int, run: Any) -> dict[str, str]:
    """``run(i)`` in ``count`` threads at once; what each returned, by request id."""
    ends: dict[str, str] = {}

    def one(i: int) -> None:
        rid, end = run(i)
        ends[rid] = end

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(ends) == count
    return ends


def check_against_truth(
    mock: Mock, valkey: LocalValkey, ends: dict[str, str], label: str
) -> dict[str, int]:
    """Every stream the mock billed is charged at least its bill; the totals."""
    charges = records(valkey)
    billed = charged = 0
    for rid, end in sorted(ends.items()):
        truth = mock.truth(rid)
        if not truth.get("requests"):
            print(f"{label} {rid}: {end}")
            assert end in ("budget_exceeded", "budget_busy"), (rid, end)
            assert rid not in charges  # refused: nothing billed, nothing charged
            continue
        rec = charges[rid]
        bill = f"{truth['prompt_tokens']}+{truth['completion_tokens']}"
        charge = f"{rec.input_tokens}+{rec.output_tokens}"
        print(f"{label} {rid}: {end}: billed {bill}, charged {charge}")
        assert rec.output_tokens >= truth["completion_tokens"], (rid, end)
        assert rec.outcome != "completed" or rec.output_tokens == truth["completion_tokens"]
        assert rec.input_tokens >= truth["prompt_tokens"], (rid, end)
        billed += truth["total_tokens"]
        charged += rec.input_tokens + rec.output_tokens
    print(f"{label}: billed {billed}, charged {charged}, budget {BUDGET}")
    assert reserved(valkey) == 0
    return {"billed": billed, "charged": charged}


def test_summarized_thinking_8_at_once_is_charged_its_bill_within_the_budget(
    mock: Mock, stack: tuple[str, openai.OpenAI, LocalValkey]
) -> None:
    """8 streams of 1,000 tokens of thinking (50 streamed) and 600 of text on a route that
    reserves a fixed 150, on a 3,000-token budget: each holds its thinking budget, two fit,
    the rest wait and are refused once the budget is spent."""
    _, sdk, valkey = stack
    text = "Think. [mock:thinking=1000] [mock:summarize=20] [mock:tokens=600] [mock:pace_ms=1]"

    def run(i: int) -> tuple[str, str]:
        rid = f"s{i}-{uuid.uuid4().hex[:8]}"
        end = stream(
            sdk, "claude-4", text, rid, max_tokens=2000, extra_body={"thinking": THINKING},
            extra_headers={"x-request-id": rid},
        )  # fmt: skip
        return rid, end

    totals = check_against_truth(mock, valkey, at_once(8, run), "summarized")
    # Each stream holds its thinking budget from the start, so the cut comes before the
    # thinking and what streamed pass the hold: nothing past the budget, not even the tokens
    # in flight (the thinking budget is 24 more than the mock thinks, the summary and the
    # signature count on top: about 120 tokens of margin a stream).
    assert totals["billed"] <= BUDGET < totals["billed"] * 2


def test_an_incomplete_summarized_stream_is_charged_at_least_its_hold(
    mock: Mock, stack: tuple[str, openai.OpenAI, LocalValkey]
) -> None:
    """It ends without a finish 700 tokens into its thinking, of which 35 streamed: charged
    what streamed (about 35) it was 665 under the bill; now its hold (1,024 + 16)."""
    _, sdk, valkey = stack
    rid = f"eof-{uuid.uuid4().hex[:8]}"
    text = "Think. [mock:thinking=1000] [mock:summarize=20] [mock:eof_after=700]"
    end = stream(
        sdk, "claude-4", text, rid, max_tokens=2000, extra_body={"thinking": THINKING},
        extra_headers={"x-request-id": rid},
    )  # fmt: skip
    assert end == "upstream_error"  # an error event: the reply is not complete
    truth = mock.truth(rid)
    assert truth["completion_tokens"] == 700 and truth["aborted"] == 1
    rec = records(valkey)[rid]
    assert rec.outcome == "incomplete"
    assert rec.output_tokens >= 1024 + 16 > truth["completion_tokens"]


@pytest.mark.parametrize(
    ("thinking", "least"),
    [(THINKING, 1024 + 16), ({"type": "adaptive"}, 2000)],  # its budget; with none, the cap
)
def test_thinking_on_a_route_whose_model_name_says_nothing_is_held_and_charged_as_thinking(
    mock: Mock, stack: tuple[str, openai.OpenAI, LocalValkey], thinking: Any, least: int
) -> None:
    """The route "claude" serves "mock-small" on an Anthropic upstream: no model family says
    it summarizes its thinking, but the request turns thinking on, so it is held and charged
    as thinking. It ends 700 tokens into the thinking, 35 of them streamed: it was charged
    those 35; now at least its hold."""
    _, sdk, valkey = stack
    rid = f"opaque-{uuid.uuid4().hex[:8]}"
    text = "Think. [mock:thinking=1000] [mock:summarize=20] [mock:eof_after=700]"
    end = stream(
        sdk, "claude", text, rid, max_tokens=2000, extra_body={"thinking": thinking},
        extra_headers={"x-request-id": rid},
    )  # fmt: skip
    assert end == "upstream_error"
    assert mock.truth(rid)["completion_tokens"] == 700
    assert records(valkey)[rid].output_tokens >= least > 700


def test_silent_reasoning_4_at_once_bills_no_more_than_the_budget(
    mock: Mock, stack: tuple[str, openai.OpenAI, LocalValkey]
) -> None:
    """4 streams that reason 700 tokens unseen, then write 200, on a route reserving a fixed
    100: each was asked for up to the budget's room and billed 900, 3,600 in all. Now each holds
    the cap it is sent, shrunk to what is left at the tail."""
    _, sdk, valkey = stack
    text = "Reason. [mock:silent_ms=300] [mock:hidden=700] [mock:tokens=200]"

    def run(i: int) -> tuple[str, str]:
        rid = f"o{i}-{uuid.uuid4().hex[:8]}"
        end = stream(sdk, "o4", text, rid, max_tokens=1000, extra_headers={"x-request-id": rid})
        return rid, end

    totals = check_against_truth(mock, valkey, at_once(4, run), "silent")
    assert totals["billed"] <= BUDGET


def test_a_stream_cut_during_a_stall_is_charged_about_what_it_billed(
    mock: Mock, stack: tuple[str, openai.OpenAI, LocalValkey]
) -> None:
    """5 tokens at 100 a second, then silence; the Lambda deadline comes 1.5 s later. Charged
    about 5 and the prompt Anthropic reported, where it was charged the input estimate and the
    provider's speed times the silence."""
    _, sdk, valkey = stack
    rid = f"stall-{uuid.uuid4().hex[:8]}"
    context = json.dumps({"request_id": rid, "deadline": int((time.time() + 4.5) * 1000)})
    text = "Go on. [mock:tokens=50] [mock:stall_after=5] [mock:pace_ms=10]"
    end = stream(
        sdk, "claude", text, rid, max_tokens=200,
        extra_headers={"x-request-id": rid, "x-amzn-lambda-context": context},
    )  # fmt: skip
    assert end == "length"
    truth = mock.truth(rid)
    rec = records(valkey)[rid]
    print(f"stall: billed {truth['prompt_tokens']}+{truth['completion_tokens']}, "
          f"charged {rec.input_tokens}+{rec.output_tokens}")  # fmt: skip
    assert (truth["completion_tokens"], rec.outcome) == (5, "deadline")
    assert rec.input_tokens == truth["prompt_tokens"]  # reported in message_start
    # The guard (4) and the provider's speed (about 50 a second) times the 50 ms it takes to
    # notice and the gateway's recent loop lag (a few tokens more on a loaded machine); it
    # was charged 85, the speed times the 1.5 s silence.
    assert 5 <= rec.output_tokens <= 5 + GUARD + 20
