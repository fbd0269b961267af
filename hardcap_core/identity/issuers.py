"""Who may sign a bearer JWT (:class:`IssuerSettings`) and what a verified one says
(:class:`Identity`).

Only asymmetric algorithms: a gateway that accepts HS* verifies with a secret it shares with the
issuer, and the classic confusion attack (a token "signed" with HS256 using the issuer's *public*
key as the HMAC secret) is only possible where HS* and public keys meet. Refusing HS* and
``none`` when the settings are built means no configuration can reopen it.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from urllib.parse import urlsplit

# Each accepted algorithm and the key it needs: (JWK ``kty``, ``crv`` or None for any). A
# token's ``alg`` must match the JWK it names, so an RSA key never verifies an EC signature and
# an EC key of one curve never verifies another curve's algorithm.
KEY_TYPES: dict[str, tuple[str, str | None]] = {
    "RS256": ("RSA", None),
    "RS384": ("RSA", None),
    "RS512": ("RSA", None),
    "PS256": ("RSA", None),
    "PS384": ("RSA", None),
    "PS512": ("RSA", None),
    "ES256": ("EC", "P-256"),
    "ES384": ("EC", "P-384"),
    "ES512": ("EC", "P-521"),
    "EdDSA": ("OKP", None),  # Ed25519 or Ed448: the JWK's crv says which
}
LOOPBACK_NAMES = frozenset({"localhost"})


@dataclass(frozen=True, slots=True)
class IssuerSettings:
    """One OIDC issuer whose tokens the gateway accepts.

    ``jwks_url`` must be ``https``, except on a loopback host (``127.0.0.0/8``, ``::1``,
    ``localhost``): whoever can rewrite the key set can mint any identity, and plain HTTP can
    be rewritten by anyone on the path; traffic to loopback never leaves the machine (a local
    identity provider, tests).
    """

    name: str  # the config's name for it, e.g. "corp-sso"
    issuer: str  # the `iss` a token must carry, exactly
    jwks_url: str
    audiences: tuple[str, ...]  # `aud` must contain one of them
    # The rest have their defaults in the config schema (config/schema.py, IssuerConfig), the one
    # place a default is written; config/validation.py passes every field.
    algorithms: tuple[str, ...]
    user_claim: str
    group_claim: str  # a string or a list of strings
    leeway_seconds: float
    jwks_max_age_seconds: float

    def __post_init__(self) -> None:
        for field in ("name", "issuer", "user_claim", "group_claim"):
            if not getattr(self, field):
                raise ValueError(f"issuer {self.name!r}: {field} must not be empty")
        if not self.audiences or not all(self.audiences):
            raise ValueError(f"issuer {self.name!r}: audiences must list at least one audience")
        if not self.algorithms:
            raise ValueError(f"issuer {self.name!r}: algorithms must not be empty")
        for alg in self.algorithms:
            if alg not in KEY_TYPES:
                raise ValueError(
                    f"issuer {self.name!r}: algorithm {alg!r} is not accepted (only asymmetric "
                    f"ones: {', '.join(KEY_TYPES)}; HS* and none never)"
                )
        if not (math.isfinite(self.leeway_seconds) and 0 <= self.leeway_seconds <= 300):
            raise ValueError(f"issuer {self.name!r}: leeway_seconds must be within 0..300")
        if not (math.isfinite(self.jwks_max_age_seconds) and self.jwks_max_age_seconds > 0):
            raise ValueError(f"issuer {self.name!r}: jwks_max_age_seconds must be positive")
        check_jwks_url(self.name, self.jwks_url)


def check_jwks_url(name: str, url: str) -> None:
    """Refuse a key-set URL the gateway must not trust (see :class:`IssuerSettings`)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not host or parts.scheme not in ("https", "http"):
        raise ValueError(f"issuer {name!r}: jwks_url must be an https:// URL, got {url!r}")
    if parts.scheme == "http" and not is_loopback(host):
        raise ValueError(
            f"issuer {name!r}: jwks_url must use https (http is allowed only for a loopback "
            f"host), got {url!r}"
        )


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a verified token names."""

    issuer: str  # IssuerSettings.name
    user: str  # the user claim's value
    groups: tuple[str, ...]  # the group claim's values, as the token lists them
    expires_at: float  # the token's `exp`, epoch seconds
