"""Per-user budgets end to end: users of verified OIDC tokens and end users a request names,
with the official `openai` and `anthropic` SDKs as clients, against the mock upstream's ground
truth and a key set served on 127.0.0.1 (:mod:`tests.jwks_server`).

What a user would notice if each failed: one engineer's runaway script spends the whole team's
budget (users not separate); a forged, expired or misdirected token gets served (and billed);
SSO tokens stop working when the identity provider rotates its keys until someone restarts the
gateway; a burst of one user's streams overshoots that user's cap; an app's end user spends
another end user's allowance, or a request without one slips past a tenant that requires it;
the usage records cannot say who spent.

The mock counts its ground truth per request ``user`` (the end user, or for a token's user a
tag this test sends): for a token, the budget's user is the token's, whatever ``user`` says.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis

from hardcap_core.auth import hash_key
from hardcap_core.budgets import Level, LevelKind
from hardcap_core.identity.jwks import MIN_FETCH_INTERVAL_S
from hardcap_core.ledger.keys import Keyspace
from hardcap_core.local.valkey import LocalValkey
from hardcap_core.rollup.records import RecordKind, UsageRecord, parse_entry
from tests.jwks_server import JwksServer, jwks_server
from tests.jwt_issuer import (
    AUD,
    ISS,
    SigningKey,
    claims,
    hs256_with_public_key,
    mint,
    raw_token,
    rsa_key,
)
from tests.stack import Mock, anthropic_client, config_data, gateway_thread
from tests.stack import openai_client as client  # a key or a token as its api_key

SSO = rsa_key("corp-1")
ROTATED = rsa_key("corp-2")
FORGER = rsa_key("corp-1", seed="mallory")  # the issuer's key id, another private key
APP_KEY = "sk-test-app"  # a tenant budgeting each end user of its app (end_users: required)
OPT_KEY = "sk-test-opt"  # the same with end_users: optional
SAY = "Say something about budgets."


@pytest.fixture
def issuer() -> Iterator[JwksServer]:
    """The identity provider's key set URL, publishing :data:`SSO`."""
    with jwks_server(SSO) as server:
        yield server


def users_config(
    mock: Mock, valkey: LocalValkey, jwks_url: str, *, user_output: int = 200, end_user: int = 100
) -> dict[str, Any]:
    """The test config plus an issuer and three tenants with a ``users:`` template: corp
    (tokens of group ml, ``user_output`` output tokens a day per user), app (a key; each end
    user ``end_user`` output tokens a day, required) and opt (the same, optional)."""

    def users(limit: int) -> dict[str, Any]:
        return {"budgets": [{"dimension": "output_tokens", "limit": limit, "window": "day"}]}

    tenant_budget = [{"dimension": "total_tokens", "limit": 1_000_000, "window": "day"}]
    data = config_data(mock.url, valkey.url)
    data["issuers"] = [
        {"name": "corp-sso", "issuer": ISS, "jwks_url": jwks_url, "audiences": [AUD]}
    ]
    data["tenants"] += [
        {
            "id": "corp",
            "budgets": tenant_budget,
            "jwt": {"issuer": "corp-sso", "groups": ["ml"]},
            "users": users(user_output),
        },
        {
            "id": "app",
            "budgets": tenant_budget,
            "keys": [{"id": "app-k", "hash": hash_key(APP_KEY)}],
            "users": users(end_user),
            "end_users": "required",
        },
        {
            "id": "opt",
            "budgets": tenant_budget,
            "keys": [{"id": "opt-k", "hash": hash_key(OPT_KEY)}],
            "users": users(end_user),
            "end_users": "optional",
        },
    ]
    return data


def token(user: str, *, key: SigningKey = SSO, **overrides: Any) -> str:
    """A token of ``user`` in group ml, valid for five minutes from now."""
    return mint(key, claims(time.time(), sub=user, groups=["ml"], **overrides))


def ask(tokens: int, pace_ms: float = 0.5) -> list[Any]:
    """A prompt whose answer the mock makes ``tokens`` long, one token every ``pace_ms``."""
    return [{"role": "user", "content": f"{SAY} [mock:tokens={tokens}] [mock:pace_ms={pace_ms}]"}]


def stream(c: openai.OpenAI, tokens: int, tag: str, max_tokens: int = 100) -> list[Any]:
    """The chunks of a streamed completion (``tag``: the mock's ground-truth name for it)."""
    return list(
        c.chat.completions.create(
            model="small", messages=ask(tokens), max_tokens=max_tokens, stream=True, user=tag
        )
    )


def usage(base: str, credential: str) -> dict[str, Any]:
    """``GET /v1/hardcap/usage`` as the credential's holder sees it."""
    r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {credential}"})
    r.raise_for_status()
    body: dict[str, Any] = r.json()
    return body


def user_row(body: dict[str, Any]) -> dict[str, Any]:
    """The usage body's one user-level budget."""
    rows: list[dict[str, Any]] = [b for b in body["budgets"] if b["level"] == "user"]
    (row,) = rows
    return row


def records(valkey: LocalValkey, tenant: str) -> list[tuple[str, UsageRecord]]:
    """The usage stream of ``tenant``'s hierarchy (a tenant without an org is its root): each
    entry's raw packed field and the record the rollup parses from it."""
    stream_key = Keyspace().usage_stream(Level(LevelKind.TENANT, tenant))
    with redis.Redis.from_url(valkey.url) as r:
        entries = r.xrange(stream_key)
    return [(fields[b"r"].decode(), parse_entry(i, fields)) for i, fields in entries]


def truth_tenants(mock: Mock) -> dict[str, Any]:
    tenants: dict[str, Any] = mock.http.get("/mock/ground-truth").json()["tenants"]
    return tenants


def test_a_tokens_user_has_their_own_budget(
    mock: Mock, flushed: LocalValkey, issuer: JwksServer
) -> None:
    with gateway_thread(users_config(mock, flushed, issuer.url)) as base:
        alice = token("alice")
        chunks = stream(client(base, alice), 30, tag="truth-alice")
        assert chunks[-1].choices[0].finish_reason == "stop"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        truth = mock.truth("truth-alice")
        assert truth["completion_tokens"] == 30

        seen = usage(base, alice)
        assert (seen["tenant"], seen["key"]) == ("corp", "jwt.corp-sso")
        row = user_row(seen)
        # The token's user, not the body's `user`: a token cannot name someone else.
        assert (row["id"], row["dimension"], row["window"]) == ("corp~alice", "output_tokens", "d")
        assert (row["limit"], row["used"], row["reserved"]) == (200, 30, 0)
        assert row["remaining"] == 170

        bob = token("bob")
        row = user_row(usage(base, bob))
        assert (row["id"], row["used"], row["remaining"]) == ("corp~bob", 0, 200)
        chunks = stream(client(base, bob), 20, tag="truth-bob")
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert mock.truth("truth-bob")["completion_tokens"] == 20
        assert user_row(usage(base, bob))["used"] == 20
        assert user_row(usage(base, alice))["used"] == 30  # bob's spend is not alice's
        # Both count for their tenant, as the provider billed them.
        tenant = {(b["level"], b["dimension"]): b for b in usage(base, bob)["budgets"]}
        spent = mock.truth("truth-alice")["total_tokens"] + mock.truth("truth-bob")["total_tokens"]
        assert tenant[("tenant", "total_tokens")]["used"] == spent


REFUSED: dict[str, tuple[Callable[[], str], str]] = {
    "forged": (
        lambda: token("alice", key=FORGER),
        "signature does not verify",
    ),
    "expired": (
        lambda: token("alice", iat=int(time.time()) - 600, exp=int(time.time()) - 120),
        "token expired",
    ),
    "wrong audience": (
        lambda: token("alice", aud="another-app"),
        "audience 'another-app' not accepted",
    ),
    "HS256 with the public key": (
        lambda: hs256_with_public_key(SSO, claims(time.time(), sub="alice", groups=["ml"])),
        "algorithm 'HS256' not accepted",
    ),
    "none": (
        lambda: raw_token(
            {"alg": "none", "typ": "JWT", "kid": SSO.kid},
            claims(time.time(), sub="alice", groups=["ml"]),
        ),
        "algorithm 'none' not accepted",
    ),
}


def test_bad_tokens_are_refused_saying_why_and_nothing_is_charged(
    mock: Mock, flushed: LocalValkey, issuer: JwksServer
) -> None:
    with gateway_thread(users_config(mock, flushed, issuer.url)) as base:
        for name, (make, reason) in REFUSED.items():
            with pytest.raises(openai.AuthenticationError) as refused:
                stream(client(base, make()), 30, tag="truth-alice")
            assert refused.value.status_code == 401, name
            body: Any = refused.value.body
            assert body["code"] == "invalid_token", name
            assert reason in body["message"], (name, body["message"])

        outsider = mint(SSO, claims(time.time(), sub="eve", groups=["finance"]))
        with pytest.raises(openai.PermissionDeniedError) as denied:
            stream(client(base, outsider), 30, tag="truth-alice")
        assert denied.value.status_code == 403
        assert "No tenant accepts this token's groups" in denied.value.message

        assert truth_tenants(mock) == {}  # the upstream was never called
        row = user_row(usage(base, token("alice")))
        assert (row["used"], row["reserved"]) == (0, 0)
        assert records(flushed, "corp") == []  # not even a refusal record: never admitted


@pytest.mark.slow
def test_a_key_rotated_at_the_issuer_works_without_a_restart(
    mock: Mock, flushed: LocalValkey, issuer: JwksServer
) -> None:
    with gateway_thread(users_config(mock, flushed, issuer.url)) as base:
        assert stream(client(base, token("alice")), 10, tag="truth-alice")[-1].choices
        fetched_by = time.time()
        assert issuer.fetches == 1

        issuer.publish(ROTATED)  # the new key in, the old one withdrawn
        # The gateway asks the issuer at most once per MIN_FETCH_INTERVAL_S (a flood of
        # unknown key ids cannot hammer it); a rotation comes long after the last fetch.
        time.sleep(max(0.0, fetched_by + MIN_FETCH_INTERVAL_S + 0.5 - time.time()))
        chunks = stream(client(base, token("alice", key=ROTATED)), 10, tag="truth-alice")
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert issuer.fetches == 2

        with pytest.raises(openai.AuthenticationError) as refused:
            stream(client(base, token("alice")), 10, tag="truth-alice")
        assert "'corp-1' is not in the issuer's key set" in refused.value.message
        assert mock.truth("truth-alice")["completion_tokens"] == 20


async def test_concurrent_streams_of_one_user_hold_the_users_cap(
    mock: Mock, flushed: LocalValkey, issuer: JwksServer
) -> None:
    cap = 300
    data = users_config(mock, flushed, issuer.url, user_output=cap)
    with gateway_thread(data) as base:
        carol, dave = token("carol"), token("dave")
        sdks = {
            who: openai.AsyncOpenAI(base_url=base, api_key=credential, max_retries=0)
            for who, credential in (("carol", carol), ("dave", dave))
        }

        async def one(who: str) -> str:
            """How one 60-token stream ended: its last finish reason, or 429."""
            try:
                chunks = await sdks[who].chat.completions.create(
                    model="small",
                    messages=ask(60, pace_ms=5),
                    max_tokens=100,
                    stream=True,
                    user=f"truth-{who}",
                )
                finishes = [c.choices[0].finish_reason async for c in chunks if c.choices]
            except openai.RateLimitError:
                return "429"
            return str(finishes[-1])

        try:
            # Dave's one stream runs in the middle of carol's burst, in the same tenant.
            *ends, dave_end = await asyncio.gather(*(one("carol") for _ in range(20)), one("dave"))
        finally:
            for sdk in sdks.values():
                await sdk.close()
        truth = mock.truth("truth-carol")
        row = user_row(usage(base, carol))
        assert set(ends) <= {"stop", "length", "429"}, ends
        assert ends.count("stop") <= cap // 60  # 20 x 60 tokens do not fit in 300
        assert ends.count("429") + ends.count("length") >= 20 - cap // 60, ends
        assert truth["in_flight"] == 0
        assert 0 < truth["completion_tokens"] <= cap, (truth, ends)
        assert row["reserved"] == 0
        assert truth["completion_tokens"] <= row["used"] <= cap

        assert dave_end == "stop"
        assert mock.truth("truth-dave")["completion_tokens"] == 60
        assert user_row(usage(base, dave))["used"] == 60


def test_end_users_each_have_a_budget_and_must_be_named(
    mock: Mock, flushed: LocalValkey, issuer: JwksServer
) -> None:
    with gateway_thread(users_config(mock, flushed, issuer.url, end_user=100)) as base:
        app = client(base, APP_KEY)
        with pytest.raises(openai.BadRequestError) as missing:
            app.chat.completions.create(model="small", messages=ask(10), max_tokens=50)
        body: Any = missing.value.body
        assert body["param"] == "user"
        assert "'user' is required" in body["message"]

        claude = anthropic_client(base, APP_KEY)
        with pytest.raises(anthropic.BadRequestError) as unnamed:
            claude.messages.create(model="small", max_tokens=50, messages=ask(10))
        assert "'metadata.user_id' is required" in unnamed.value.message
        assert truth_tenants(mock) == {}

        # u1 spends its 100 output tokens; the next request of u1 is refused, in either format.
        ends = []
        for _ in range(6):
            try:
                reply = app.chat.completions.create(
                    model="small", messages=ask(40), max_tokens=50, user="u1"
                )
            except openai.RateLimitError:
                ends.append("429")
                break
            ends.append(str(reply.choices[0].finish_reason))
        assert ends[-1] == "429" and len(ends) >= 3, ends  # 40 + 40 fit, then the cap bites
        assert mock.truth("u1")["completion_tokens"] <= 100
        with pytest.raises(anthropic.RateLimitError):
            claude.messages.create(
                model="small", max_tokens=50, messages=ask(10), metadata={"user_id": "u1"}
            )

        # ... while u2 still has all of theirs.
        message = claude.messages.create(
            model="small", max_tokens=50, messages=ask(30), metadata={"user_id": "u2"}
        )
        assert message.stop_reason == "end_turn"
        assert message.usage.output_tokens == mock.truth("u2")["completion_tokens"] == 30
        reply = app.chat.completions.create(
            model="small", messages=ask(30), max_tokens=50, user="u2"
        )
        assert reply.choices[0].finish_reason == "stop"

        # optional: a request without an end user is served (no user level).
        served = client(base, OPT_KEY).chat.completions.create(
            model="small", messages=ask(10), max_tokens=50
        )
        assert served.choices[0].finish_reason == "stop"
        assert mock.truth("anonymous")["completion_tokens"] == 10


def test_usage_records_carry_the_user(mock: Mock, flushed: LocalValkey, issuer: JwksServer) -> None:
    odd = "Jane Doe <jane@example.test>"  # not a plain id: the level is named by its digest
    with gateway_thread(users_config(mock, flushed, issuer.url)) as base:
        stream(client(base, token("alice")), 30, tag="truth-alice")
        app = client(base, APP_KEY)
        app.chat.completions.create(model="small", messages=ask(20), max_tokens=50, user="u1")
        app.chat.completions.create(model="small", messages=ask(5), max_tokens=50, user=odd)
        opt = client(base, OPT_KEY)
        opt.chat.completions.create(model="small", messages=ask(10), max_tokens=50)
        opt.chat.completions.create(model="small", messages=ask(15), max_tokens=50, user="u9")

    ((raw, alice),) = records(flushed, "corp")
    assert raw.startswith("3,")  # format 3: a record with a user
    assert (alice.kind, alice.user) == (RecordKind.SETTLE, "corp~alice")
    assert alice.key_id == "jwt.corp-sso"
    assert alice.output_tokens == mock.truth("truth-alice")["completion_tokens"] == 30

    digest = hashlib.sha256(odd.encode()).hexdigest()[:40]
    app_records = records(flushed, "app")
    assert [(r.user, r.output_tokens) for _, r in app_records] == [
        ("app~u1", 20),
        (f"app~h.{digest}", 5),
    ]
    assert all(raw.startswith("3,") for raw, _ in app_records)

    (raw_none, none), (_, named) = records(flushed, "opt")
    assert raw_none.startswith("2,") and none.user == ""  # no user: format 2, as before
    assert (named.user, named.output_tokens) == ("opt~u9", 15)
