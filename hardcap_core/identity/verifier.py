"""Verifying a bearer JWT from a tenant's identity provider: who it names, or why it is refused.

The one boundary where PyJWT's errors, and the key cache's, become the gateway's:
:class:`~hardcap_core.errors.InvalidToken` (401, the reason in words) or
:class:`~hardcap_core.errors.IssuerUnavailable` (503, the issuer's keys could not be fetched).

The order of the checks is the order of their cost, and nothing is fetched for a token that
can be refused without keys: size, shape, issuer (by the unverified ``iss``), algorithm, key id;
then the keys (cached); then PyJWT: signature, ``iss``, ``aud``; then the token's times, by
this verifier's clock (the one the key cache ages by, so tests move both), and the claims that
name the user and the groups.

PyJWT is imported with the first token verified, never on the API-key path (cold start).
Verifying a signature takes microseconds, so it runs inline on the event loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hardcap_core.errors import InvalidToken, IssuerUnavailable
from hardcap_core.identity.fetch import TransportJwksFetch
from hardcap_core.identity.issuers import Identity, IssuerSettings
from hardcap_core.identity.jwks import IssuerKeys, Jwk, JwksFetch, KeysUnavailable
from hardcap_core.identity.peek import Malformed, unverified
from hardcap_core.logs import logger
from hardcap_core.providers.transport import Transport

# How much of a value from a refused token a message quotes (an audience, an issuer, a key id).
SHOWN_CHARS = 64


class _Issuer:
    def __init__(self, settings: IssuerSettings, keys: IssuerKeys) -> None:
        self.settings = settings
        self.keys = keys


class JwtVerifier:
    """Verifies tokens from the configured issuers; one per process (it holds their keys).

    ``fetch``: how key sets are fetched; the gateway passes
    ``TransportJwksFetch(its transport)`` so key sets share its HTTP client. Without one, the
    verifier makes a transport of its own and closes it in :meth:`aclose`.
    """

    def __init__(
        self,
        issuers: Sequence[IssuerSettings],
        fetch: JwksFetch | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._own_transport: Transport | None = None
        if fetch is None:
            from hardcap_core.providers.http import make_transport

            self._own_transport = make_transport()
            fetch = TransportJwksFetch(self._own_transport)
        self._clock = clock
        self._issuers: dict[str, _Issuer] = {}
        names: set[str] = set()
        for s in issuers:
            if s.issuer in self._issuers or s.name in names:
                raise ValueError(f"issuer {s.name!r}: its name or its iss is configured twice")
            names.add(s.name)
            keys = IssuerKeys(s.jwks_url, s.jwks_max_age_seconds, fetch, clock)
            self._issuers[s.issuer] = _Issuer(s, keys)

    async def verify(self, token: str) -> Identity:
        """The identity ``token`` proves. Raises :class:`InvalidToken` (the reason in its
        message) or :class:`IssuerUnavailable` (the issuer's keys could not be fetched)."""
        try:
            header, peeked = unverified(token)
        except Malformed as e:
            raise _refused(str(e)) from None
        iss = peeked.get("iss")
        if not isinstance(iss, str):
            raise _refused("the token has no 'iss' claim (its issuer)")
        issuer = self._issuers.get(iss)
        if issuer is None:
            raise _refused(f"unknown issuer {_shown(iss)}")
        settings = issuer.settings
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in settings.algorithms:
            accepted = ", ".join(settings.algorithms)
            raise _refused(f"algorithm {_shown(alg)} not accepted (accepted: {accepted})")
        if "crit" in header:
            # RFC 7515 §4.1.11: extensions marked critical must be understood; none are here.
            raise _refused("its header marks extensions critical ('crit') the gateway ignores")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise _refused("its 'kid' header is not a string")
        keys = await self._keys(issuer, kid)
        fitting = [k for k in keys if k.fits(alg)]
        if not fitting:
            raise _refused(f"algorithm {alg} does not match the issuer's key {_shown(kid)}")
        claims = _decode(token, settings, alg, fitting, peeked)
        return self._identity(settings, claims)

    async def _keys(self, issuer: _Issuer, kid: str | None) -> tuple[Jwk, ...]:
        name = issuer.settings.name
        try:
            keys = await issuer.keys.named(kid)
        except KeysUnavailable as e:
            logger.warning("jwks unavailable", extra={"issuer": name, "detail": str(e)})
            raise IssuerUnavailable(
                f"Could not fetch the issuer's keys for '{name}' to verify the token; retry later."
            ) from None
        if not keys:
            if kid is None:
                raise _refused("it names no key ('kid') and the issuer publishes several")
            raise _refused(f"key id {_shown(kid)} is not in the issuer's key set")
        return keys

    def _identity(self, settings: IssuerSettings, claims: Mapping[str, Any]) -> Identity:
        now = self._clock()
        leeway = settings.leeway_seconds
        exp = _time_claim(claims, "exp")
        if exp is None:
            raise _refused("the token has no 'exp' claim (an expiry is required)")
        if exp <= now - leeway:
            raise _refused(f"token expired {now - exp:.0f} s ago")
        nbf = _time_claim(claims, "nbf")
        if nbf is not None and nbf > now + leeway:
            raise _refused(f"token not valid yet ('nbf' is {nbf - now:.0f} s ahead)")
        iat = _time_claim(claims, "iat")
        if iat is not None and iat > now + leeway:
            raise _refused(f"token issued in the future ('iat' is {iat - now:.0f} s ahead)")
        return Identity(
            issuer=settings.name,
            user=_user(claims, settings.user_claim),
            groups=_groups(claims, settings.group_claim),
            expires_at=exp,
        )

    async def aclose(self) -> None:
        for issuer in self._issuers.values():
            await issuer.keys.aclose()
        if self._own_transport is not None:
            await self._own_transport.aclose()


def _decode(
    token: str,
    settings: IssuerSettings,
    alg: str,
    keys: Sequence[Jwk],
    peeked: Mapping[str, Any],
) -> dict[str, Any]:
    """The verified claims: PyJWT checks the signature with each fitting key (an issuer may
    publish a key id twice), then ``iss`` and ``aud``."""
    import jwt
    from jwt.types import Options

    options: Options = {
        # The token's times are checked by the verifier's clock (see the module's docstring).
        "verify_exp": False,
        "verify_nbf": False,
        "verify_iat": False,
        # The user claim has its own rule (numbers allowed); see _user.
        "verify_sub": False,
        "require": ["iss", "aud"],
        "enforce_minimum_key_length": True,
    }
    reason = "signature does not verify"
    for key in keys:
        try:
            verifier = key.built.get(alg)
            if verifier is None:
                verifier = key.built[alg] = jwt.PyJWK(dict(key.data), algorithm=alg)
            claims: dict[str, Any] = jwt.decode(
                token,
                verifier,
                algorithms=[alg],
                options=options,
                audience=list(settings.audiences),
                issuer=settings.issuer,
            )
            return claims
        except jwt.InvalidSignatureError:
            continue  # another key with the same id may verify it
        except (jwt.InvalidKeyError, jwt.PyJWKError) as e:
            logger.warning(
                "jwks key unusable",
                extra={"issuer": settings.name, "kid": key.kid, "detail": str(e)},
            )
            reason = f"the issuer's key {_shown(key.kid)} cannot verify {alg}"
        except jwt.InvalidTokenError as e:
            raise _refused(_claims_reason(e, settings, peeked)) from None
    raise _refused(reason)


def _claims_reason(e: Exception, settings: IssuerSettings, peeked: Mapping[str, Any]) -> str:
    """What PyJWT found wrong with a token whose signature verified, in the client's words."""
    import jwt

    if isinstance(e, jwt.MissingRequiredClaimError):
        return f"the token has no {e.claim!r} claim"
    if isinstance(e, jwt.InvalidAudienceError):
        accepted = ", ".join(repr(a) for a in settings.audiences)
        return f"audience {_shown(peeked.get('aud'))} not accepted (accepted: {accepted})"
    if isinstance(e, jwt.InvalidIssuerError):
        return f"issuer {_shown(peeked.get('iss'))} not accepted"
    if isinstance(e, jwt.DecodeError):
        return "the token is malformed"
    return f"the token was refused: {e}"


def _time_claim(claims: Mapping[str, Any], name: str) -> float | None:
    """A NumericDate claim (RFC 7519 §2): a finite JSON number, or absent."""
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _refused(f"its {name!r} claim is not a number of seconds")
    return float(value)


def _user(claims: Mapping[str, Any], claim: str) -> str:
    value = claims.get(claim)
    if value is None:
        raise _refused(f"the token has no {claim!r} claim (it names the user)")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return str(int(value)) if value.is_integer() else str(value)
    if not isinstance(value, str) or not value:
        raise _refused(f"its {claim!r} claim (the user) is not a non-empty string")
    return value


def _groups(claims: Mapping[str, Any], claim: str) -> tuple[str, ...]:
    value = claims.get(claim)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise _refused(f"its {claim!r} claim (the groups) is not a string or a list of strings")


def _shown(value: object) -> str:
    """A value from the token, quoted and cut short: a message never carries much of it."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > SHOWN_CHARS:
        text = text[:SHOWN_CHARS] + "..."
    return repr(text) if isinstance(value, str) else text


def _refused(reason: str) -> InvalidToken:
    return InvalidToken(f"Invalid bearer token: {reason}.")
