"""A hostile upstream through the whole gateway: what the tenant gets and what the ledger charges.

The gateway runs on real ports against a real Valkey, the official ``openai`` SDK is the client,
and the upstream is :mod:`tests.hostile_upstream` answering as an OpenAI-compatible provider
would, except for the one way it misbehaves in each test. Replies name the request they answer
(``rid=<id>`` in the prompt; the provider's reply says ``reply to rid=<id>``) and carry a usage
report of their own, so a reply or a charge that reached the wrong tenant shows.

What each ending should cost is the table "The upstream connection: what each hostile reply
gets" in docs/design.md. Tenant beta has an output-token budget (the ledger's row is what the
output was charged), alpha a total-token budget (input and output).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest
import redis

from hardcap_core.local.valkey import LocalValkey
from tests.hostile_upstream import (
    CONTINUE,
    EARLY_HINTS,
    LAST_CHUNK,
    SSE_HEAD,
    Connection,
    HostileUpstream,
    Request,
    Script,
    chunk,
    completion,
    delta,
    gzip_bomb,
    head,
    in_thread,
    response,
    stream_end,
)
from tests.stack import KEYS, config_data, gateway_thread

TIMEOUT_S = 1.0  # the upstream's timeout_seconds: how long a stall lasts before it is one
USAGE = {"alpha": (5, 11), "beta": (5, 7)}  # what the upstream reports per tenant: input, output
STRAY = (500, 999)  # the usage of a reply nobody asked for
JSON = "content-type: application/json"


def tenant_of(rid: str | None) -> str:
    return (rid or "").split("-", 1)[0]


def reply_for(request: Request) -> bytes:
    """The upstream's honest reply to ``request``: streamed or whole, naming it, with the
    usage of its tenant."""
    prompt, output = USAGE.get(tenant_of(request.rid), (5, 7))
    if request.json().get("stream"):
        events = [delta(f"reply to rid={request.rid}")] + [delta(" tok") for _ in range(4)]
        events.append(stream_end(prompt=prompt, output=output))
        return SSE_HEAD + b"".join(chunk(e) for e in events) + LAST_CHUNK
    return response(completion(request.rid, prompt=prompt, output=output), JSON)


def stray_reply(rid: str) -> bytes:
    """A whole reply that claims to answer ``rid``, with a large bill."""
    return response(completion(rid, prompt=STRAY[0], output=STRAY[1]), JSON)


@contextmanager
def serving(valkey: LocalValkey, script: Script) -> Iterator[tuple[str, HostileUpstream]]:
    """A gateway (its /v1 URL) on a flushed Valkey whose every route goes to an upstream
    running ``script``."""
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    upstream = HostileUpstream(script)
    with in_thread(upstream):
        data = config_data(upstream.url, valkey.url, **{"upstreams.0.timeout_seconds": TIMEOUT_S})
        with gateway_thread(data) as base:
            yield base, upstream


@pytest.fixture
def sdk() -> Iterator[Callable[[str, str], openai.OpenAI]]:
    made: list[openai.OpenAI] = []

    def make(base: str, tenant: str) -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=base, api_key=KEYS[tenant], max_retries=0))
        return made[-1]

    yield make
    for client in made:
        client.close()


def charged(base: str, tenant: str) -> int:
    """What the ledger charged ``tenant``'s budget (beta: output tokens; alpha: input and
    output), once nothing is held."""
    body: dict[str, Any] = httpx.get(
        f"{base}/hardcap/usage", headers={"authorization": f"Bearer {KEYS[tenant]}"}
    ).json()
    assert body["live_reservations"] == 0
    assert all(row["reserved"] == 0 for row in body["budgets"]), body["budgets"]
    (row,) = [r for r in body["budgets"] if r["level"] == "tenant"]
    used: int = row["used"]
    return used


def ask(client: openai.OpenAI, rid: str, **fields: Any) -> Any:
    return client.chat.completions.create(
        model="small",
        messages=[{"role": "user", "content": f"hi rid={rid}"}],
        max_tokens=50,
        **fields,
    )


def read_into(text: list[str], stream: Any) -> None:
    """Read a streamed reply's content into ``text`` as it arrives."""
    for piece in stream:
        text += [choice.delta.content or "" for choice in piece.choices]


def sent_cap(upstream: HostileUpstream) -> int:
    """The output cap the gateway sent the upstream with its (last) request."""
    body = upstream.requests[-1].json()
    cap: int = body.get("max_tokens") or body["max_completion_tokens"]
    return cap


def answer_with(make: Callable[[Request], bytes], *, then_stall: bool = False) -> Script:
    """Read each request on a connection and write ``make(request)``."""

    async def script(conn: Connection) -> None:
        while (request := await conn.read_request()) is not None:
            await conn.send(make(request))
            if then_stall:
                await conn.until_client_closes(30)
                return

    return script


# -- one way of misbehaving at a time -------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_headers_too_large_are_a_502_and_cost_nothing(
    valkey: LocalValkey, sdk: Callable[[str, str], openai.OpenAI], stream: bool
) -> None:
    """Response headers past the limits: the transport refuses them before any reply began
    (no status was read), so the tenant gets a 502 and is charged nothing."""
    huge = head("x-padding: " + "p" * (64 << 10), JSON, "content-length: 2") + b"{}"
    with serving(valkey, answer_with(lambda r: huge)) as (base, upstream):
        with pytest.raises(openai.APIStatusError) as refused:
            ask(sdk(base, "beta"), "beta-1", stream=stream)
        assert refused.value.status_code == 502
        assert refused.value.code == "upstream_error"
        assert len(upstream.requests) == 1
        assert charged(base, "beta") == 0


def test_a_decompression_bomb_is_a_502_charged_up_to_the_cap_it_was_sent(
    valkey: LocalValkey, sdk: Callable[[str, str], openai.OpenAI]
) -> None:
    """510 KiB of gzip inflating to 512 MiB as a whole reply: refused past 32 MiB. The reply
    began with 200, so it was generated: charged as generated, up to the cap it was sent."""
    bomb = gzip_bomb()
    reply = response(bomb, JSON, "content-encoding: gzip")
    with serving(valkey, answer_with(lambda r: reply, then_stall=True)) as (base, upstream):
        with pytest.raises(openai.APIStatusError) as refused:
            ask(sdk(base, "beta"), "beta-1")
        assert refused.value.status_code == 502
        assert refused.value.code == "upstream_error"
        assert charged(base, "beta") == sent_cap(upstream) == 50


def stream_then(ending: str) -> Script:
    """A streamed reply of five pieces of output, then a stall or a reset mid-body."""

    async def script(conn: Connection) -> None:
        request = await conn.read_request()
        assert request is not None
        pieces = [delta(f"reply to rid={request.rid}")] + [delta(" tok") for _ in range(4)]
        await conn.send(SSE_HEAD + b"".join(chunk(p) for p in pieces))
        if ending == "stall":
            await conn.until_client_closes(30)
        else:
            await asyncio.sleep(0.1)
            conn.reset()

    return script


@pytest.mark.parametrize(
    ("ending", "code"), [("stall", "upstream_timeout"), ("reset", "upstream_error")]
)
def test_a_stream_that_stalls_or_resets_mid_body_ends_in_an_error_event_and_is_charged(
    valkey: LocalValkey, sdk: Callable[[str, str], openai.OpenAI], ending: str, code: str
) -> None:
    """The tenant gets what came, then an SSE error event (the SDK raises it); the stream is
    settled as failed: what was counted plus the in-flight estimate, within the hold."""
    with serving(valkey, stream_then(ending)) as (base, upstream):
        got: list[str] = []
        with pytest.raises(openai.APIError) as failed:
            read_into(got, ask(sdk(base, "beta"), "beta-1", stream=True))
        assert failed.value.code == code
        assert "".join(got) == "reply to rid=beta-1 tok tok tok tok"
        assert 5 <= charged(base, "beta") <= sent_cap(upstream)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_1xx_before_the_reply_is_skipped_and_the_reply_charged_as_usual(
    valkey: LocalValkey, sdk: Callable[[str, str], openai.OpenAI], stream: bool
) -> None:
    async def script(conn: Connection) -> None:
        while (request := await conn.read_request()) is not None:
            await conn.send(CONTINUE + EARLY_HINTS)
            await asyncio.sleep(0.02)
            await conn.send(reply_for(request))

    with serving(valkey, script) as (base, _):
        if stream:
            pieces = list(
                ask(
                    sdk(base, "beta"), "beta-1", stream=True, stream_options={"include_usage": True}
                )
            )
            text = "".join(c.delta.content or "" for p in pieces for c in p.choices)
            assert pieces[-1].usage is not None and pieces[-1].usage.completion_tokens == 7
        else:
            text = ask(sdk(base, "beta"), "beta-1").choices[0].message.content
        assert text is not None and text.startswith("reply to rid=beta-1")
        assert charged(base, "beta") == USAGE["beta"][1]


def test_bytes_after_a_reply_never_reach_the_next_tenant(
    valkey: LocalValkey, sdk: Callable[[str, str], openai.OpenAI]
) -> None:
    """Alpha's reply is followed by a whole reply claiming to answer beta's next request, with
    a bill of 999 tokens. Beta's request, next on the same origin, gets its own reply and its
    own charge; alpha is charged its own reply only."""

    async def script(conn: Connection) -> None:
        while (request := await conn.read_request()) is not None:
            stray = stray_reply("beta-1") if tenant_of(request.rid) == "alpha" else b""
            await conn.send(reply_for(request) + stray)

    with serving(valkey, script) as (base, _):
        first = ask(sdk(base, "alpha"), "alpha-1")
        assert first.choices[0].message.content == "reply to rid=alpha-1"
        second = ask(sdk(base, "beta"), "beta-1")
        assert second.choices[0].message.content == "reply to rid=beta-1"
        assert second.usage is not None and second.usage.completion_tokens == USAGE["beta"][1]
        assert charged(base, "beta") == USAGE["beta"][1]
        assert charged(base, "alpha") == sum(USAGE["alpha"])


# -- two tenants at once ---------------------------------------------------------------------------


def hostile_reply(request: Request, n: int) -> list[tuple[bytes, float]]:
    """The n-th way to answer: pieces to write and the pause after each. Each is a reply a
    correct client reads as the request's own: late, 1xx first, in pieces, or followed by a
    whole reply claiming to answer the other tenant."""
    honest = reply_for(request)
    other = "beta" if tenant_of(request.rid) == "alpha" else "alpha"
    ways = [
        [(honest, 0.0)],
        [(b"", 0.001 * (n % 11)), (honest, 0.0)],
        [(CONTINUE + EARLY_HINTS, 0.002), (honest, 0.0)],
        [(honest[:40], 0.002), (honest[40:], 0.0)],
        [(honest + stray_reply(f"{other}-{n}"), 0.0)],
    ]
    return ways[n % len(ways)]


def test_two_tenants_at_once_never_get_or_pay_for_each_others_reply(
    valkey: LocalValkey, sdk: Callable[[str, str], openai.OpenAI]
) -> None:
    """Alpha (whole replies) and beta (streams) at once, round after round, through one
    gateway to one origin whose upstream answers late, with 1xx first, in pieces, or with a
    stray reply after: each gets its own reply, and the ledger charges each exactly its own
    replies' usage."""
    rounds = 12
    count = 0

    async def script(conn: Connection) -> None:
        nonlocal count
        while (request := await conn.read_request()) is not None:
            count += 1
            for data, pause in hostile_reply(request, count):
                if data:
                    await conn.send(data)
                await asyncio.sleep(pause)

    with serving(valkey, script) as (base, upstream):
        alpha, beta = sdk(base, "alpha"), sdk(base, "beta")
        seen: dict[str, str] = {}
        errors: list[BaseException] = []

        def run(tenant: str, i: int) -> None:
            rid = f"{tenant}-{i}"
            try:
                if tenant == "alpha":
                    seen[rid] = ask(alpha, rid).choices[0].message.content or ""
                else:
                    pieces = ask(beta, rid, stream=True)
                    seen[rid] = "".join(c.delta.content or "" for p in pieces for c in p.choices)
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        for i in range(rounds):
            threads = [threading.Thread(target=run, args=(t, i)) for t in ("alpha", "beta")]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            assert not any(thread.is_alive() for thread in threads)
        assert errors == []
        for i in range(rounds):
            assert seen[f"alpha-{i}"] == f"reply to rid=alpha-{i}"
            assert seen[f"beta-{i}"] == f"reply to rid=beta-{i} tok tok tok tok"
        assert charged(base, "alpha") == rounds * sum(USAGE["alpha"])
        assert charged(base, "beta") == rounds * USAGE["beta"][1]
        # Each request reached the upstream exactly once.
        expected = [f"{t}-{i}" for t in ("alpha", "beta") for i in range(rounds)]
        assert sorted(r.rid or "" for r in upstream.requests) == sorted(expected)
