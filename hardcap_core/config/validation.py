"""Validating a parsed config: the schema, cross-checks, error messages, and the runtime objects
built from a valid file.

Validation is strict: unknown fields are errors (a typo must not silently drop a budget), and
every error names its field the way it is written, e.g. ``tenants[1].budgets[0].window``.
The budget :class:`~hardcap_core.budgets.Scope` of every key is built here, once, so a request
only looks its key up. The file's schema (one model per section) is in
:mod:`hardcap_core.config.schema`; the reference with every field is ``docs/config.md``.
This is the only place a config meets pydantic; :mod:`hardcap_core.config.loader` imports it
only when a config must be validated.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from hardcap_core.auth import KeyIndex
from hardcap_core.budgets import (
    Dimension,
    Level,
    LevelKind,
    LongContext,
    Prices,
    RateLimit,
    Scope,
    Window,
    per_thousand_uses,
)
from hardcap_core.config.model import Config, Policy, Principal, Route, Upstream, UserTemplate
from hardcap_core.config.schema import (
    BudgetConfig,
    ConfigFile,
    IssuerConfig,
    LevelConfig,
    PriceConfig,
    RateLimitConfig,
    RouteConfig,
    UsersConfig,
)
from hardcap_core.config.settings import GatewaySettings, env_overrides
from hardcap_core.errors import ConfigError
from hardcap_core.ledger.allowances import SharedBudget, SharedKind, SharedLimits, shared_budgets
from hardcap_core.tokenize.images import route_rules


def parse_config(
    data: Any, source: str = "<config>", *, environ: Mapping[str, str] | None = None
) -> Config:
    """Validate parsed YAML and build the config; ``environ`` (default: ``os.environ``) may
    override ``gateway.redis_url`` and ``gateway.redis_cluster``."""
    if data is None:
        raise ConfigError(f"invalid config {source}: the file is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config {source}: the top level must be a mapping")
    try:
        file = ConfigFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_report(source, [_describe(e) for e in exc.errors()])) from None
    problems = list(_cross_check(file))
    if problems:
        raise ConfigError(_report(source, problems))
    settings = file.gateway.settings()
    gateway = env_overrides(settings, os.environ if environ is None else environ)
    return _build(file, gateway, source)


def _build(file: ConfigFile, gateway: GatewaySettings, source: str) -> Config:
    upstreams: dict[str, Upstream] = {}
    for u in file.upstreams:
        timeout = u.timeout_seconds or gateway.upstream_timeout_seconds
        src = u.key_sources()
        upstreams[u.name] = Upstream(
            u.name, u.base_url or "", timeout, src[0] if src else None, u.kind, u.region,
            u.breaker.settings() if u.breaker else gateway.breaker,
            shared=_shared("upstream", u.name, u.budgets, u.rate_limits),
            head_timeout_seconds=u.head_timeout_seconds or gateway.upstream_head_timeout_seconds,
        )  # fmt: skip
    routes: dict[str, Route] = {}
    for r in file.routes:
        prices = _prices(r.price, upstreams[r.upstream].kind)
        routes[r.name] = Route(
            r.name, upstreams[r.upstream], r.model or r.name, r.estimator.settings(),
            Policy(r.policy), prices,
            r.max_output_tokens, r.min_output_reservation, tuple(r.fallbacks),
            r.queue_wait_seconds, unseen_output=r.unseen(upstreams[r.upstream].kind),
            max_pdf_pages=r.max_pdf_pages,
            server_tool_max_uses=r.server_tool_max_uses,
            server_tool_input_tokens=r.server_tool_input_tokens,
            store_responses=r.store_responses,
            tokenizer=r.counted_by(), exact_count=r.exact_count, count_api=r.count_api,
            image_rules=route_rules(
                r.model or r.name, upstreams[r.upstream].kind, r.image_rule,
                r.image_costs.given() if r.image_costs else None,
            ),
            trace_content=r.trace_content,
            shared=_route_shared(r, upstreams[r.upstream]),
        )  # fmt: skip
    orgs = {o.id: o for o in file.orgs}
    by_hash: dict[str, Principal] = {}
    tenant_scopes: dict[str, Scope] = {}
    jwt_tenants: list[tuple[str, frozenset[str], Principal]] = []
    for t in file.tenants:
        chain: list[tuple[Level, LevelConfig]] = [(Level(LevelKind.TENANT, t.id), t)]
        if t.org is not None:
            chain.append((Level(LevelKind.ORG, t.org), orgs[t.org]))
        tenant_scopes[t.id] = _scope(chain)
        allowed = None if t.routes is None else frozenset(t.routes)
        disabled = t.disabled or (t.org is not None and orgs[t.org].disabled)
        users = _users(t.users)
        for k in t.keys:
            scope = _scope([(Level(LevelKind.KEY, k.id), k), *chain])
            by_hash[k.hash] = Principal(
                k.id, t.id, t.org, t.fail_mode, allowed, scope, t.queue_wait_seconds,
                k.queue_priority, users, t.end_users, disabled,
            )  # fmt: skip
        if t.jwt is not None:
            principal = Principal(
                f"jwt.{t.jwt.issuer}", t.id, t.org, t.fail_mode, allowed, tenant_scopes[t.id],
                t.queue_wait_seconds, 0, users, t.end_users, disabled,
            )  # fmt: skip
            jwt_tenants.append((t.jwt.issuer, frozenset(t.jwt.groups), principal))
    return Config(
        gateway, upstreams, routes, source, KeyIndex(by_hash), tenant_scopes,
        tuple(jwt_tenants), tuple(_issuer(n, i) for n, i in enumerate(file.issuers)),
    )  # fmt: skip


def _shared(
    kind: SharedKind, name: str, budgets: list[BudgetConfig], rates: RateLimitConfig | None
) -> tuple[SharedBudget, ...]:
    """A route's or upstream's limits over every tenant (ledger/allowances.py)."""
    probe = Level(LevelKind.TENANT, "t")  # Budget.build's units, without a level of its own
    rows = [(x.dimension, x.limit, x.window) for x in (b.build(probe) for b in budgets)]
    rpm = rates.requests_per_minute if rates else None
    tpm = rates.tokens_per_minute if rates else None
    return shared_budgets(kind, name, rows, rpm, tpm, [tuple(b.notify_at) for b in budgets])


def _route_shared(r: RouteConfig, upstream: Upstream) -> SharedLimits | None:
    """The route's own limits, then its upstream's; None when neither has any."""
    rows = _shared("route", r.name, r.budgets, r.rate_limits) + upstream.shared
    return SharedLimits(rows) if rows else None


def _users(users: UsersConfig | None) -> UserTemplate | None:
    if users is None:
        return None
    probe = Level(LevelKind.TENANT, "t")  # Budget.build's units, without a level of its own
    budgets = tuple(
        (built.dimension, built.limit, built.window)
        for built in (b.build(probe) for b in users.budgets)
    )
    notify_at = tuple(tuple(b.notify_at) for b in users.budgets)
    r = users.rate_limits
    if r is None:
        return UserTemplate(budgets, notify_at=notify_at)
    return UserTemplate(budgets, r.requests_per_minute, r.tokens_per_minute, notify_at)


def _issuer(n: int, i: IssuerConfig) -> Any:
    from hardcap_core.identity import IssuerSettings  # PyJWT itself only with a token

    try:
        return IssuerSettings(
            name=i.name, issuer=i.issuer, jwks_url=i.jwks_url, audiences=tuple(i.audiences),
            algorithms=tuple(i.algorithms), user_claim=i.user_claim, group_claim=i.group_claim,
            leeway_seconds=i.leeway_seconds, jwks_max_age_seconds=i.jwks_max_age_seconds,
        )  # fmt: skip
    except ValueError as e:  # http to a host that is not loopback, an HMAC algorithm
        raise ConfigError(f"invalid config: issuers[{n}]: {e}") from None


def _scope(chain: Sequence[tuple[Level, LevelConfig]]) -> Scope:
    budgets = [b.build(level) for level, rules in chain for b in rules.budgets]
    rates = [
        RateLimit(level, r.requests_per_minute, r.tokens_per_minute)
        for level, rules in chain
        if (r := rules.rate_limits) is not None
        and (r.requests_per_minute is not None or r.tokens_per_minute is not None)
    ]
    return Scope(tuple(level for level, _ in chain), tuple(budgets), tuple(rates))


def _prices(price: PriceConfig | None, kind: str) -> Prices:
    p = price or PriceConfig(input_per_million=0, output_per_million=0)
    # OpenAI-compatible APIs do not bill cache writes: unless the route says, a write costs
    # what input does there, and 1.25x it where the provider bills writes (Anthropic).
    write = p.cache_write_per_million
    if write is None and kind == "openai":
        write = p.input_per_million
    lc = p.long_context
    return Prices.per_million(
        p.input_per_million, p.output_per_million, p.cached_input_per_million, write,
        p.cache_write_1h_per_million, tiers=tuple(sorted(p.service_tiers.items())),
        long_context=lc and LongContext(lc.above_input_tokens, lc.input_multiplier,
                                        lc.output_multiplier),
        # Only an OpenAI-compatible API is sent a request's service_tier (docs/config.md).
        sends_tier=kind == "openai",
        per_use=tuple(
            (tool, per_thousand_uses(usd))
            for tool, usd in (("web_search", p.web_search_per_1000),
                              ("web_fetch", p.web_fetch_per_1000))
            if usd is not None
        ),
    )  # fmt: skip


def _cross_check(file: ConfigFile) -> Iterable[str]:
    """Problems pydantic cannot see field by field: references, duplicates, missing prices."""
    yield from _unique("upstreams", "name", [u.name for u in file.upstreams])
    yield from _unique("routes", "name", [r.name for r in file.routes])
    yield from _unique("orgs", "id", [o.id for o in file.orgs])
    yield from _unique("tenants", "id", [t.id for t in file.tenants])
    keys = [(f"tenants[{i}].keys[{j}]", k) for i, t in enumerate(file.tenants)
            for j, k in enumerate(t.keys)]  # fmt: skip
    yield from _unique_at("id", [(loc, k.id) for loc, k in keys], "key id")
    yield from _unique_at("hash", [(loc, k.hash) for loc, k in keys], "key hash")
    upstreams = [u.name for u in file.upstreams]
    routes = [r.name for r in file.routes]
    orgs = [o.id for o in file.orgs]
    for i, r in enumerate(file.routes):
        yield from _known(f"routes[{i}].upstream", r.upstream, upstreams, "upstream")
        for j, name in enumerate(r.fallbacks):
            yield from _known(f"routes[{i}].fallbacks[{j}]", name, routes, "route")
            if name == r.name:
                yield f"routes[{i}].fallbacks[{j}]: a route cannot fall back to itself"
        if len(set(r.fallbacks)) != len(r.fallbacks):
            yield f"routes[{i}].fallbacks: names a route twice"
        kind = next((u.kind for u in file.upstreams if u.name == r.upstream), "anthropic")
        if r.count_api and kind != "anthropic":
            yield f"routes[{i}].count_api: needs an anthropic upstream (count_tokens), not {kind}"
    yield from _unique("issuers", "name", [i.name for i in file.issuers])
    issuers = [i.name for i in file.issuers]
    for i, t in enumerate(file.tenants):
        if t.org is not None:
            yield from _known(f"tenants[{i}].org", t.org, orgs, "org")
        if t.jwt is not None:
            yield from _known(f"tenants[{i}].jwt.issuer", t.jwt.issuer, issuers, "issuer")
        for j, name in enumerate(t.routes or []):
            yield from _known(f"tenants[{i}].routes[{j}]", name, routes, "route")
    owners: list[tuple[str, LevelConfig | UsersConfig]] = [
        (f"orgs[{i}]", o) for i, o in enumerate(file.orgs)
    ]
    owners += [(f"tenants[{i}]", t) for i, t in enumerate(file.tenants)]
    owners += keys
    owners += [(f"tenants[{i}].users", t.users) for i, t in enumerate(file.tenants) if t.users]
    cost_at = None
    for loc, rules in owners:
        seen: dict[tuple[Dimension, str], int] = {}
        for j, b in enumerate(rules.budgets):
            what = (b.dimension, Window.parse(b.window).spec)
            if what in seen:
                yield f"{loc}.budgets[{j}]: same dimension and window as budgets[{seen[what]}]"
            seen.setdefault(what, j)
            if b.dimension == Dimension.COST_USD and cost_at is None:
                cost_at = f"{loc}.budgets[{j}]"
    for i, r in enumerate(file.routes):
        if r.price is None and cost_at is not None:
            yield (
                f"routes[{i}].price: required because {cost_at} is a cost_usd budget "
                "(write 0 for a free model)"
            )


def _unique(section: str, attr: str, values: list[str]) -> Iterable[str]:
    items = [(f"{section}[{i}]", v) for i, v in enumerate(values)]
    yield from _unique_at(attr, items, f"{section[:-1]} {attr}")


def _unique_at(attr: str, items: list[tuple[str, str]], what: str) -> Iterable[str]:
    first: dict[str, str] = {}
    for loc, value in items:
        if value in first:
            yield f"{loc}.{attr}: duplicate {what} {value!r} (also at {first[value]})"
        first.setdefault(value, loc)


def _known(loc: str, value: str, known: list[str], what: str) -> Iterable[str]:
    if value not in known:
        hint = _hint(value, known, "known") if known else f" (no {what}s are defined)"
        yield f"{loc}: no {what} named {value!r}{hint}"


def _hint(value: str, options: Iterable[str], label: str) -> str:
    options = list(options)
    close = difflib.get_close_matches(value, options, n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" ({label}: {', '.join(options)})" if options else ""


def _report(source: str, problems: list[str]) -> str:
    return f"invalid config {source}:\n" + "\n".join(f"  {p}" for p in problems)


def _describe(err: ErrorDetails) -> str:
    """One pydantic error as ``field.path: what is wrong``."""
    loc = _loc(err["loc"])
    if err["type"] == "extra_forbidden":
        name = str(err["loc"][-1])
        model = _model_at(err["loc"][:-1])
        allowed = list(model.model_fields) if model is not None else []
        return f"{loc}: unknown field{_hint(name, allowed, 'allowed')}"
    if err["type"] == "value_error":
        return f"{loc}: {err.get('ctx', {}).get('error', err['msg'])}"
    if err["type"] == "missing":
        return f"{loc}: required"
    got = err.get("input")
    secret = str(err["loc"][-1]) in _SECRET_FIELDS if err["loc"] else False
    shown = f" (got {got!r})" if isinstance(got, str | int | float | bool) and not secret else ""
    return f"{loc}: {err['msg']}{shown}"


# Fields whose value may be (or be mistaken for) a secret: errors never repeat their value.
_SECRET_FIELDS = frozenset(
    {"hash", "redis_url", "api_key_env", "api_key_secret", "api_key_parameter"}
)


def _loc(parts: Sequence[int | str]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out or "(top level)"


def _model_at(loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model class at a path of ConfigFile, so an unknown field can list the known ones."""
    model: type[BaseModel] | None = ConfigFile
    for part in loc:
        if isinstance(part, str):
            info = model.model_fields.get(part) if model is not None else None
            model = _inner_model(info.annotation) if info is not None else None
    return model


def _inner_model(tp: Any) -> type[BaseModel] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    return next((m for a in get_args(tp) if (m := _inner_model(a)) is not None), None)
