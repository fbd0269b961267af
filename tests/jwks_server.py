"""An identity provider's key set URL on 127.0.0.1 for end-to-end tests: the JWKS a gateway
fetches, which a test rotates mid-run, and how often it was fetched.

Keys and tokens come from :mod:`tests.jwt_issuer`; this is only the HTTP side, served by a
uvicorn thread like the mock upstream.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from hardcap_core.local.servers import ThreadServer
from hardcap_core.local.valkey import free_port
from tests.jwt_issuer import SigningKey, jwks


class JwksServer:
    """Serves ``GET /jwks.json``: the public half of :attr:`keys`, as the issuer publishes it
    now. ``fetches`` counts the GETs, so a test sees when the gateway fetched again."""

    def __init__(self, *keys: SigningKey) -> None:
        self.keys = keys
        self.fetches = 0
        self.app = Starlette(routes=[Route("/jwks.json", self._serve, methods=["GET"])])
        self.url = ""

    def publish(self, *keys: SigningKey) -> None:
        """The issuer's key set from now on (a rotation: new keys in, withdrawn ones out)."""
        self.keys = keys

    async def _serve(self, request: Request) -> Response:
        self.fetches += 1
        return Response(jwks(*self.keys), media_type="application/json")


@contextmanager
def jwks_server(*keys: SigningKey) -> Iterator[JwksServer]:
    """A :class:`JwksServer` publishing ``keys`` on a free port; ``url`` is its key set URL."""
    server = JwksServer(*keys)
    thread = ThreadServer(server.app, free_port()).start()
    server.url = f"{thread.url}/jwks.json"
    try:
        yield server
    finally:
        thread.stop()
