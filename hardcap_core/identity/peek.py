"""A token's header and claims read before its signature is checked: to tell a JWT from an API
key, and to choose the issuer (and so the keys) that must verify it.

Nothing read here is trusted: the issuer chosen by the unverified ``iss`` verifies the token
with its own keys and checks ``iss`` again (PyJWT, on the verified payload). Reading it without
PyJWT keeps the API-key path free of the import (cold start).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from hardcap_core import json_codec

# A bearer JWT from an identity provider is a few kilobytes at most; past this the gateway does
# not decode or verify anything.
MAX_TOKEN_BYTES = 16 << 10
# base64url without padding (RFC 7515 §2), as JWS compact serialization writes it.
_SEGMENT = re.compile(r"[A-Za-z0-9_-]*")


class Malformed(ValueError):
    """Not a JWS compact token; the message says why, never quoting the token."""


def looks_like_jwt(token: str) -> bool:
    """Three base64url segments whose first decodes to a JSON object with an ``alg``: cheap
    (the header is a few dozen bytes), so the gateway tells a JWT from an ``hc_...`` key
    without PyJWT. A token too long to verify still looks like one, so that it is refused
    as a token ("too long") rather than as an unknown API key."""
    try:
        header = _segment_json(_segments(token)[0], "header")
    except Malformed:
        return False
    return isinstance(header.get("alg"), str)


def unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and the claims, decoded but not verified. Raises :class:`Malformed`."""
    if len(token) > MAX_TOKEN_BYTES:
        raise Malformed(f"the token is longer than {MAX_TOKEN_BYTES} bytes")
    header_segment, payload_segment, _ = _segments(token)
    return _segment_json(header_segment, "header"), _segment_json(payload_segment, "payload")


def _segments(token: str) -> list[str]:
    segments = token.split(".")
    if len(segments) != 3:
        raise Malformed("a JWT has three dot-separated parts")
    if not all(_SEGMENT.fullmatch(s) for s in segments) or not segments[0] or not segments[1]:
        raise Malformed("a JWT's parts are base64url (RFC 7515)")
    return segments


def _segment_json(segment: str, part: str) -> dict[str, Any]:
    if len(segment) % 4 == 1:
        raise Malformed(f"the {part} is not valid base64url")
    try:
        raw = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
        value = json_codec.loads(raw)
    except (binascii.Error, ValueError) as e:
        raise Malformed(f"the {part} is not base64url-encoded JSON") from e
    if not isinstance(value, dict):
        raise Malformed(f"the {part} is not a JSON object")
    return value
