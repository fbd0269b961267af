"""Who is calling: the principal of an API key or of a verified token, and the user it speaks for.

A request's credential is an ``Authorization: Bearer`` or ``x-api-key`` value: a key the config
knows (or the live table has now: :mod:`hardcap_core.control.live`), or an OIDC JWT from an issuer
a tenant accepts (:mod:`hardcap_core.identity`), whose group claim names the tenant and whose user
claim the user. A user — of a token, or the end user a request names in ``user`` (OpenAI) or
``metadata.user_id`` (Anthropic) where its tenant opts in — joins the hierarchy as its own level
(key -> user -> tenant -> org) with the budgets of the tenant's ``users:`` template, created on
first use: the scope is built here and the admit script checks it with the others.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from hardcap_core.auth import bearer_token
from hardcap_core.budgets import Level, LevelKind
from hardcap_core.chat import ANTHROPIC_MESSAGES, ChatRequest
from hardcap_core.config.model import Config, Principal
from hardcap_core.errors import AuthenticationFailed, InvalidRequest, PermissionDenied
from hardcap_core.providers.transport import Transport

if TYPE_CHECKING:  # imported only where a config table is named (gateway/app.py)
    from hardcap_core.control.live import LiveConfig

# A user as it is, where it is short and plain; anything else by a digest of it.
PLAIN_USER = re.compile(r"^[A-Za-z0-9_.@+\-]{1,96}$")
MAX_USER_CHARS = 1024  # a longer end-user id is a 400, not something to hash every time
MAX_JOINED = 16_384  # principals joined with a user, remembered (the oldest forgotten first)
TENANT_HEADER = "x-hardcap-tenant"  # picks one tenant when a token's groups map to several


def user_level_id(tenant: str, user: str) -> str:
    """The id of ``user``'s level under ``tenant`` (``tenant~user``, or a digest for ids that
    are long or hold other characters)."""
    if PLAIN_USER.match(user):
        return f"{tenant}~{user}"
    return f"{tenant}~h.{hashlib.sha256(user.encode()).hexdigest()[:40]}"


class Callers:
    """Finds the principal of a request's credential, and joins the user it speaks for."""

    def __init__(
        self, config: Config, live: LiveConfig | None = None, transport: Transport | None = None
    ) -> None:
        self.static = config
        self.live = live
        self._transport = transport  # the gateway's HTTP client: key sets are fetched over it
        self._verifier: Any = None  # hardcap_core.identity.JwtVerifier, made with the first JWT
        self._verifier_issuers: tuple[Any, ...] = ()
        self._joined: OrderedDict[tuple[int, str], Principal] = OrderedDict()
        if live is not None:
            live.on_change(lambda _: self._joined.clear())

    def config(self) -> Config:
        """The config a request arriving now is served with."""
        return self.static if self.live is None else self.live.current()

    async def principal(self, request: Request) -> Principal:
        """The principal of the request's credential: 401 without one or for one nobody
        knows, 403 for a disabled tenant or a token no tenant accepts. A disabled tenant's
        request asks first whether this copy of the config is stale (:meth:`LiveConfig.refresh`)
        and is decided by the copy as it is then: an enabled tenant is served at once."""
        principal = await self._find(request)
        if principal.disabled and self.live is not None:
            await self.live.refresh(principal.scope.root.tag)
            # Found again whatever the answer: another request may have reloaded the copy
            # since this one was found (no I/O for a key the copy knows).
            principal = await self._find(request)
        if principal.disabled:
            raise PermissionDenied(f"Tenant '{principal.tenant_id}' is disabled.")
        return principal

    async def allowing(self, principal: Principal, route: str, request: Request) -> Principal:
        """``principal``, or the request's principal as the copy has it after asking whether it
        is stale, when ``principal`` may not use ``route`` (a route the admin may have allowed
        since): called only for a request about to be refused, so an allowed one pays nothing.
        The caller decides then, with the principal returned."""
        if principal.allows(route) or self.live is None:
            return principal
        await self.live.refresh(principal.scope.root.tag)
        # Found again whatever the answer: the copy may have changed while the body was read.
        return await self.principal(request)

    async def _find(self, request: Request) -> Principal:
        credential = bearer_token(request.headers.get("authorization")) or request.headers.get(
            "x-api-key"
        )
        if not credential:
            raise AuthenticationFailed(
                "Missing API key: send it as 'Authorization: Bearer <key>' or 'x-api-key'.",
                code="missing_api_key",
            )
        config = self.config()
        principal = config.authenticate(credential)
        if principal is None and config.jwt_tenants:
            from hardcap_core.identity import looks_like_jwt

            if looks_like_jwt(credential):
                principal = await self._token(config, credential, request)
        if principal is None and self.live is not None:
            principal = await self.live.lookup(credential)
        if principal is None:
            raise AuthenticationFailed("Incorrect API key provided.")
        return principal

    def for_request(self, principal: Principal, chat: ChatRequest) -> Principal:
        """``principal`` joined with the end user ``chat`` names, where its tenant asks for
        per-end-user budgets (a 400 naming the field where one is required and missing)."""
        if principal.user or principal.end_users == "off" or principal.users is None:
            return principal
        field = "metadata.user_id" if chat.dialect == ANTHROPIC_MESSAGES else "user"
        raw = chat.body.get("user")
        if raw is None or raw == "":
            if principal.end_users == "required":
                raise InvalidRequest(
                    f"'{field}' is required: tenant '{principal.tenant_id}' budgets each end "
                    "user of its app.",
                    param=field,
                )
            return principal
        if not isinstance(raw, str):
            raise InvalidRequest(f"'{field}' must be a string.", param=field)
        if len(raw) > MAX_USER_CHARS:
            raise InvalidRequest(
                f"'{field}' is {len(raw)} characters long; at most {MAX_USER_CHARS}.", param=field
            )
        return self.with_user(principal, raw)

    def with_user(self, principal: Principal, user: str) -> Principal:
        """``principal`` with ``user``'s level (from the tenant's template) in its scope; the
        same object for the same pair while it is remembered, so its ledger plan is reused."""
        if principal.users is None:
            return principal
        key = (id(principal), user)
        joined = self._joined.get(key)
        if joined is not None:
            self._joined.move_to_end(key)
            return joined
        level = Level(LevelKind.USER, user_level_id(principal.tenant_id, user))
        scope = principal.users.scope(principal.scope, level)
        joined = replace(principal, scope=scope, user=level.id)
        self._joined[key] = joined
        while len(self._joined) > MAX_JOINED:
            self._joined.popitem(last=False)
        return joined

    async def _token(self, config: Config, token: str, request: Request) -> Principal:
        from hardcap_core.identity import JwtVerifier, TransportJwksFetch

        if self._verifier is None or self._verifier_issuers != config.issuers:
            if self._verifier is not None:
                await self._verifier.aclose()
            fetch = None if self._transport is None else TransportJwksFetch(self._transport)
            self._verifier = JwtVerifier(config.issuers, fetch)
            self._verifier_issuers = config.issuers
        identity = await self._verifier.verify(token)  # InvalidToken: a 401 saying why
        groups = set(identity.groups)
        matches = [
            p
            for issuer, accepted, p in config.jwt_tenants
            if issuer == identity.issuer and accepted & groups
        ]
        wanted = request.headers.get(TENANT_HEADER)
        if wanted is not None:
            matches = [p for p in matches if p.tenant_id == wanted]
        if not matches:
            where = f" as tenant '{wanted}'" if wanted is not None else ""
            raise PermissionDenied(f"No tenant accepts this token's groups{where}.")
        # Several tenants may accept one group: the first in the config serves, unless the
        # client names one (x-hardcap-tenant).
        return self.with_user(matches[0], identity.user)

    async def aclose(self) -> None:
        if self._verifier is not None:
            await self._verifier.aclose()
