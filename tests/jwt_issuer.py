"""A test identity provider: signing keys made with ``cryptography``, their JWKS, and tokens
(honest ones, and the forgeries a verifier must refuse)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass
from functools import cache
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

ISS = "https://sso.example.test/realms/corp"
AUD = "hardcap-gateway"
NOW = 1_750_000_000.0  # the verifier's clock in unit tests starts here


@dataclass(frozen=True)
class SigningKey:
    kid: str
    alg: str
    private: Any

    def jwk(self, *, with_alg: bool = True) -> dict[str, Any]:
        public = self.private.public_key()
        if isinstance(public, rsa.RSAPublicKey):
            data = RSAAlgorithm.to_jwk(public, as_dict=True)
        elif isinstance(public, ec.EllipticCurvePublicKey):
            data = ECAlgorithm.to_jwk(public, as_dict=True)
        else:
            data = OKPAlgorithm.to_jwk(public, as_dict=True)
        data = {**data, "kid": self.kid, "use": "sig"}
        if with_alg:
            data["alg"] = self.alg
        return data

    def public_pem(self) -> bytes:
        return bytes(
            self.private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )


@cache
def _rsa(seed: str) -> rsa.RSAPrivateKey:
    # 2048 bits, the least PyJWT accepts when key lengths are enforced; cached: ~50 ms each.
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def rsa_key(kid: str, alg: str = "RS256", *, seed: str | None = None) -> SigningKey:
    """An RSA key; the same ``seed`` gives the same key (so two kids can share one)."""
    return SigningKey(kid, alg, _rsa(seed or kid))


def ec_key(kid: str) -> SigningKey:
    return SigningKey(kid, "ES256", ec.generate_private_key(ec.SECP256R1()))


def ed_key(kid: str) -> SigningKey:
    return SigningKey(kid, "EdDSA", ed25519.Ed25519PrivateKey.generate())


def jwks(*keys: SigningKey, extra: list[dict[str, Any]] | None = None) -> bytes:
    return json.dumps({"keys": [k.jwk() for k in keys] + (extra or [])}).encode()


def claims(now: float = NOW, **overrides: Any) -> dict[str, Any]:
    """Claims an honest issuer would sign: valid for five minutes from ``now``."""
    base: dict[str, Any] = {
        "iss": ISS,
        "aud": AUD,
        "sub": "alice@example.test",
        "groups": ["team-a", "admins"],
        "iat": int(now),
        "exp": int(now) + 300,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def mint(key: SigningKey, payload: dict[str, Any], *, kid: str | None = "same") -> str:
    """A token signed by ``key``; its header names ``key.kid`` unless ``kid`` says otherwise
    (None: no kid)."""
    headers = {} if kid is None else {"kid": key.kid if kid == "same" else kid}
    return jwt.encode(payload, key.private, algorithm=key.alg, headers=headers)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def raw_token(header: dict[str, Any], payload: dict[str, Any], signature: bytes = b"") -> str:
    """A token built by hand, as an attacker would (PyJWT refuses to make these)."""
    head = b64(json.dumps(header).encode()) + "." + b64(json.dumps(payload).encode())
    return head + "." + b64(signature)


def hs256_with_public_key(key: SigningKey, payload: dict[str, Any]) -> str:
    """The algorithm-confusion forgery: HS256 with the issuer's public key (PEM) as the HMAC
    secret. A verifier that lets the token choose the algorithm accepts it."""
    header = {"alg": "HS256", "typ": "JWT", "kid": key.kid}
    unsigned = raw_token(header, payload).rsplit(".", 1)[0]
    mac = hmac.new(key.public_pem(), unsigned.encode(), hashlib.sha256).digest()
    return unsigned + "." + b64(mac)


def issuer_settings(**fields: Any) -> Any:
    """An issuer's runtime settings (``IssuerSettings``) with the config schema's defaults for
    what ``fields`` leave out: the schema is the one place those defaults are written."""
    from hardcap_core.config.schema import IssuerConfig
    from hardcap_core.identity import IssuerSettings

    values = {
        name: tuple(field.default) if isinstance(field.default, list) else field.default
        for name, field in IssuerConfig.model_fields.items()
        if not field.is_required()
    }
    return IssuerSettings(**(values | fields))
