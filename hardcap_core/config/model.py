"""The config as the gateway uses it: upstreams, routes, principals, built once at load.

Built by :mod:`hardcap_core.config.validation` from a validated file (:mod:`.schema`); nothing
here imports pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from typing import Any, Literal

from hardcap_core.auth import KeyIndex
from hardcap_core.budgets import (
    NO_TERMS,
    Budget,
    Dimension,
    Level,
    LevelKind,
    Prices,
    RateLimit,
    Scope,
    Terms,
    Window,
)
from hardcap_core.config.secrets import KeySource, resolve_api_key
from hardcap_core.config.settings import (
    DEFAULT_GATEWAY,
    DEFAULT_SERVER_TOOL_INPUT_TOKENS,
    DEFAULT_SERVER_TOOL_MAX_USES,
    BreakerSettings,
    EstimatorSettings,
    GatewaySettings,
    UnseenOutput,
)
from hardcap_core.ledger.allowances import SharedBudget, SharedLimits
from hardcap_core.tokenize.images import ALL_RULES, ImageRule

DEFAULT_BREAKER = BreakerSettings()


class Policy(StrEnum):
    """What a route does when a stream's reservation cannot grow (see docs/config.md)."""

    TRUNCATE = "truncate"  # end the stream with finish_reason "length": a hard cap
    ALLOW = "allow"  # let it run to the end and charge it all (may overshoot)
    COUNT_AFTER = "count_after"  # the benchmarks' baseline: reserve nothing, charge at the end
    # What each does is its class in hardcap_core/gateway/money.py (HoldPolicy), named by value.


@dataclass(frozen=True, slots=True)
class Upstream:
    """A provider endpoint. Its key is resolved on first use, not at load (see ``api_key``)."""

    name: str
    base_url: str  # "" for a bedrock upstream on its region's default endpoint
    timeout_seconds: float
    key_source: KeySource | None = None
    kind: str = "openai"  # openai | anthropic | bedrock: which provider speaks to it
    region: str | None = None  # bedrock only
    breaker: BreakerSettings = DEFAULT_BREAKER
    # Its budgets and per-minute rates over every tenant (ledger/allowances.py).
    shared: tuple[SharedBudget, ...] = ()
    # By when a stream's status line and headers must have arrived (gateway's default).
    head_timeout_seconds: float = DEFAULT_GATEWAY.upstream_head_timeout_seconds

    def api_key(self) -> str | None:
        """The API key, or None if none is configured; values from AWS are cached for minutes."""
        return resolve_api_key(self.name, self.key_source)


@dataclass(frozen=True, slots=True)
class Route:
    """A public model name and how to serve it."""

    name: str
    upstream: Upstream
    model: str
    estimator: EstimatorSettings
    policy: Policy
    prices: Prices
    max_output_tokens: int
    min_output_reservation: int
    fallbacks: tuple[str, ...] = ()  # route names tried in order when this one cannot serve
    queue_wait_seconds: float | None = None  # None: the gateway's
    unseen_output: UnseenOutput = "none"  # what it bills unseen (gateway/unseen.py)
    max_pdf_pages: int | None = None  # PDF pages a request may carry; None: the gateway's cap
    # A server tool's uses when a request bounds none, and the input held per use (schema).
    server_tool_max_uses: int = DEFAULT_SERVER_TOOL_MAX_USES
    server_tool_input_tokens: int = DEFAULT_SERVER_TOOL_INPUT_TOKENS
    store_responses: bool = True  # whether its Responses are kept (gateway/stored.py)
    # How its input is counted (hardcap_core/tokenize/): o200k_base, cl100k_base, anthropic or
    # bound; whether that count replaces the bound on every request ("always") or only where
    # the bound does not fit ("when_needed"); anthropic: ask its count_tokens endpoint.
    tokenizer: str = "bound"
    exact_count: str = "when_needed"
    count_api: bool = False
    # How its upstream model bills an image (hardcap_core/tokenize/images.py); every rule's
    # dearest unless the config says or the model's family is known.
    image_rules: tuple[ImageRule, ...] = ALL_RULES
    trace_content: bool = False  # prompts and completions in its traces (docs/tracing.md)
    # Its own limits over every tenant, then its upstream's; None: neither has any.
    shared: SharedLimits | None = None


@dataclass(frozen=True, slots=True)
class UserTemplate:
    """What every user of a tenant gets (the tenant's ``users:``): a user level's budgets and
    rate limits, the same for each user, created on first use."""

    budgets: tuple[tuple[Dimension, int, Window], ...] = ()
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    notify_at: tuple[tuple[int, ...], ...] = ()  # per budget, in order; none: the default

    def scope(self, base: Scope, user: Level) -> Scope:
        """``base`` with ``user`` joined just below its tenant (key -> user -> tenant -> org)."""
        at = next((i for i, lv in enumerate(base.levels) if lv.kind is LevelKind.TENANT), 0)
        levels = (*base.levels[:at], user, *base.levels[at:])
        own = (Budget(user, d, limit, w) for d, limit, w in self.budgets)
        if self.notify_at:
            own = (replace(b, notify_at=n) for b, n in zip(own, self.notify_at, strict=True))
        budgets = (*base.budgets, *own)
        rates = base.rate_limits
        if self.requests_per_minute is not None or self.tokens_per_minute is not None:
            rates = (*rates, RateLimit(user, self.requests_per_minute, self.tokens_per_minute))
        return Scope(levels, budgets, rates)


EndUsers = Literal["off", "optional", "required"]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a key (or a verified token) belongs to and everything its requests are checked
    against."""

    key_id: str
    tenant_id: str
    org_id: str | None
    fail_mode: Literal["open", "closed"]
    allowed_routes: frozenset[str] | None  # None: every route
    scope: Scope
    queue_wait_seconds: float | None = None  # the tenant's; None: the route's
    queue_priority: int = 0  # the key's class in the admission queue: higher goes first
    users: UserTemplate | None = None  # the tenant's per-user budgets, if it has them
    end_users: EndUsers = "off"  # per-user budgets for the end user a request names
    disabled: bool = False  # its tenant (or org) is disabled: refused with 403
    user: str = ""  # the user level's id (tenant~user) of a scope joined for one user

    def allows(self, route: str) -> bool:
        return self.allowed_routes is None or route in self.allowed_routes

    def queue_wait_s(self, route: Route, default: float) -> float:
        """How long this principal's request on ``route`` may wait in the admission queue."""
        if self.queue_wait_seconds is not None:
            return self.queue_wait_seconds
        return default if route.queue_wait_seconds is None else route.queue_wait_seconds


@dataclass(frozen=True)
class Config:
    """The loaded config. Build it with :func:`load_config` or :func:`parse_config`."""

    gateway: GatewaySettings
    upstreams: dict[str, Upstream]
    routes: dict[str, Route]
    source: str
    keys: KeyIndex[Principal] = field(repr=False)
    tenant_scopes: dict[str, Scope] = field(repr=False)
    # Tenants that accept verified tokens: (issuer name, groups, the tenant's principal), in
    # the file's order; and the issuers themselves (hardcap_core.identity.IssuerSettings).
    jwt_tenants: tuple[tuple[str, frozenset[str], Principal], ...] = field(default=(), repr=False)
    issuers: tuple[Any, ...] = field(default=(), repr=False)

    def authenticate(self, presented_key: str) -> Principal | None:
        """The principal of a presented API key, or None for an empty or unknown key."""
        return self.keys.lookup(presented_key)

    def tenant_scope(self, tenant_id: str) -> Scope:
        """Tenant and org levels with their budgets and rate limits (no key level).

        Raises KeyError for an unknown tenant.
        """
        return self.tenant_scopes[tenant_id]

    def chain(self, route: Route) -> list[Route]:
        """``route`` and its fallbacks, in the order they are tried."""
        return [route, *(self.routes[name] for name in route.fallbacks)]

    def hold_prices(self, route: Route, terms: Terms = NO_TERMS, input_tokens: int = 0) -> Prices:
        """The prices a request on ``route`` with ``terms`` and an input estimate of
        ``input_tokens`` is reserved at: the highest of its chain, each at the request's
        service tier (or the dearest it may be served at) and long-context tier, and input at
        the dearest cache-write price it may be billed, so whichever target serves it and
        however the provider bills it, the hold covers the cost (:meth:`Prices.held`)."""
        if terms == NO_TERMS and (plain := self._plain_holds.get(route.name)) is not None:
            return plain
        return self._hold(route, terms, input_tokens)

    def _hold(self, route: Route, terms: Terms, input_tokens: int) -> Prices:
        held_in = held_out = 0
        for r in self.chain(route):
            i, o = r.prices.with_terms(terms).held(input_tokens)
            held_in, held_out = max(held_in, i), max(held_out, o)
        return Prices(held_in, held_out)

    @cached_property
    def _plain_holds(self) -> dict[str, Prices]:
        """Per route whose chain has no long-context tier, the hold of a request whose terms
        change no price: what most requests are held at, worked out once."""
        return {
            name: self._hold(route, NO_TERMS, 0)
            for name, route in self.routes.items()
            if not any(r.prices.long_context for r in self.chain(route))
        }

    def user_template(self, tenant_id: str) -> UserTemplate | None:
        """``tenant_id``'s ``users:`` template (every principal of the tenant, its keys and its
        verified tokens, carries the same one); None when it has none."""
        principals = [*self.keys.principals(), *(p for _, _, p in self.jwt_tenants)]
        return next((p.users for p in principals if p.tenant_id == tenant_id and p.users), None)

    def roots(self) -> list[Level]:
        """The root of every tenant hierarchy (an org, or a tenant without one), in order."""
        return list(dict.fromkeys(s.root for s in self.tenant_scopes.values()))

    def principal_by_id(self, key_id: str) -> Principal | None:
        """The principal of the key with id ``key_id`` (not for authentication)."""
        return next((p for p in self.keys.principals() if p.key_id == key_id), None)

    def hierarchy(self, root: Level) -> Scope:
        """Every level under ``root`` (its keys, its tenants, then root) and all their budgets:
        what a lost cache must get back for that hierarchy."""
        scopes = [p.scope for p in self.keys.principals() if p.scope.root == root]
        scopes += [s for s in self.tenant_scopes.values() if s.root == root]
        if not scopes:
            raise KeyError(f"no tenant hierarchy under {root}")
        order = {LevelKind.KEY: 0, LevelKind.USER: 1, LevelKind.TENANT: 2, LevelKind.ORG: 3}
        levels = sorted(
            {lv for s in scopes for lv in s.levels}, key=lambda lv: (order[lv.kind], lv.id)
        )
        budgets = list(dict.fromkeys(b for s in scopes for b in s.budgets))
        return Scope(tuple(levels), tuple(budgets))
