"""Fetching a key set over the gateway's own HTTP client (:mod:`hardcap_core.providers
.aiohttp_transport`): its pool, TLS context, proxies and error translation; no second client.

The transport's errors arrive already translated (:class:`~hardcap_core.providers.transport
.TransportError`); here they, a status other than 200 and a body past
:data:`~hardcap_core.identity.jwks.MAX_JWKS_BYTES` become :class:`JwksFetchFailed`, which the
key cache turns into "keep the keys held" or, with none, a 503.
"""

from __future__ import annotations

import asyncio

from hardcap_core.identity.jwks import MAX_JWKS_BYTES, JwksFetchFailed
from hardcap_core.providers.transport import Transport, TransportError, UpstreamRequest

# A whole key-set fetch, connection included: tokens wait for it, so it is short.
JWKS_TIMEOUT_S = 5.0


class TransportJwksFetch:
    """A :class:`~hardcap_core.identity.jwks.JwksFetch` over a :class:`Transport`: a GET,
    redirects not followed, one deadline for the whole reply, the body read as a stream and
    dropped (the connection closed) once it passes ``max_bytes``."""

    def __init__(
        self,
        transport: Transport,
        *,
        timeout_s: float = JWKS_TIMEOUT_S,
        max_bytes: int = MAX_JWKS_BYTES,
    ) -> None:
        self._transport = transport
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes

    async def __call__(self, url: str) -> bytes:
        request = UpstreamRequest(
            url,
            {"accept": "application/jwk-set+json, application/json"},
            b"",
            self.timeout_s,
            method="GET",
        )
        body = bytearray()
        try:
            async with asyncio.timeout(self.timeout_s), self._transport.stream(request) as reply:
                if reply.status != 200:
                    raise JwksFetchFailed(f"the key set URL answered HTTP {reply.status}")
                async for piece in reply.reads():
                    body += piece
                    if len(body) > self.max_bytes:
                        raise JwksFetchFailed(f"the key set is larger than {self.max_bytes} bytes")
        except TimeoutError as e:
            raise JwksFetchFailed(
                f"the key set URL did not answer within {self.timeout_s} s"
            ) from e
        except TransportError as e:
            raise JwksFetchFailed(f"the key set URL failed: {e}") from e
        return bytes(body)
