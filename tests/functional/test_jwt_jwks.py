"""The JWT verifier against a real JWKS endpoint on 127.0.0.1, over the gateway's own HTTP client
(``make_transport()``): keys generated in the test (RSA and EC P-256), rotated mid-test, and
an endpoint that fails in each way a real one does.

What a user would notice if each failed: SSO tokens refused after the identity provider
rotates its keys; valid tokens refused (or the gateway stalling) while the provider's key
endpoint is slow, down or serving garbage.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from hardcap_core.errors import InvalidToken, IssuerUnavailable
from hardcap_core.identity import JwtVerifier, TransportJwksFetch
from hardcap_core.identity.jwks import MAX_JWKS_BYTES, MIN_FETCH_INTERVAL_S
from hardcap_core.local.servers import ThreadServer
from hardcap_core.local.valkey import free_port
from hardcap_core.providers.http import make_transport
from hardcap_core.providers.transport import Transport
from tests.jwt_issuer import AUD, ISS, claims, ec_key, issuer_settings, jwks, mint, rsa_key

RSA = rsa_key("rsa-1")
EC = ec_key("ec-1")
TIMEOUT_S = 0.5


class JwksEndpoint:
    """The identity provider's key set URL: GET only (anything else is a 405, which the
    verifier would count as a failure), with a status, a delay and a body set by the test."""

    def __init__(self) -> None:
        self.reset()
        self.app = Starlette(routes=[Route("/jwks.json", self.serve, methods=["GET"])])

    def reset(self) -> None:
        self.body = jwks(RSA, EC)
        self.status = 200
        self.delay_s = 0.0
        self.requests: list[str] = []

    async def serve(self, request: Request) -> Response:
        self.requests.append(request.method)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return Response(self.body, self.status, media_type="application/json")


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def endpoint() -> Iterator[tuple[JwksEndpoint, str]]:
    jwks_endpoint = JwksEndpoint()
    server = ThreadServer(jwks_endpoint.app, free_port()).start()
    yield jwks_endpoint, f"{server.url}/jwks.json"
    server.stop()


@pytest.fixture
async def transport() -> AsyncIterator[Transport]:
    t = make_transport()
    yield t
    await t.aclose()


def make_verifier(url: str, transport: Transport, clock: Clock) -> JwtVerifier:
    issuer = issuer_settings(name="corp-sso", issuer=ISS, jwks_url=url, audiences=(AUD,))
    return JwtVerifier([issuer], TransportJwksFetch(transport, timeout_s=TIMEOUT_S), clock)


async def test_keys_are_fetched_over_http_and_rotate_without_restart(
    endpoint: tuple[JwksEndpoint, str], transport: Transport
) -> None:
    server, url = endpoint
    server.reset()
    clock = Clock()
    verifier = make_verifier(url, transport, clock)
    assert (await verifier.verify(mint(RSA, claims(clock.now)))).user == "alice@example.test"
    assert (await verifier.verify(mint(EC, claims(clock.now)))).groups == ("team-a", "admins")
    assert server.requests == ["GET"]

    rotated = ec_key("ec-2")
    server.body = jwks(RSA, rotated)  # a new key, a new kid, mid-test
    clock.now += MIN_FETCH_INTERVAL_S
    token = mint(rotated, claims(clock.now, sub="bob"))
    assert (await verifier.verify(token)).user == "bob"
    assert server.requests == ["GET", "GET"]

    server.body = jwks(rotated)  # RSA withdrawn: gone from the cache at the next refresh
    clock.now += 600
    with pytest.raises(InvalidToken, match="'rsa-1' is not in the issuer's key set"):
        await verifier.verify(mint(RSA, claims(clock.now)))
    assert (await verifier.verify(mint(rotated, claims(clock.now)))).user == "alice@example.test"
    assert len(server.requests) == 3
    await verifier.aclose()


FAILURES = {
    "5xx": {"status": 503},
    "not json": {"body": b"<html>maintenance</html>"},
    # A usable key set, padded past the cap: read whole, it would verify the token.
    "too big": {"body": json.dumps({"keys": [RSA.jwk()], "pad": "x" * MAX_JWKS_BYTES}).encode()},
    # The keys arrive, but after the fetch's deadline: waited for, the cold verifier would pass.
    "timeout": {"delay_s": TIMEOUT_S * 3},
}


@pytest.mark.parametrize("failure", list(FAILURES))
async def test_a_failing_key_set_url_keeps_the_keys_held_else_503(
    failure: str, endpoint: tuple[JwksEndpoint, str], transport: Transport
) -> None:
    server, url = endpoint
    server.reset()
    clock = Clock()
    warm = make_verifier(url, transport, clock)
    token = mint(RSA, claims(clock.now, exp=int(clock.now) + 3600))
    await warm.verify(token)

    for name, value in FAILURES[failure].items():
        setattr(server, name, value)
    clock.now += 601  # past the max age: the warm verifier refetches, and fails
    assert (await warm.verify(token)).user == "alice@example.test"
    cold = make_verifier(url, transport, clock)
    with pytest.raises(IssuerUnavailable, match="Could not fetch the issuer's keys"):
        await cold.verify(token)
    assert len(server.requests) == 3
    await warm.aclose()
    await cold.aclose()


async def test_an_unreachable_key_set_url_is_a_503(transport: Transport) -> None:
    clock = Clock()
    verifier = make_verifier(f"http://127.0.0.1:{free_port()}/jwks.json", transport, clock)
    with pytest.raises(IssuerUnavailable):
        await verifier.verify(mint(RSA, claims(clock.now)))
    await verifier.aclose()
