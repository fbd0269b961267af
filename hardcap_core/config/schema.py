"""The YAML schema of the config file: one pydantic model per section, with field validators.

These models only check each field where it is written (types, ranges, formats, unknown fields).
Checks across sections, error messages and the runtime objects built from a valid file live in
:mod:`hardcap_core.config.validation`; the reference with every field is ``docs/config.md``.
The gateway never holds these models: a valid file becomes :mod:`hardcap_core.config.settings`
values and :mod:`hardcap_core.config.model` objects, so a request never imports pydantic.

Defaults: a field's default is written here unless the running gateway needs it without
pydantic; then it is written once in the pydantic-free settings it becomes (the ``gateway:``
section, its breaker and a route's estimator: :mod:`hardcap_core.config.settings`), and the
field reads it from there. docs/config.md states every default; tests/unit/test_config_defaults.py
holds the docs, the settings, the meter, the ledger and the providers equal to these.
"""

from __future__ import annotations

import re
from decimal import ROUND_FLOOR, Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from hardcap_core.auth import is_key_hash
from hardcap_core.budgets import (
    DEFAULT_NOTIFY_AT,
    ID_PATTERN,
    NANO_USD_PER_USD,
    Budget,
    Dimension,
    Level,
    Window,
)
from hardcap_core.config.secrets import KeySource, KeySourceKind
from hardcap_core.config.settings import (
    DEFAULT_GATEWAY,
    DEFAULT_SERVER_TOOL_INPUT_TOKENS,
    DEFAULT_SERVER_TOOL_MAX_USES,
    EstimatorSettings,
    GatewaySettings,
    UnseenOutput,
    check_otlp_endpoint,
)

# BreakerSettings and check_redis_url re-exported: they were defined here (ledger/breakers.py).
from hardcap_core.config.settings import BreakerSettings as BreakerSettings
from hardcap_core.config.settings import check_redis_url as check_redis_url

# Lua numbers are doubles: the ledger adds integers exactly only up to 2**53.
MAX_EXACT = 2**53
ROUTE_NAME_PATTERN = r"^[A-Za-z0-9_.:/\-]{1,128}$"

Id = Annotated[str, Field(pattern=ID_PATTERN.pattern)]
RouteName = Annotated[str, Field(pattern=ROUTE_NAME_PATTERN)]
NonEmpty = Annotated[str, Field(min_length=1)]
PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]


class _Model(BaseModel):
    # Numbers are accepted where text is expected so that `id: 42` is not an error.
    # defer_build: a model's validator is built on its first validation, not when the class is
    # defined (about 20 ms for all of them): code that imports this module to validate nothing
    # (the build, tests of other modules) does not pay for it.
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
        coerce_numbers_to_str=True,
        defer_build=True,
    )


# The defaults of the runtime settings these models become (see the module's docstring).
# An issuer's are written below: reading identity/issuers.py would import the gateway's
# transport and Powertools wherever a config is validated.
_G = DEFAULT_GATEWAY
_BREAKER = DEFAULT_GATEWAY.breaker
_ESTIMATOR = EstimatorSettings()


class BreakerConfig(_Model):
    """A circuit breaker per upstream, its state shared by every instance through the cache."""

    failures: PosInt = _BREAKER.failures
    cooldown_seconds: PosFloat = _BREAKER.cooldown_seconds
    half_open_probes: PosInt = _BREAKER.half_open_probes

    def settings(self) -> BreakerSettings:
        return BreakerSettings(self.failures, self.cooldown_seconds, self.half_open_probes)


class GatewayConfig(_Model):
    """The ``gateway:`` section: how this gateway talks to the budget server and streams."""

    redis_url: str | None = _G.redis_url
    redis_cluster: bool = _G.redis_cluster
    reservation_ttl_seconds: PosFloat = _G.reservation_ttl_seconds
    max_body_bytes: PosInt = _G.max_body_bytes
    extend_step_tokens: PosInt = _G.extend_step_tokens
    extend_when_within: NonNegInt = _G.extend_when_within
    truncate_guard_tokens: NonNegInt = _G.truncate_guard_tokens
    truncate_guard_ms: NonNegFloat = _G.truncate_guard_ms
    shed_when_loop_lag_ms: NonNegFloat = _G.shed_when_loop_lag_ms
    upstream_timeout_seconds: PosFloat = _G.upstream_timeout_seconds
    upstream_head_timeout_seconds: PosFloat = _G.upstream_head_timeout_seconds
    chars_per_token: PosFloat = _G.chars_per_token
    log_prompts: bool = _G.log_prompts
    queue_wait_seconds: NonNegFloat = _G.queue_wait_seconds
    extend_headroom_tokens: NonNegInt = _G.extend_headroom_tokens
    lease_max_depth: PosInt = _G.lease_max_depth
    lease_max_ttl_seconds: PosFloat = _G.lease_max_ttl_seconds
    stored_response_ttl_seconds: PosFloat = _G.stored_response_ttl_seconds
    stored_response_max_bytes: PosInt = _G.stored_response_max_bytes
    otlp_endpoint: str | None = _G.otlp_endpoint
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        return None if v is None else check_redis_url(v)

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_endpoint(cls, v: str | None) -> str | None:
        return None if v is None else check_otlp_endpoint(v)

    def settings(self) -> GatewaySettings:
        fields = {name: getattr(self, name) for name in GatewaySettings.__dataclass_fields__}
        return GatewaySettings(**{**fields, "breaker": self.breaker.settings()})


class UpstreamConfig(_Model):
    name: Id
    # What it speaks: an OpenAI-compatible API, Anthropic's Messages API, or Amazon Bedrock's
    # Converse API (signed with the function's IAM role: no API key).
    kind: Literal["openai", "anthropic", "bedrock"] = "openai"
    base_url: str | None = None  # required but for bedrock (which defaults to its region's)
    region: NonEmpty | None = None  # bedrock: the AWS region (default: the function's own)
    api_key_env: NonEmpty | None = None
    api_key_secret: NonEmpty | None = None
    api_key_parameter: NonEmpty | None = None
    timeout_seconds: PosFloat | None = None
    head_timeout_seconds: PosFloat | None = None
    breaker: BreakerConfig | None = None  # default: the gateway's `breaker`
    # The org's own account with the provider, over every tenant and route on it: budgets and
    # per-minute rates (set them at 85-90% of the vendor's limits, so the gateway refuses first).
    budgets: list[BudgetConfig] = []
    rate_limits: RateLimitConfig | None = None

    @field_validator("budgets")
    @classmethod
    def _budgets(cls, v: list[BudgetConfig]) -> list[BudgetConfig]:
        return distinct_budgets(v)

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        scheme, sep, rest = v.partition("://")
        if not sep or scheme.lower() not in ("http", "https") or not rest.strip("/"):
            raise ValueError(f"{v!r} is not an http(s) URL like https://api.openai.com/v1")
        return v.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        # Never echo the value: a key pasted here by mistake must not end up in logs.
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError("the name of an environment variable, like OPENAI_API_KEY")
        return v

    @model_validator(mode="after")
    def _one_key_source(self) -> UpstreamConfig:
        if len(self.key_sources()) > 1:
            raise ValueError("set at most one of api_key_env, api_key_secret, api_key_parameter")
        if self.kind == "bedrock" and self.key_sources():
            raise ValueError("a bedrock upstream signs with the function's IAM role: no API key")
        if self.kind != "bedrock" and self.base_url is None:
            raise ValueError(f"a {self.kind} upstream needs base_url")
        if self.kind != "bedrock" and self.region is not None:
            raise ValueError("region is only used by a bedrock upstream")
        return self

    def key_sources(self) -> list[KeySource]:
        found: list[tuple[KeySourceKind, str | None]] = [
            ("env", self.api_key_env),
            ("secret", self.api_key_secret),
            ("parameter", self.api_key_parameter),
        ]
        return [KeySource(kind, name) for kind, name in found if name is not None]


class EstimatorConfig(_Model):
    """How much output to reserve up front: ``max_tokens``, a ``fixed`` amount, or a rolling p95."""

    kind: Literal["max_tokens", "fixed", "p95"] = _ESTIMATOR.kind
    fixed_tokens: PosInt | None = _ESTIMATOR.fixed_tokens
    min_samples: PosInt = _ESTIMATOR.min_samples

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"kind": data} if isinstance(data, str) else data  # `estimator: p95`

    @model_validator(mode="after")
    def _fixed(self) -> EstimatorConfig:
        if self.kind == "fixed" and self.fixed_tokens is None:
            raise ValueError("kind 'fixed' needs fixed_tokens")
        if self.kind != "fixed" and self.fixed_tokens is not None:
            raise ValueError(f"fixed_tokens is only used with kind 'fixed', not {self.kind!r}")
        return self

    def settings(self) -> EstimatorSettings:
        return EstimatorSettings(self.kind, self.fixed_tokens, self.min_samples)


class LongContextConfig(_Model):
    """A dearer price past a prompt size: every token of a request with more input than this
    is billed at the route's prices times these multipliers."""

    above_input_tokens: PosInt
    input_multiplier: PosFloat
    output_multiplier: PosFloat


class PriceConfig(_Model):
    input_per_million: NonNegFloat
    output_per_million: NonNegFloat
    # Input read from the provider's prompt cache (OpenAI cached_tokens, Anthropic
    # cache_read_input_tokens) and written to it (Anthropic cache_creation_input_tokens).
    # Unset: read at the input price, written at 1.25x it (Anthropic's 5-minute write price),
    # and at 2x it when kept an hour, so a route that does not say is never under-charged.
    cached_input_per_million: NonNegFloat | None = None
    cache_write_per_million: NonNegFloat | None = None
    cache_write_1h_per_million: NonNegFloat | None = None
    # Service tiers other than the standard one, each a multiplier of every price (priority:
    # 2, flex: 0.5); a request naming a tier not listed is refused (docs/config.md).
    service_tiers: dict[Annotated[str, Field(pattern=ID_PATTERN.pattern)], PosFloat] = {}
    long_context: LongContextConfig | None = None
    # Server tools the provider runs and bills per use, on top of tokens (Anthropic: web
    # search $10 per 1,000 searches; web fetch no fee, only the tokens of what it fetched, so
    # 0 opts in). Unset: the route does not price the tool, and a request using it is refused
    # with a 400 naming the tool. Each is held per use up to the request's max_uses (or the
    # route's server_tool_max_uses), and charged per use the provider reports.
    web_search_per_1000: NonNegFloat | None = None
    web_fetch_per_1000: NonNegFloat | None = None

    @field_validator("service_tiers")
    @classmethod
    def _tiers(cls, v: dict[str, float]) -> dict[str, float]:
        standard = sorted(set(v) & {"auto", "default", "standard"})
        if standard:
            raise ValueError(f"{standard[0]!r} is the standard tier: its prices are the route's")
        return v


# A route's default `unseen_output`, by its upstream model (`model`, else its name): the first
# pattern found in the lowercased name; none found, "none" (docs/config.md has the table and
# its sources). Claude 4 and later stream a summary of their thinking and bill all of it;
# OpenAI's reasoning models bill reasoning they never stream.
UNSEEN_OUTPUT_BY_MODEL: tuple[tuple[re.Pattern[str], UnseenOutput], ...] = (
    # claude-sonnet-4-5, claude-opus-4-1-20250805, anthropic.claude-sonnet-4-20250514-v1:0,
    # claude-4-opus, anthropic/claude-opus-4.1; not claude-3-7-sonnet, which streams it all.
    (re.compile(r"claude-(?:[a-z]+-)?(?:[4-9]|[1-9][0-9])(?![0-9])"), "summarized_thinking"),
    # o1, o3-mini, o4-mini-2025-04-16, openai/o3; gpt-5, gpt-5-mini, gpt-5.1-codex (not
    # gpt-5-chat-latest, which does not reason); codex-mini-latest.
    (re.compile(r"(?:^|[/.:])o[1-9](?:-|$)"), "silent_reasoning"),
    (re.compile(r"(?:^|[/.:])gpt-5(?![0-9a-z.-]*-chat)"), "silent_reasoning"),
    (re.compile(r"(?:^|[/.:])codex-mini"), "silent_reasoning"),
)


# Upstream kinds whose models take Anthropic's `thinking` (Anthropic's API; Bedrock, where only
# Claude takes it): a request that turns thinking on there thinks as Claude 4 does, billed in
# full and streamed as a summary, whatever the model's name says (an alias, a name with no
# version, an application inference profile's ARN). Their routes default to
# "summarized_thinking", which acts only on a request with thinking on; the model's family may
# make it stricter ("silent_reasoning"), never looser: a route whose model streams all of its
# thinking says `unseen_output: none`.
THINKING_KINDS = frozenset({"anthropic", "bedrock"})


def default_unseen_output(model: str, upstream_kind: str = "openai") -> UnseenOutput:
    """What ``model`` on an upstream of ``upstream_kind`` bills without streaming it: by its
    family (:data:`UNSEEN_OUTPUT_BY_MODEL`), and at least summarized thinking on an upstream
    whose models take Anthropic's ``thinking`` (:data:`THINKING_KINDS`)."""
    name = model.lower()
    none: UnseenOutput = "none"
    kind = next((k for pattern, k in UNSEEN_OUTPUT_BY_MODEL if pattern.search(name)), none)
    if kind == "none" and upstream_kind in THINKING_KINDS:
        return "summarized_thinking"
    return kind


# How a route counts a request's input (hardcap_core/tokenize/): an exact BPE encoding shipped
# with the package, "anthropic" (Claude's tokenizer is not public: a bound calibrated on
# cl100k_base, optionally Anthropic's count API), or "bound" (the upper bound by character
# class, hardcap_core/tokenize/heuristics.py).
Tokenizer = Literal["o200k_base", "cl100k_base", "anthropic", "bound"]
# A route's default `tokenizer`, by its upstream model (`model`, else its name): the first pattern
# found in the lowercased name; none found, "bound" (docs/config.md has the table). OpenAI's
# model pages name the encodings (tiktoken's model.py maps the same prefixes).
TOKENIZER_BY_MODEL: tuple[tuple[re.Pattern[str], Tokenizer], ...] = (
    # gpt-4o, gpt-4o-mini, chatgpt-4o-latest, gpt-4.1, gpt-4.5, gpt-5*, o1, o3-mini, o4-mini,
    # codex-mini; before gpt-4, which they start with.
    (
        re.compile(r"gpt-4o|gpt-4\.[15]|gpt-5|(?:^|[/.:])(?:o[1-9](?:-|$)|codex-mini)"),
        "o200k_base",
    ),
    (re.compile(r"(?:^|[/.:])(?:gpt-4|gpt-3\.5)"), "cl100k_base"),
    # claude-sonnet-4-5, anthropic.claude-3-haiku-20240307-v1:0 (Bedrock), anthropic/claude-x.
    (re.compile(r"claude"), "anthropic"),
)


def default_tokenizer(model: str) -> Tokenizer:
    """How ``model``'s input is counted, by its family (:data:`TOKENIZER_BY_MODEL`)."""
    name = model.lower()
    return next((kind for pattern, kind in TOKENIZER_BY_MODEL if pattern.search(name)), "bound")


# Which numbers each named image rule takes (hardcap_core/tokenize/images.py).
IMAGE_COST_FIELDS = {
    "tile": frozenset({"base_tokens", "tile_tokens"}),
    "patch": frozenset({"multiplier", "max_patches"}),
    "anthropic": frozenset({"long_edge", "max_tokens"}),
}


class ImageCostsConfig(_Model):
    """A route's own numbers for its ``image_rule``; each left out is its family's, else the
    dearest known (docs/config.md, "Images")."""

    base_tokens: PosInt | None = None
    tile_tokens: PosInt | None = None
    multiplier: PosFloat | None = None
    max_patches: PosInt | None = None
    long_edge: PosInt | None = None
    max_tokens: PosInt | None = None

    def given(self) -> dict[str, float]:
        """The numbers set, by name."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class RouteConfig(_Model):
    name: RouteName
    upstream: Id
    model: NonEmpty | None = None
    estimator: EstimatorConfig = Field(default_factory=EstimatorConfig)
    policy: Literal["truncate", "allow", "count_after"] = "truncate"
    price: PriceConfig | None = None
    max_output_tokens: PosInt = 4096
    min_output_reservation: PosInt = 16
    # A server tool's max_uses when a request sets none: sent upstream as that field, so the
    # provider stops there, and held as that many uses (money.py, tool_hold).
    server_tool_max_uses: PosInt = DEFAULT_SERVER_TOOL_MAX_USES
    # Input tokens held per server-tool use for the results the provider adds to the prompt
    # of its next sampling turn (billed as input). web_fetch is sent this as its
    # max_content_tokens when the request sets none, which bounds what a fetch adds.
    server_tool_input_tokens: PosInt = DEFAULT_SERVER_TOOL_INPUT_TOKENS
    # How long a request may wait for holds in flight (default: the gateway's).
    queue_wait_seconds: NonNegFloat | None = None
    # The most PDF pages a request may carry, all documents together (default: no cap but the
    # gateway's own, hardcap_core/wire/pdf.py MAX_PAGES); more is a 400.
    max_pdf_pages: PosInt | None = None
    # Whether the gateway keeps this route's Responses (``store``, previous_response_id, GET
    # /v1/responses/{id}); false: none is kept, and previous_response_id is a 400.
    store_responses: bool = True
    # Other routes tried in order when this one's upstream fails before any byte reached the
    # client (429, 5xx, timeout, connection error) or its breaker is open. Each is priced and
    # capped as itself; the reservation is made at the highest prices of the chain.
    fallbacks: list[RouteName] = []
    # Output its provider bills without streaming it: none, summarized_thinking (the full
    # thinking of a streamed summary) or silent_reasoning (default: by the model's family, and
    # at least summarized_thinking on an anthropic or bedrock upstream: THINKING_KINDS).
    unseen_output: UnseenOutput | None = None
    # How its input is counted (default: by the model's family, TOKENIZER_BY_MODEL). The cheap
    # upper bound is reserved first; the tokenizer's count replaces it where the bound does not
    # fit (exact_count: when_needed), or on every request (always).
    tokenizer: Tokenizer | None = None
    exact_count: Literal["when_needed", "always"] = "when_needed"
    # tokenizer anthropic on an anthropic upstream: ask its count_tokens endpoint (a short
    # timeout; the calibrated bound when it does not answer in time).
    count_api: bool = False
    # How its images are billed (default auto: by the model's family, FAMILIES in
    # hardcap_core/tokenize/images.py, every rule's dearest for a model it does not know); or
    # tile, patch, anthropic with image_costs' numbers (docs/config.md has the table).
    image_rule: Literal["auto", "tile", "patch", "anthropic"] = "auto"
    image_costs: ImageCostsConfig | None = None
    # Put the prompt and the completion in the request's trace (gen_ai.input.messages,
    # gen_ai.output.messages: docs/tracing.md); off, a trace holds no text of either.
    trace_content: bool = False
    # Limits on this route over every tenant (checked with each tenant's own in one admit).
    budgets: list[BudgetConfig] = []
    rate_limits: RateLimitConfig | None = None

    @field_validator("budgets")
    @classmethod
    def _budgets(cls, v: list[BudgetConfig]) -> list[BudgetConfig]:
        return distinct_budgets(v)

    def unseen(self, upstream_kind: str = "openai") -> UnseenOutput:
        """``unseen_output``, or the default of the model's family on an upstream of
        ``upstream_kind``."""
        return self.unseen_output or default_unseen_output(self.model or self.name, upstream_kind)

    def counted_by(self) -> Tokenizer:
        """``tokenizer``, or the default of the model's family."""
        return self.tokenizer or default_tokenizer(self.model or self.name)

    @model_validator(mode="after")
    def _reservation(self) -> RouteConfig:
        if self.image_costs is not None:
            allowed = IMAGE_COST_FIELDS.get(self.image_rule, frozenset())
            wrong = sorted(set(self.image_costs.given()) - allowed)
            if wrong or not self.image_costs.given():
                raise ValueError(
                    f"image_costs {', '.join(wrong) or '(empty)'} do not apply to image_rule "
                    f"{self.image_rule!r}: tile takes base_tokens, tile_tokens; patch takes "
                    "multiplier, max_patches; anthropic takes long_edge, max_tokens"
                )
        if self.count_api and self.counted_by() != "anthropic":
            raise ValueError(f"count_api needs tokenizer anthropic, not {self.counted_by()!r}")
        if self.min_output_reservation > self.max_output_tokens:
            raise ValueError(
                f"min_output_reservation ({self.min_output_reservation}) is more than "
                f"max_output_tokens ({self.max_output_tokens})"
            )
        return self


class BudgetConfig(_Model):
    dimension: Dimension
    limit: Annotated[Decimal, Field(ge=0)]
    window: str
    # Percent of the limit at which the rollup notifies, once per window; [] notifies never.
    # Past 100: a policy that lets spend run over the limit (allow, count_after) can cross it.
    notify_at: list[Annotated[int, Field(ge=1, le=1000)]] = list(DEFAULT_NOTIFY_AT)

    @field_validator("notify_at")
    @classmethod
    def _notify_at(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"each threshold once, not {v}")
        return sorted(v)

    @field_validator("limit")
    @classmethod
    def _limit(cls, v: Decimal, info: ValidationInfo) -> Decimal:
        if info.data.get("dimension") == Dimension.COST_USD:
            if v * NANO_USD_PER_USD > MAX_EXACT:
                raise ValueError(f"at most {MAX_EXACT // NANO_USD_PER_USD} USD")
        elif v != v.to_integral_value():
            raise ValueError(f"a token limit is a whole number, not {v}")
        elif v > MAX_EXACT:
            raise ValueError(f"at most {MAX_EXACT} tokens")
        return v

    @field_validator("window")
    @classmethod
    def _window(cls, v: str) -> str:
        Window.parse(v)  # its ValueError says what is accepted
        return v.strip().lower()

    def build(self, level: Level) -> Budget:
        """The budget at ``level``; cost limits go from USD to nano-USD, rounded down."""
        scale = NANO_USD_PER_USD if self.dimension == Dimension.COST_USD else 1
        limit = int((self.limit * scale).to_integral_value(ROUND_FLOOR))
        window = Window.parse(self.window)
        return Budget(level, self.dimension, limit, window, tuple(self.notify_at))


def distinct_budgets(budgets: list[BudgetConfig]) -> list[BudgetConfig]:
    """A route's or upstream's budgets, each dimension at most once per window (two would be
    one counter)."""
    seen: set[tuple[str, str]] = set()
    for b in budgets:
        at = (str(b.dimension), Window.parse(b.window).spec)
        if at in seen:
            raise ValueError(f"two {b.dimension} budgets over the window {b.window!r}")
        seen.add(at)
    return budgets


class RateLimitConfig(_Model):
    # Zero would mean "no limit" to the ledger, so it is refused: omit the field instead.
    requests_per_minute: PosInt | None = None
    tokens_per_minute: PosInt | None = None


class LevelConfig(_Model):
    """What an org, a tenant and a key have in common: an id, budgets and rate limits."""

    id: Id
    budgets: list[BudgetConfig] = []
    rate_limits: RateLimitConfig | None = None


class KeyConfig(LevelConfig):
    hash: str
    # Waiting for budget, this key's requests go ahead of every lower class (0 to 9).
    queue_priority: Annotated[int, Field(ge=0, le=9)] = 0

    @field_validator("hash")
    @classmethod
    def _hash(cls, v: str) -> str:
        if is_key_hash(v):
            return v
        if not v.startswith("sha256:"):
            raise ValueError("store the key's hash (sha256:...), never the key itself")
        raise ValueError("expected sha256: and 64 lowercase hex digits (see `hardcap keys new`)")


class OrgConfig(LevelConfig):
    disabled: bool = False  # every tenant under it is refused (403) until enabled again


class UsersConfig(_Model):
    """What every user of a tenant gets, created on first use: the user level's budgets and
    rate limits (a user from a verified token's claim, or an end user the request names)."""

    budgets: list[BudgetConfig] = []
    rate_limits: RateLimitConfig | None = None


class TenantJwtConfig(_Model):
    """Which verified tokens belong to this tenant: those of ``issuer`` (a name in the file's
    ``issuers:``) whose group claim holds one of ``groups``."""

    issuer: Id
    groups: Annotated[list[NonEmpty], Field(min_length=1)]


class TenantConfig(LevelConfig):
    org: Id | None = None
    fail_mode: Literal["closed", "open"] = "closed"
    # How long this tenant's requests may wait for holds in flight (default: the route's).
    queue_wait_seconds: NonNegFloat | None = None
    routes: list[RouteName] | None = None
    keys: list[KeyConfig] = []
    disabled: bool = False  # its keys and tokens are refused (403) until enabled again
    # The user level's template: every user (from a token, or an end user) gets these budgets.
    users: UsersConfig | None = None
    # Budgets per end user of the tenant's own app, named by the request's `user` (OpenAI) or
    # `metadata.user_id` (Anthropic): off, optional (a request without one has no user level)
    # or required (a request without one is a 400 naming the field). Needs `users`.
    end_users: Literal["off", "optional", "required"] = "off"
    jwt: TenantJwtConfig | None = None  # accept OIDC tokens mapped to this tenant

    @field_validator("end_users", mode="before")
    @classmethod
    def _end_users_off(cls, v: Any) -> Any:
        # YAML 1.1 reads the documented `end_users: off` as false.
        return "off" if v is False else v

    @model_validator(mode="after")
    def _users(self) -> TenantConfig:
        if self.end_users != "off" and self.users is None:
            raise ValueError(f"end_users {self.end_users!r} needs `users:` (their budgets)")
        return self


class IssuerConfig(_Model):
    """An OIDC issuer whose JWT bearer tokens the gateway accepts (docs/config.md)."""

    name: Id
    issuer: NonEmpty  # the `iss` a token must carry, exactly
    jwks_url: NonEmpty
    audiences: Annotated[list[NonEmpty], Field(min_length=1)]
    algorithms: list[Literal["RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA"]] = [
        "RS256",
        "ES256",
        "PS256",
        "EdDSA",
    ]
    user_claim: NonEmpty = "sub"
    group_claim: NonEmpty = "groups"
    leeway_seconds: NonNegFloat = 30.0
    jwks_max_age_seconds: PosFloat = 600.0


class ConfigFile(_Model):
    """The whole file, as written (validated, not yet resolved into routes and scopes)."""

    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    upstreams: list[UpstreamConfig] = []
    routes: list[RouteConfig] = []
    issuers: list[IssuerConfig] = []
    orgs: list[OrgConfig] = []
    tenants: list[TenantConfig] = []
