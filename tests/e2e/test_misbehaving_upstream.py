"""A provider that misbehaves, through the real gateway: malformed events, streams cut off
without a finish, output the gateway must count (audio, legacy function calls, max_tokens
ignored), and reasoning that thinks silently past the reservation's TTL.

Whatever the provider does, the client gets an OpenAI-shaped error (before the first byte) or
an error event and a clean end, or a whole reply; never a dropped connection. Nothing stays
reserved, and the ledger charges at least what the mock generated (its ground truth).

Tenant beta (an output-token budget, route `small`) makes requests as mock user "beta", so the
ledger's output row and the mock's completion tokens count the same thing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hardcap_core.config.settings import DEFAULT_GATEWAY
from hardcap_core.local.mock_plan import (
    ERROR_OBJECT,
    LIES,
    MALFORMED_KINDS,
    NOT_JSON,
    USAGE_NOT_OBJECT,
    per_piece,
)
from hardcap_core.local.valkey import LocalValkey
from tests.stack import KEYS, Mock, config_data, gateway_processes, gateway_thread

AUTH = {"authorization": f"Bearer {KEYS['beta']}"}
GUARD = DEFAULT_GATEWAY.truncate_guard_tokens  # tokens a provider may add after a cut
# Kinds of bad event that end the stream in an error (the others are survived: ignored, or
# counted by their length, and the reply goes on).
FATAL = frozenset({ERROR_OBJECT, NOT_JSON})
SMALL = 300  # output tokens in the small budget
PACE_MS = 5  # the mock's pace in the tests that bound what it generates past a cut
# How long the provider may go on after the gateway forwards the cap before it notices the close:
# gateway.truncate_guard_ms on an idle machine; a loaded one delays the gateway's close by its
# loop lag, so the bound allows a second (the charge below covers whatever it was).
NOTICE_MS = 1000


def output_budget(limit: int) -> dict[str, Any]:
    return {"tenants.1.budgets": [{"dimension": "output_tokens", "limit": limit, "window": "day"}]}


@pytest.fixture
def gateway(valkey: LocalValkey, mock: Mock) -> Callable[..., Any]:
    """Start a gateway with config overrides on a flushed Valkey and a reset mock."""

    @contextmanager
    def start(**overrides: Any) -> Iterator[str]:
        with redis.Redis.from_url(valkey.url) as r:
            r.flushall()
        mock.reset()
        with gateway_thread(config_data(mock.url, valkey.url, **overrides)) as url:
            yield url

    return start


@pytest.fixture
def gateway_process(valkey: LocalValkey, mock: Mock, tmp_path: Path) -> Callable[..., Any]:
    """Like ``gateway``, but a `hardcap serve` process of its own, as deployed: the tests that
    bound what a provider generates past a cut run it so, since a gateway thread shares this
    process's interpreter lock with the SDK parsing every chunk and the mock writing them,
    which starves it in a way no deployment is (the meter's margins cover a loop that lags,
    not one frozen behind another thread for most of a stream)."""

    @contextmanager
    def start(**overrides: Any) -> Iterator[str]:
        with redis.Redis.from_url(valkey.url) as r:
            r.flushall()
        mock.reset()
        data = config_data(mock.url, valkey.url, **overrides)
        with gateway_processes(data, 1, tmp_path) as (url,):
            yield url

    return start


@pytest.fixture
def sdk() -> Iterator[Callable[[str], openai.OpenAI]]:
    made: list[openai.OpenAI] = []

    def make(base: str) -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=base, api_key=KEYS["beta"], max_retries=0))
        return made[-1]

    yield make
    for client in made:
        client.close()


def ledger(base: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{base}/hardcap/usage", headers=AUTH).json()
    return body


def charged_output(base: str) -> int:
    """What the ledger charged tenant beta's output budget, once nothing is reserved."""
    body = ledger(base)
    assert body["live_reservations"] == 0
    assert all(row["reserved"] == 0 for row in body["budgets"]), body["budgets"]
    (row,) = [r for r in body["budgets"] if r["level"] == "tenant"]
    assert row["dimension"] == "output_tokens"
    used: int = row["used"]
    return used


def generated(mock: Mock) -> int:
    """What the mock generated and billed for beta (0 if it never answered)."""
    return mock.truth("beta").get("completion_tokens", 0)


class Raw:
    """A streamed reply as the client's bytes: status, data events, and how it ended."""

    def __init__(self, base: str, text: str, **fields: Any) -> None:
        body = {
            "model": "small",
            "messages": [{"role": "user", "content": text}],
            "stream": True,
            "user": "beta",
            **fields,
        }
        self.events: list[Any] = []
        self.clean = True  # the response ended properly (not a dropped connection)
        data = b""
        url = f"{base}/chat/completions"
        with httpx.stream("POST", url, json=body, headers=AUTH, timeout=30) as response:
            self.status = response.status_code
            try:
                for piece in response.iter_bytes():
                    data += piece
            except httpx.HTTPError:
                self.clean = False
        if self.status != 200:
            self.error = json.loads(data)
            return
        for block in data.decode().split("\n\n"):
            if block.startswith("data: "):
                payload = block.removeprefix("data: ")
                self.events.append(payload if payload == "[DONE]" else json.loads(payload))

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [e for e in self.events if isinstance(e, dict) and "error" not in e]

    @property
    def finishes(self) -> list[str]:
        return [
            c["finish_reason"]
            for e in self.chunks
            for c in e.get("choices") or ()
            if isinstance(c, dict) and c.get("finish_reason")
        ]


def assert_openai_error(body: Any) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "code", "param"}
    assert body["error"]["message"]


# -- malformed events ----------------------------------------------------------------------------


@pytest.mark.parametrize("at", [0, 3], ids=["first", "mid"])
@pytest.mark.parametrize("kind", sorted(MALFORMED_KINDS), ids=MALFORMED_KINDS.get)
def test_a_malformed_event_ends_in_an_error_or_the_reply_goes_on(
    gateway: Callable[..., Any], mock: Mock, kind: int, at: int
) -> None:
    text = f"hi [mock:malformed={kind}] [mock:malformed_at={at}] [mock:tokens=20] [mock:pace_ms=10]"
    with gateway() as base:
        raw = Raw(base, text, stream_options={"include_usage": True})
        assert raw.clean  # never a dropped connection
        if kind in FATAL and at == 0:
            # Nothing went out yet: a proper error status.
            assert raw.status == 502
            assert_openai_error(raw.error)
        elif kind in FATAL:
            # An error event, then the response ends cleanly (no [DONE]: it did not complete).
            assert raw.status == 200
            assert_openai_error(raw.events[-1])
            assert "[DONE]" not in raw.events
        else:
            assert raw.status == 200
            assert raw.events[-1] == "[DONE]"
            # Every chunk the client gets is one the SDK's own model accepts.
            for chunk in raw.chunks:
                ChatCompletionChunk.model_validate(chunk)
            assert raw.finishes == ["stop"]
        assert charged_output(base) >= generated(mock)


@pytest.mark.parametrize("kind", sorted(MALFORMED_KINDS), ids=MALFORMED_KINDS.get)
def test_the_sdk_sees_a_malformed_event_as_an_error_or_a_whole_reply(
    gateway: Callable[..., Any], sdk: Callable[[str], openai.OpenAI], mock: Mock, kind: int
) -> None:
    text = f"hi [mock:malformed={kind}] [mock:malformed_at=3] [mock:tokens=20] [mock:pace_ms=10]"
    with gateway() as base:
        stream = sdk(base).chat.completions.create(
            model="small", messages=[{"role": "user", "content": text}], stream=True, user="beta"
        )
        if kind in FATAL:
            with pytest.raises(openai.APIError):
                list(stream)
        else:
            chunks = list(stream)
            # The SDK does not validate chunks: a null choice would reach the caller's code.
            choices = [choice for c in chunks for choice in c.choices]
            assert None not in choices
            assert [choice.finish_reason for choice in choices][-1] == "stop"
        assert charged_output(base) >= generated(mock)


@pytest.mark.parametrize("kind", sorted(MALFORMED_KINDS), ids=MALFORMED_KINDS.get)
def test_a_malformed_whole_reply_is_an_error_or_a_reply_and_is_charged(
    gateway: Callable[..., Any], mock: Mock, kind: int
) -> None:
    """The provider answered 200 and billed the reply, whatever its body looks like: the
    client gets a reply or an OpenAI-shaped error, and the ledger charges what was billed."""
    body = {
        "model": "small",
        "user": "beta",
        "messages": [{"role": "user", "content": f"hi [mock:malformed={kind}] [mock:tokens=20]"}],
    }
    with gateway() as base:
        response = httpx.post(f"{base}/chat/completions", json=body, headers=AUTH, timeout=30)
        if response.status_code == 200:
            ChatCompletion.model_validate(response.json())
        else:
            assert response.status_code == 502
            assert_openai_error(response.json())
        assert generated(mock) > 0
        if kind == USAGE_NOT_OBJECT:
            # No usage: the gateway counts the reply's text, about 4 characters a token, which
            # lands either side of the truth (the mock's words average 4.4 characters; real
            # English under a real tokenizer about 4). Charged, at least.
            assert charged_output(base) > 0
        else:
            assert charged_output(base) >= generated(mock)


# -- streams that end without saying they are complete --------------------------------------------


@pytest.mark.parametrize("ending", ["die_after", "eof_after"])
def test_a_stream_cut_off_without_a_finish_is_an_error_not_a_completion(
    gateway: Callable[..., Any], sdk: Callable[[str], openai.OpenAI], mock: Mock, ending: str
) -> None:
    """`die_after` drops the connection; `eof_after` ends the body cleanly. Either way the
    provider never said the reply was complete: the client must not take it for one."""
    text = f"hi [mock:{ending}=5] [mock:tokens=20] [mock:pace_ms=5]"
    with gateway() as base:
        raw = Raw(base, text, stream_options={"include_usage": True})
        assert raw.status == 200 and raw.clean
        assert_openai_error(raw.events[-1])
        assert "[DONE]" not in raw.events and raw.finishes == []
        stream = sdk(base).chat.completions.create(
            model="small", messages=[{"role": "user", "content": text}], stream=True, user="beta"
        )
        with pytest.raises(openai.APIError):
            list(stream)
        assert generated(mock) == 10
        assert charged_output(base) >= 10


# -- output the gateway must count ---------------------------------------------------------------

SHAPES = {
    "content": "",
    "function_call": "[mock:function_call=1]",
    "audio": "[mock:audio=1]",
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_output_a_provider_bills_is_cut_at_a_small_budget(
    gateway_process: Callable[..., Any],
    sdk: Callable[[str], openai.OpenAI],
    mock: Mock,
    shape: str,
) -> None:
    """The provider ignores max_tokens, so only the gateway's count stops it. Bound: the
    budget, plus the truncation guard, plus one step of the mock (a spoken word bills its
    transcript and 8 audio tokens at once: the gateway cannot cut inside it)."""
    text = f"hi {SHAPES[shape]} [mock:ignore_cap=1] [mock:tokens=815] [mock:pace_ms=5]"
    with gateway_process(**output_budget(SMALL)) as base:
        chunks = list(
            sdk(base).chat.completions.create(
                model="small",
                messages=[{"role": "user", "content": text}],
                stream=True,
                user="beta",
            )
        )
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        truth = generated(mock)
        assert truth <= SMALL + GUARD + per_piece(shape)
        assert charged_output(base) >= truth


def test_a_whole_reply_that_ignores_max_tokens_is_charged_in_full_and_stops_the_tenant(
    gateway: Callable[..., Any], sdk: Callable[[str], openai.OpenAI], mock: Mock
) -> None:
    """The gateway asks for no more than the budget holds, but a whole (non-streamed) reply
    cannot be cut: a provider that generates past the cap takes the tenant past its budget by
    its excess (the documented bound, docs/design.md "Ways past the cap"). Nothing of it is
    lost: it is charged in full, and the tenant is refused until the window resets."""
    text = "hi [mock:ignore_cap=1] [mock:tokens=815]"
    with gateway(**output_budget(SMALL)) as base:
        client = sdk(base)
        client.chat.completions.create(
            model="small", messages=[{"role": "user", "content": text}], user="beta"
        )
        truth = generated(mock)
        assert truth > SMALL  # the provider's excess: the bound this path cannot close
        assert charged_output(base) >= truth
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(
                model="small", messages=[{"role": "user", "content": "hi"}], user="beta"
            )
        assert refused.value.code == "budget_exceeded"


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_provider_that_ignores_max_tokens_is_cut_at_it(
    gateway_process: Callable[..., Any],
    sdk: Callable[[str], openai.OpenAI],
    mock: Mock,
    shape: str,
) -> None:
    """A budget with room to spare: only the request's max_tokens stands in the way. The
    gateway forwards up to the cap (a provider that obeys it must not lose its last tokens to
    a guess), so the bound is the cap, the guard, and what the provider generates in the time
    it takes to notice the close (at most NOTICE_MS at its speed); the gateway grows the hold
    over that, so it is charged. The provider was asked for 300: it stopped well short."""
    text = f"hi {SHAPES[shape]} [mock:ignore_cap=1] [mock:tokens=300] [mock:pace_ms={PACE_MS}]"
    with gateway_process(**output_budget(1_000_000)) as base:
        chunks = list(
            sdk(base).chat.completions.create(
                model="small",
                messages=[{"role": "user", "content": text}],
                stream=True,
                user="beta",
                max_tokens=50,
            )
        )
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        truth = generated(mock)
        assert truth <= 50 + GUARD + per_piece(shape) * (1 + NOTICE_MS // PACE_MS)
        assert charged_output(base) >= truth


# -- reasoning in silence ------------------------------------------------------------------------


def test_silent_reasoning_is_billed_and_charged(
    gateway: Callable[..., Any], sdk: Callable[[str], openai.OpenAI], mock: Mock
) -> None:
    text = "hi [mock:silent_ms=500] [mock:keepalive_ms=100] [mock:hidden=120] [mock:tokens=30]"
    with gateway() as base:
        chunks = list(
            sdk(base).chat.completions.create(
                model="small",
                messages=[{"role": "user", "content": text}],
                stream=True,
                user="beta",
                stream_options={"include_usage": True},
            )
        )
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == 150
        assert usage.completion_tokens_details is not None
        assert usage.completion_tokens_details.reasoning_tokens == 120
        assert generated(mock) == 150
        assert charged_output(base) == 150


@pytest.mark.parametrize("keepalive", ["", "[mock:keepalive_ms=200]"], ids=["silent", "pings"])
def test_silent_reasoning_past_the_ttl_keeps_its_hold(
    gateway: Callable[..., Any], sdk: Callable[[str], openai.OpenAI], mock: Mock, keepalive: str
) -> None:
    """A thinks silently for 5 s before its first byte, with a 1.5 s reservation TTL. B comes
    at 2.5 s: if A's hold had expired and been reclaimed, both would be served and charged
    past the budget. (On a machine so slow that B came after A's silence, the test could not
    see the fault, but would not fail for it either.)
    """
    limit = 600
    overrides = {
        **output_budget(limit),
        "gateway.reservation_ttl_seconds": 1.5,
        # Silence is a read timeout to the gateway: give the thinking room (5 s in the config).
        "upstreams.0.timeout_seconds": 30,
    }
    thinker = f"a [mock:silent_ms=5000] {keepalive} [mock:hidden=200] [mock:tokens=300]"
    with gateway(**overrides) as base:
        client = sdk(base)
        errors: list[BaseException] = []

        def run_a() -> None:
            try:
                list(
                    client.chat.completions.create(
                        model="small",
                        messages=[{"role": "user", "content": thinker}],
                        stream=True,
                        user="beta",
                        max_tokens=500,
                    )
                )
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        a = threading.Thread(target=run_a)
        a.start()
        time.sleep(2.5)  # A is still thinking; its hold is 1 s past the TTL
        refused = None
        try:
            list(
                client.chat.completions.create(
                    model="small",
                    messages=[{"role": "user", "content": "b [mock:tokens=300]"}],
                    stream=True,
                    user="beta",
                    max_tokens=500,
                )
            )
        except openai.RateLimitError as e:
            refused = e.code
        assert refused in (None, "budget_busy")  # busy: A holds 500 of the 600
        a.join(timeout=30)
        assert not a.is_alive() and errors == []
        truth = generated(mock)
        assert truth <= limit
        assert truth <= charged_output(base) <= limit


# -- numbers and headers an upstream sends that no provider would -------------------------------

LIE_IDS = {1: "output-2^53+1", 2: "output-negative", 3: "output-2^63-1", 4: "input-2^53+1",
           5: "input-negative"}  # fmt: skip
LIE_CAP = 50


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("lie", sorted(LIES), ids=LIE_IDS.get)
def test_a_provider_that_lies_about_usage_leaves_the_budget_intact(
    gateway: Callable[..., Any],
    sdk: Callable[[str], openai.OpenAI],
    mock: Mock,
    lie: int,
    stream: bool,
) -> None:
    """9,007,199,254,740,993 output tokens for a cap of 50 took the tenant's day (every next
    request 429); -1,000,000,000 charged a delivered reply nothing; 2^63-1 was a 500 and the
    bill lost. The reply goes out; it is charged as one whose provider reported nothing: what
    arrived, within the cap it was sent, and the input as the gateway bounded it."""
    text = f"hi [mock:lie={lie}] [mock:tokens=20]"
    with gateway() as base:
        client = sdk(base)
        messages: Any = [{"role": "user", "content": text}]
        if stream:
            replies = client.chat.completions.create(
                model="small", messages=messages, user="beta", max_tokens=LIE_CAP,
                stream=True, stream_options={"include_usage": True},
            )  # fmt: skip
            chunks = list(replies)
            usage = chunks[-1].usage
        else:
            reply = client.chat.completions.create(
                model="small", messages=messages, user="beta", max_tokens=LIE_CAP
            )
            usage = reply.usage
        truth = generated(mock)
        assert truth == 20
        charged = charged_output(base)
        assert truth <= charged <= LIE_CAP  # never the lie, never past the hold
        assert usage is not None
        assert (usage.completion_tokens, usage.prompt_tokens > 0) == (charged, True)
        assert usage.prompt_tokens < 1000  # the gateway's bound of "hi ...", not the lie
        # The tenant's budget is intact: the next request is served and charged as usual.
        client.chat.completions.create(
            model="small", messages=[{"role": "user", "content": "again [mock:tokens=5]"}],
            user="beta", max_tokens=LIE_CAP,
        )  # fmt: skip
        assert charged_output(base) == charged + 5


@pytest.mark.parametrize("status", [302, 307])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_redirect_is_a_502_and_costs_nothing(
    gateway: Callable[..., Any], sdk: Callable[[str], openai.OpenAI], status: int, stream: bool
) -> None:
    """A 302 whose body is a completion was served as a 200; a 307 with no body was a 502
    charged for nothing generated. Both are the provider's failure, as a 5xx is: nothing is
    followed, nothing was generated, nothing is charged."""
    text = f"hi [mock:redirect={status}] [mock:tokens=20]"
    with gateway() as base:
        client = sdk(base)

        def ask() -> None:
            reply = client.chat.completions.create(
                model="small", messages=[{"role": "user", "content": text}], user="beta",
                stream=stream,
            )  # fmt: skip
            if stream:
                list(reply)

        with pytest.raises(openai.InternalServerError) as failed:
            ask()
        assert failed.value.status_code == 502
        assert f"answered {status}" in failed.value.message
        assert charged_output(base) == 0


def test_a_cookie_one_tenant_was_given_never_reaches_the_provider_with_another_tenant(
    gateway: Callable[..., Any], mock: Mock
) -> None:
    """The provider (by its DNS name: a cookie jar keeps none for an IP address) sets a cookie
    on alpha's reply; beta's request, and alpha's next, go without it."""
    upstream = mock.url.replace("127.0.0.1", "localhost") + "/v1"
    with gateway(**{"upstreams.0.base_url": upstream}) as base:
        for key, tenant in (("alpha", "alpha"), ("beta", "beta"), ("alpha", "alpha")):
            client = openai.OpenAI(base_url=base, api_key=KEYS[key], max_retries=0)
            with client:
                text = "hi [mock:set_cookie=1] [mock:tokens=3]"
                client.chat.completions.create(
                    model="small", user=tenant, messages=[{"role": "user", "content": text}]
                )
        assert mock.http.get("/mock/cookies").json() == [None, None, None]
