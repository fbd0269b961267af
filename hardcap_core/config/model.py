"""The config as the gateway uses it: upstreams, routes, principals, built once at load.

Built by :mod:`hardcap_core.config.validation` from a validated file (:mod:`.schema`); nothing
here imports pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from hardcap_core.auth import KeyIndex
from hardcap_core.budgets import Level, LevelKind, Prices, Scope
from hardcap_core.config.secrets import KeySource, resolve_api_key
from hardcap_core.config.settings import BreakerSettings, EstimatorSettings, GatewaySettings

DEFAULT_BREAKER = BreakerSettings()


class Policy(StrEnum):
    """What a route does when a stream's reservation cannot grow (see docs/config.md)."""

    TRUNCATE = "truncate"  # end the stream with finish_reason "length": a hard cap
    ALLOW = "allow"  # let it run to the end and charge it all (may overshoot)
    COUNT_AFTER = "count_after"  # the benchmarks' baseline: reserve nothing, charge at the end

    @property
    def cuts(self) -> bool:
        """Whether a stream is ended when its reservation cannot grow."""
        return self is Policy.TRUNCATE

    @property
    def extends(self) -> bool:
        """Whether a stream's reservation grows while it runs."""
        return self is not Policy.COUNT_AFTER


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


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a key belongs to and everything its requests are checked against."""

    key_id: str
    tenant_id: str
    org_id: str | None
    fail_mode: Literal["open", "closed"]
    allowed_routes: frozenset[str] | None  # None: every route
    scope: Scope
    queue_wait_seconds: float | None = None  # the tenant's; None: the route's
    queue_priority: int = 0  # the key's class in the admission queue: higher goes first

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

    def hold_prices(self, route: Route) -> Prices:
        """The prices a request on ``route`` is reserved at: the highest of its chain, and input
        at the cache-write price, so whichever target serves it and however the provider's
        prompt cache bills its input, the hold covers the cost."""
        held = Prices(route.prices.input_nusd, route.prices.output_nusd)
        for r in self.chain(route):
            held = held.highest(r.prices)
        return held

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
        order = {LevelKind.KEY: 0, LevelKind.TENANT: 1, LevelKind.ORG: 2}
        levels = sorted(
            {lv for s in scopes for lv in s.levels}, key=lambda lv: (order[lv.kind], lv.id)
        )
        budgets = list(dict.fromkeys(b for s in scopes for b in s.budgets))
        return Scope(tuple(levels), tuple(budgets))
