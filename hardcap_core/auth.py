"""Tenant API keys: minting, hashing, and looking up a presented key.

A key is ``hc_`` followed by 43 URL-safe characters (256 random bits). The config stores only
``sha256:<hex>`` of each key. A plain, unsalted SHA-256 is enough here because the keys are
random and long: there is nothing to brute-force, unlike passwords, and a fast hash keeps the
lookup cheap on every request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from typing import Generic, TypeVar

from hardcap_core.budgets import ID_PATTERN
from hardcap_core.errors import ConfigError

KEY_PREFIX = "hc_"
HASH_PREFIX = "sha256:"
# Longer headers are refused before hashing, so a client cannot make us hash megabytes.
MAX_KEY_LENGTH = 512

P = TypeVar("P")


def new_key() -> tuple[str, str]:
    """Mint a key: ``(plaintext, hash)``. Show the plaintext once; store only the hash."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_key(key)


def hash_key(key: str) -> str:
    """The stored form of a key: ``sha256:`` and 64 lowercase hex digits."""
    return HASH_PREFIX + hashlib.sha256(key.encode("utf-8")).hexdigest()


def is_key_hash(text: str) -> bool:
    """Whether ``text`` has the shape :func:`hash_key` produces."""
    digest = text[len(HASH_PREFIX) :]
    return (
        text.startswith(HASH_PREFIX)
        and len(digest) == 64
        and all(c in "0123456789abcdef" for c in digest)
    )


def bearer_token(header_value: str | None) -> str | None:
    """The key in an ``Authorization: Bearer <key>`` header, or None if absent or malformed.

    The scheme is matched case-insensitively (RFC 9110); anything but exactly one token after
    it is malformed.
    """
    if not header_value:
        return None
    parts = header_value.split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    return parts[1]


class KeyIndex(Generic[P]):
    """Maps key hashes to principals and finds the principal of a presented key.

    The presented key is hashed first, so the dict lookup's timing depends on the hash, which
    tells an attacker nothing about any stored key; the final comparison of the full hashes is
    :func:`hmac.compare_digest`, so the check that grants access does not short-circuit either.
    """

    def __init__(self, by_hash: Mapping[str, P]) -> None:
        self._entries: dict[str, tuple[str, P]] = {}
        for key_hash, principal in by_hash.items():
            if not is_key_hash(key_hash):
                raise ValueError(f"not a key hash: {key_hash[:12]!r}...")
            self._entries[key_hash] = (key_hash, principal)

    def __len__(self) -> int:
        return len(self._entries)

    def principals(self) -> list[P]:
        """Every principal, in the order given (for listing keys, never for authentication)."""
        return [principal for _, principal in self._entries.values()]

    def lookup(self, presented_key: str) -> P | None:
        """The principal whose hash matches ``presented_key``, or None (empty or unknown key)."""
        if not presented_key or len(presented_key) > MAX_KEY_LENGTH:
            return None
        presented_hash = hash_key(presented_key)
        entry = self._entries.get(presented_hash)
        if entry is None:
            return None
        stored_hash, principal = entry
        if not hmac.compare_digest(stored_hash.encode(), presented_hash.encode()):
            return None
        return principal


def keys_new_command(tenant: str | None, key_id: str | None) -> str:
    """Mint a key and return what ``hardcap keys new`` prints.

    The plaintext appears here once and nowhere else; the lines to paste into the config hold
    only its hash. Without ``key_id`` one is made up from the tenant id and a short random tag.
    """
    for what, value in (("tenant", tenant), ("id", key_id)):
        if value is not None and not ID_PATTERN.match(value):
            raise ConfigError(f"--{what} {value!r} must match {ID_PATTERN.pattern}")
    if key_id is None:
        key_id = f"{tenant or 'key'}-{secrets.token_hex(3)}"
    key, key_hash = new_key()
    where = f"tenant {tenant}" if tenant else "its tenant"
    return (
        "New API key (shown once: store it now, Hardcap keeps only its hash):\n"
        "\n"
        f"  {key}\n"
        "\n"
        f"Add it to the config, under `keys:` of {where}:\n"
        "\n"
        f"      - id: {key_id}\n"
        f'        hash: "{key_hash}"\n'
    )
