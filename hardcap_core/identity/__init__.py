"""Verified identities from tenants' identity providers: OIDC JWT bearer tokens in place of
static API keys.

:func:`looks_like_jwt` tells a JWT from an ``hc_...`` key without PyJWT;
:class:`JwtVerifier` checks a token against the configured :class:`IssuerSettings` (keys from
each issuer's JWKS, cached) and returns the :class:`Identity` it proves. Importing this package
does not import PyJWT: the first verified token does.
"""

from __future__ import annotations

from hardcap_core.identity.fetch import TransportJwksFetch
from hardcap_core.identity.issuers import Identity, IssuerSettings
from hardcap_core.identity.jwks import JwksFetchFailed
from hardcap_core.identity.peek import MAX_TOKEN_BYTES, looks_like_jwt
from hardcap_core.identity.verifier import JwtVerifier

__all__ = [
    "MAX_TOKEN_BYTES",
    "Identity",
    "IssuerSettings",
    "JwksFetchFailed",
    "JwtVerifier",
    "TransportJwksFetch",
    "looks_like_jwt",
]
