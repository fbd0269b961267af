"""An issuer's published keys (its JWKS), fetched when needed and cached.

What the cache guarantees, per issuer:

- keys are fetched at most once per :data:`MIN_FETCH_INTERVAL_S`, whatever the tokens say: a
  stream of tokens naming forged key ids cannot make the gateway hammer the issuer, and an
  issuer that is down is asked again only after the interval;
- one fetch at a time (single flight): every token that needs the keys while a fetch is under
  way waits for that fetch;
- the set is refreshed once it is older than the issuer's max age, and a token naming a key id
  the set does not hold triggers one refetch (the issuer rotated its keys): no restart;
- a failed fetch keeps the keys already held (stale if error), for at most
  :data:`STALE_IF_ERROR_MAX_S`: a key the issuer withdrew stops working even if its key set
  stays unreachable.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from hardcap_core import json_codec
from hardcap_core.identity.issuers import KEY_TYPES
from hardcap_core.logs import logger

# A key set is a few kilobytes (a handful of public keys); past this it is not one.
MAX_JWKS_BYTES = 256 << 10
MIN_FETCH_INTERVAL_S = 10.0
STALE_IF_ERROR_MAX_S = 24 * 3600.0


class JwksFetchFailed(Exception):
    """The key set could not be fetched or read; the message says why (for the logs)."""


class KeysUnavailable(Exception):
    """No usable key set: never fetched successfully, or held too long past its last fetch."""


class JwksFetch(Protocol):
    """Fetch the key set at ``url``: its body, or :class:`JwksFetchFailed`. The seam tests use
    to count or fail fetches; the gateway's is
    :class:`~hardcap_core.identity.fetch.TransportJwksFetch`."""

    async def __call__(self, url: str) -> bytes: ...


@dataclass(slots=True, eq=False)
class Jwk:
    """One signing key of a set. ``built``: the verifying key made from it for each algorithm,
    made on first use (tens of µs for RSA) and dropped with the set."""

    data: Mapping[str, Any]
    kid: str | None
    kty: str
    crv: str | None
    alg: str | None
    built: dict[str, Any] = field(default_factory=dict)

    def fits(self, alg: str) -> bool:
        """Whether a token signed with ``alg`` may be verified with this key: its type and curve
        are the algorithm's, and its own ``alg``, if it names one, is the same."""
        kty, crv = KEY_TYPES[alg]
        return (
            self.kty == kty
            and (crv is None or self.crv == crv)
            and (self.alg is None or self.alg == alg)
        )


@dataclass(frozen=True, slots=True)
class KeySet:
    keys: tuple[Jwk, ...]
    fetched_at: float

    def named(self, kid: str | None) -> tuple[Jwk, ...]:
        """The keys with this id; for a token without ``kid``, the set's only key, if it has
        only one (some issuers omit the id then)."""
        if kid is None:
            return self.keys if len(self.keys) == 1 else ()
        return tuple(k for k in self.keys if k.kid == kid)


def parse_jwks(body: bytes, fetched_at: float) -> KeySet:
    """The signing keys of a JWKS document (RFC 7517). Keys the gateway never verifies with are
    left out: symmetric (``oct``), encryption (``use: enc``), unknown types."""
    if len(body) > MAX_JWKS_BYTES:
        raise JwksFetchFailed(f"the key set is larger than {MAX_JWKS_BYTES} bytes")
    try:
        document = json_codec.loads(body)
    except json_codec.JSONDecodeError as e:
        raise JwksFetchFailed("the key set is not JSON") from e
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise JwksFetchFailed("the key set has no 'keys' list")
    known_types = {kty for kty, _ in KEY_TYPES.values()}
    keys = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("kty") not in known_types:
            continue
        if entry.get("use", "sig") != "sig":
            continue
        kid, crv, alg = entry.get("kid"), entry.get("crv"), entry.get("alg")
        if not all(v is None or isinstance(v, str) for v in (kid, crv, alg)):
            continue
        keys.append(Jwk(entry, kid, entry["kty"], crv, alg))
    if not keys:
        raise JwksFetchFailed("the key set holds no signing key")
    return KeySet(tuple(keys), fetched_at)


class IssuerKeys:
    """The cached key set of one issuer (see the module's docstring for the rules)."""

    def __init__(
        self, url: str, max_age_s: float, fetch: JwksFetch, clock: Callable[[], float]
    ) -> None:
        self.url = url
        self.max_age_s = max_age_s
        self._fetch = fetch
        self._clock = clock
        self._set: KeySet | None = None
        self._attempted_at = -math.inf
        self._error: str | None = None  # why the last fetch failed; None after a success
        self._inflight: asyncio.Task[None] | None = None

    async def named(self, kid: str | None) -> tuple[Jwk, ...]:
        """The keys a token naming ``kid`` may be verified with: empty if the issuer does not
        publish it, even after a refetch. Raises :class:`KeysUnavailable` when no key set can
        be had, or when the key is unknown and the last fetch failed (it may be a rotation the
        gateway could not see)."""
        held = self._set
        if held is None or self._clock() - held.fetched_at >= self.max_age_s:
            await self._refresh()
        found = self._usable().named(kid)
        if not found:
            await self._refresh()
            found = self._usable().named(kid)
        if not found and self._error is not None:
            raise KeysUnavailable(self._error)
        return found

    def _usable(self) -> KeySet:
        held = self._set
        if held is None:
            raise KeysUnavailable(self._error or "the key set was never fetched")
        if self._clock() - held.fetched_at > max(STALE_IF_ERROR_MAX_S, self.max_age_s):
            raise KeysUnavailable(f"the key set could not be refreshed: {self._error}")
        return held

    async def _refresh(self) -> None:
        """Fetch the set, or wait for the fetch under way; nothing when the last one began less
        than :data:`MIN_FETCH_INTERVAL_S` ago."""
        task = self._inflight
        if task is None:
            now = self._clock()
            if now - self._attempted_at < MIN_FETCH_INTERVAL_S:
                return
            self._attempted_at = now
            task = self._inflight = asyncio.create_task(self._fetch_once())
        # Shielded: a request that gives up (its client left) does not cancel the fetch the
        # others wait for.
        await asyncio.shield(task)

    async def _fetch_once(self) -> None:
        try:
            body = await self._fetch(self.url)
            fetched = parse_jwks(body, self._clock())
        except JwksFetchFailed as e:
            self._error = str(e)
            stale = "keeping the keys held" if self._set is not None else "no keys held"
            logger.warning(
                "jwks fetch failed", extra={"jwks_url": self.url, "detail": str(e), "then": stale}
            )
        else:
            self._set, self._error = fetched, None
        finally:
            self._inflight = None

    async def aclose(self) -> None:
        task, self._inflight = self._inflight, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
