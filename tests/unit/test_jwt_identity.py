"""The JWT verifier against an in-memory issuer: which tokens it accepts, why it refuses the
others (in words a client developer can act on, never quoting the token), and how often it
asks the issuer for its keys.

What a user would notice if each failed: a forged or expired token spending a tenant's budget;
a gateway hammering the company's identity provider; a key rotation locking everyone out until
a restart; an outage of the identity provider turning valid tokens into "invalid" ones.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hardcap_core.errors import InvalidToken, IssuerUnavailable
from hardcap_core.identity import (
    MAX_TOKEN_BYTES,
    Identity,
    IssuerSettings,
    JwksFetchFailed,
    JwtVerifier,
    looks_like_jwt,
)
from hardcap_core.identity.jwks import MIN_FETCH_INTERVAL_S, STALE_IF_ERROR_MAX_S
from tests.jwt_issuer import (
    AUD,
    ISS,
    NOW,
    SigningKey,
    b64,
    claims,
    ec_key,
    ed_key,
    hs256_with_public_key,
    issuer_settings,
    jwks,
    mint,
    raw_token,
    rsa_key,
)

URL = "https://sso.example.test/jwks.json"
RSA = rsa_key("rsa-1")
EC = ec_key("ec-1")


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class Issuer:
    """The issuer's JWKS endpoint, in memory: what it serves, whether it fails, how often it
    was asked, and a gate that holds fetches open (to make them overlap)."""

    def __init__(self, *keys: SigningKey) -> None:
        self.body = jwks(*keys)
        self.failure: str | None = None
        self.fetches = 0
        self.gate: asyncio.Event | None = None

    def serve(self, *keys: SigningKey) -> None:
        self.body = jwks(*keys)

    async def __call__(self, url: str) -> bytes:
        assert url == URL
        self.fetches += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.failure is not None:
            raise JwksFetchFailed(self.failure)
        return self.body


def settings(**overrides: Any) -> IssuerSettings:
    values: dict[str, Any] = {
        "name": "corp-sso",
        "issuer": ISS,
        "jwks_url": URL,
        "audiences": (AUD, "other-app"),
    }
    values.update(overrides)
    return issuer_settings(**values)  # type: ignore[no-any-return]  # the schema fills the rest


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def issuer() -> Issuer:
    return Issuer(RSA, EC)


@pytest.fixture
async def verifier(issuer: Issuer, clock: Clock) -> AsyncIterator[JwtVerifier]:
    v = JwtVerifier([settings()], fetch=issuer, clock=clock)
    yield v
    await v.aclose()


async def refused(verifier: JwtVerifier, token: str, reason: str) -> InvalidToken:
    with pytest.raises(InvalidToken) as caught:
        await verifier.verify(token)
    error = caught.value
    assert reason in error.message
    assert error.status == 401 and error.code == "invalid_token"
    for part in token.split("."):  # no piece of the token is echoed
        assert len(part) < 8 or part not in error.message
    return error


# -- telling a JWT from an API key, without PyJWT -------------------------------------------------


def test_looks_like_jwt_tells_tokens_from_api_keys() -> None:
    token = mint(RSA, claims())
    assert looks_like_jwt(token)
    assert looks_like_jwt(raw_token({"alg": "none"}, claims()))  # a JWT, refused later
    assert looks_like_jwt(token + "A" * MAX_TOKEN_BYTES)  # refused later as too long
    for not_jwt in (
        "hc_" + "A" * 43,
        "a.b.c",
        "e30.e30.",  # {} as header: no alg
        raw_token({"typ": "JWT"}, claims()),
        "!!!.e30.e30",
        "",
    ):
        assert not looks_like_jwt(not_jwt), not_jwt


def test_the_api_key_path_never_imports_pyjwt() -> None:
    code = (
        "import sys; from hardcap_core.identity import looks_like_jwt, JwtVerifier;"
        "assert not looks_like_jwt('hc_abc'); print('jwt' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- settings --------------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["HS256", "HS512", "none", "RS1", "ES256K"])
def test_settings_refuse_symmetric_and_unknown_algorithms(alg: str) -> None:
    with pytest.raises(ValueError, match="not accepted"):
        settings(algorithms=("RS256", alg))


def test_settings_allow_plain_http_only_to_loopback() -> None:
    for url in ("http://127.0.0.1:8080/jwks", "http://[::1]/jwks", "http://localhost/jwks"):
        assert settings(jwks_url=url).jwks_url == url
    for url in ("http://sso.example.test/jwks", "http://10.0.0.5/jwks", "ftp://x/jwks", "/jwks"):
        with pytest.raises(ValueError, match="jwks_url"):
            settings(jwks_url=url)
    with pytest.raises(ValueError, match="audiences"):
        settings(audiences=())


async def test_two_issuers_with_one_iss_are_refused(issuer: Issuer) -> None:
    with pytest.raises(ValueError, match="twice"):
        JwtVerifier([settings(), settings(name="again")], fetch=issuer)


# -- accepted tokens -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", [RSA, EC, rsa_key("ps-1", "PS256", seed="rsa-1"), ed_key("ed-1")], ids=lambda k: k.alg
)
async def test_a_token_from_the_issuer_proves_who_it_names(
    key: SigningKey, issuer: Issuer, verifier: JwtVerifier
) -> None:
    issuer.serve(RSA, EC, key)
    identity = await verifier.verify(mint(key, claims()))
    assert identity == Identity("corp-sso", "alice@example.test", ("team-a", "admins"), NOW + 300)
    assert issuer.fetches == 1


async def test_user_and_group_claims_follow_the_settings(issuer: Issuer, clock: Clock) -> None:
    verifier = JwtVerifier(
        [settings(user_claim="employee_id", group_claim="dept")], fetch=issuer, clock=clock
    )
    token = mint(RSA, claims(employee_id=40213, dept="finance", aud=["x", "other-app"]))
    identity = await verifier.verify(token)
    assert (identity.user, identity.groups) == ("40213", ("finance",))
    assert (await verifier.verify(mint(RSA, claims(employee_id="e7")))).groups == ()
    await refused(verifier, mint(RSA, claims(employee_id=None)), "no 'employee_id' claim")
    await refused(verifier, mint(RSA, claims(employee_id=True)), "'employee_id' claim")
    await refused(verifier, mint(RSA, claims(employee_id="e7", dept=[1])), "'dept' claim")
    await verifier.aclose()


async def test_clock_skew_within_the_leeway_is_tolerated(
    verifier: JwtVerifier, clock: Clock
) -> None:
    token = mint(RSA, claims(iat=NOW + 20, nbf=NOW + 20))  # the issuer's clock runs 20 s ahead
    assert (await verifier.verify(token)).user == "alice@example.test"
    clock.now = NOW + 300 + 29  # expired 29 s ago, 30 s leeway
    assert (await verifier.verify(token)).expires_at == NOW + 300


# -- refused tokens --------------------------------------------------------------------------------


async def test_unknown_issuer_is_refused_before_any_fetch(
    issuer: Issuer, verifier: JwtVerifier
) -> None:
    await refused(verifier, mint(RSA, claims(iss="https://evil.test")), "unknown issuer")
    await refused(verifier, mint(RSA, claims(iss=None)), "no 'iss' claim")
    assert issuer.fetches == 0


async def test_alg_none_and_the_hs256_public_key_confusion_are_refused(
    issuer: Issuer, verifier: JwtVerifier
) -> None:
    forged = hs256_with_public_key(RSA, claims(sub="root"))
    await refused(verifier, forged, "algorithm 'HS256' not accepted")
    await refused(verifier, raw_token({"alg": "none"}, claims()), "algorithm 'none' not accepted")
    assert issuer.fetches == 0
    ps_only = JwtVerifier([settings(algorithms=("PS256",))], fetch=issuer)
    await refused(ps_only, mint(RSA, claims()), "algorithm 'RS256' not accepted")


async def test_a_key_of_another_type_or_curve_never_verifies(
    issuer: Issuer, verifier: JwtVerifier
) -> None:
    # An ES256 token naming the RSA key's id; an RS256 token naming a key published as PS256.
    await refused(verifier, mint(ec_key("x"), claims(), kid="rsa-1"), "does not match")
    issuer.serve(rsa_key("ps-only", "PS256", seed="rsa-1"))
    verifier2 = JwtVerifier([settings()], fetch=issuer)
    await refused(verifier2, mint(rsa_key("ps-only", seed="rsa-1"), claims()), "does not match")


async def test_a_token_signed_by_another_key_with_the_same_kid_is_refused(
    verifier: JwtVerifier,
) -> None:
    impostor = rsa_key("rsa-1", seed="impostor")
    await refused(verifier, mint(impostor, claims(sub="root")), "signature does not verify")
    token = mint(RSA, claims())
    tampered = token.split(".")
    tampered[1] = mint(RSA, claims(sub="root")).split(".")[1]
    await refused(verifier, ".".join(tampered), "signature does not verify")


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"exp": int(NOW) - 31}, "token expired 31 s ago"),
        ({"exp": None}, "no 'exp' claim"),
        ({"exp": "2099-01-01"}, "'exp' claim is not a number"),
        ({"nbf": NOW + 60}, "not valid yet"),
        ({"iat": NOW + 3600}, "issued in the future"),
        ({"aud": "someone-else"}, "audience 'someone-else' not accepted"),
        ({"aud": ["a", "b"]}, "audience ['a', 'b'] not accepted"),
        ({"aud": None}, "no 'aud' claim"),
        ({"sub": None}, "no 'sub' claim"),
        ({"sub": ""}, "'sub' claim (the user) is not a non-empty string"),
        ({"groups": {"a": 1}}, "'groups' claim"),
    ],
)
async def test_claims_are_checked(
    overrides: dict[str, Any], reason: str, verifier: JwtVerifier
) -> None:
    await refused(verifier, mint(RSA, claims(**overrides)), reason)


async def test_malformed_and_oversized_tokens_are_refused_without_a_fetch(
    issuer: Issuer, verifier: JwtVerifier
) -> None:
    huge = mint(RSA, claims(padding="x" * MAX_TOKEN_BYTES))
    await refused(verifier, huge, f"longer than {MAX_TOKEN_BYTES} bytes")
    await refused(verifier, "hc_notajwt", "three dot-separated parts")
    await refused(verifier, "a.b!.c", "base64url")
    header = raw_token({"alg": "RS256", "kid": "rsa-1"}, {}).split(".")[0]
    never_expires = header + "." + b64(b'{"exp": Infinity}') + ".c2ln"
    await refused(verifier, never_expires, "not base64url-encoded JSON")
    await refused(verifier, raw_token({"alg": "RS256", "crit": ["x"]}, claims()), "'crit'")
    assert issuer.fetches == 0


# -- the key cache ---------------------------------------------------------------------------------


async def test_fifty_tokens_with_a_new_kid_make_one_fetch(
    issuer: Issuer, verifier: JwtVerifier, clock: Clock
) -> None:
    await verifier.verify(mint(RSA, claims()))
    clock.now += MIN_FETCH_INTERVAL_S
    rotated = ec_key("ec-2")
    issuer.serve(RSA, rotated)
    issuer.gate = asyncio.Event()
    tokens = [mint(rotated, claims(sub=f"user-{i}")) for i in range(50)]
    pending = asyncio.gather(*(verifier.verify(t) for t in tokens))
    await asyncio.sleep(0.01)
    issuer.gate.set()
    identities = await pending
    assert {i.user for i in identities} == {f"user-{i}" for i in range(50)}
    assert issuer.fetches == 2  # the first token's, and one for the new kid


async def test_forged_kids_refetch_at_most_once_per_interval(
    issuer: Issuer, verifier: JwtVerifier, clock: Clock
) -> None:
    await verifier.verify(mint(RSA, claims()))
    for i in range(20):
        clock.now += 0.4
        await refused(verifier, mint(RSA, claims(), kid=f"forged-{i}"), "not in the issuer's key")
    assert issuer.fetches == 1  # all 20 within 10 s of the first fetch
    clock.now += MIN_FETCH_INTERVAL_S
    await refused(verifier, mint(RSA, claims(), kid="forged-x"), "not in the issuer's key set")
    await refused(verifier, mint(RSA, claims(), kid="forged-y"), "not in the issuer's key set")
    assert issuer.fetches == 2


async def test_key_rotation_needs_no_restart(
    issuer: Issuer, verifier: JwtVerifier, clock: Clock
) -> None:
    await verifier.verify(mint(RSA, claims()))
    new = rsa_key("rsa-2")
    issuer.serve(new)  # the issuer rotates: the old key is withdrawn
    clock.now += MIN_FETCH_INTERVAL_S
    assert (await verifier.verify(mint(new, claims(now=clock.now)))).user == "alice@example.test"
    await refused(verifier, mint(RSA, claims(now=clock.now)), "'rsa-1' is not in the issuer's")
    assert issuer.fetches == 2


async def test_the_key_set_is_refreshed_after_its_max_age(
    issuer: Issuer, verifier: JwtVerifier, clock: Clock
) -> None:
    token = mint(RSA, claims(exp=NOW + 3600))
    await verifier.verify(token)
    clock.now += 599
    await verifier.verify(token)
    assert issuer.fetches == 1
    clock.now += 1
    await verifier.verify(token)
    assert issuer.fetches == 2


async def test_a_failing_issuer_keeps_the_keys_held(
    issuer: Issuer, verifier: JwtVerifier, clock: Clock
) -> None:
    token = mint(RSA, claims(exp=NOW + 48 * 3600))
    await verifier.verify(token)
    issuer.failure = "the key set URL answered HTTP 503"
    clock.now += 601
    assert (await verifier.verify(token)).user == "alice@example.test"  # stale, refetch failed
    assert (await verifier.verify(token)).user == "alice@example.test"
    assert issuer.fetches == 2  # the next attempt waits for the interval
    # A key id it never saw may be a rotation it could not fetch: not the token's fault.
    with pytest.raises(IssuerUnavailable):
        await verifier.verify(mint(ec_key("ec-9"), claims()))
    clock.now = NOW + STALE_IF_ERROR_MAX_S + 1  # a day of failures: the held keys are dropped
    with pytest.raises(IssuerUnavailable):
        await verifier.verify(token)
    issuer.failure = None
    clock.now += MIN_FETCH_INTERVAL_S
    assert (await verifier.verify(token)).user == "alice@example.test"


async def test_no_keys_at_all_is_a_503_and_the_issuer_is_not_hammered(
    issuer: Issuer, verifier: JwtVerifier, clock: Clock
) -> None:
    issuer.failure = "the key set URL did not answer within 5.0 s"
    for _ in range(5):
        with pytest.raises(IssuerUnavailable) as caught:
            await verifier.verify(mint(RSA, claims()))
        clock.now += 1
    error = caught.value
    assert error.status == 503 and error.code == "issuer_unavailable"
    assert "Could not fetch the issuer's keys for 'corp-sso'" in error.message
    assert issuer.fetches == 1
    issuer.failure = None
    clock.now += MIN_FETCH_INTERVAL_S
    assert (await verifier.verify(mint(RSA, claims(now=clock.now)))).issuer == "corp-sso"


@pytest.mark.parametrize(
    "body",
    [
        b"<html>oops</html>",
        b'{"keys": "none"}',
        b'{"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "rsa-1"}]}',  # a symmetric key only
        b'{"keys": [{"kty": "RSA", "use": "enc", "kid": "rsa-1", "n": "AQAB", "e": "AQAB"}]}',
    ],
)
async def test_an_unreadable_key_set_counts_as_a_failed_fetch(
    body: bytes, issuer: Issuer, clock: Clock
) -> None:
    issuer.body = body
    verifier = JwtVerifier([settings()], fetch=issuer, clock=clock)
    with pytest.raises(IssuerUnavailable):
        await verifier.verify(mint(RSA, claims()))
    await verifier.aclose()


async def test_a_token_without_kid_uses_the_only_key(issuer: Issuer, clock: Clock) -> None:
    issuer.serve(EC)
    verifier = JwtVerifier([settings()], fetch=issuer, clock=clock)
    assert (await verifier.verify(mint(EC, claims(), kid=None))).user == "alice@example.test"
    issuer.serve(EC, RSA)
    clock.now += 601
    await refused(verifier, mint(EC, claims(now=clock.now), kid=None), "names no key ('kid')")
