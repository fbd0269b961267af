"""The config's settings as the running gateway reads them: plain frozen values.

The file's pydantic models (:mod:`hardcap_core.config.schema`) validate a config and are turned
into these once, at load. Nothing a request runs imports pydantic: importing it and defining the
models is about 150 ms of a cold start (docs/coldstart.md), and a cold start that loads the
build's validated copy (:func:`hardcap_core.config.loader.load_config`) never validates.

The defaults of the ``gateway:`` section (its ``breaker:`` too) and of a route's ``estimator:``
are written here, once: the schema's fields read them (:data:`DEFAULT_GATEWAY`), and so do the
meter and the ledger, which must not import pydantic to learn them. docs/config.md states them
and tests/unit/test_config_defaults.py holds the two equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hardcap_core import env
from hardcap_core.errors import ConfigError

EstimatorKind = Literal["max_tokens", "fixed", "p95"]
# What output a route's provider bills without streaming it (docs/config.md, `unseen_output`;
# hardcap_core/gateway/unseen.py): none, the full thinking of a streamed summary, or reasoning
# it never streams.
UnseenOutput = Literal["none", "summarized_thinking", "silent_reasoning"]

# Server tools (docs/config.md, "Server tools"): a route's server_tool_max_uses, the uses held
# and sent upstream as max_uses when a request bounds none; and its server_tool_input_tokens,
# the input held per use for the results the provider adds to the prompt.
DEFAULT_SERVER_TOOL_MAX_USES = 5
DEFAULT_SERVER_TOOL_INPUT_TOKENS = 20_000

# The longest wait a refusal lets the official SDKs sleep through inside one call; a longer one
# comes with `x-should-retry: false` next to its Retry-After (gateway/answers.py). Why 60 s:
# the `anthropic` SDK (2.15) sleeps whatever Retry-After says (up to 2**32 ms), once per retry,
# 2 retries by default, so a day's wait hung `messages.create` for days; the `openai` SDK
# (3.57) honours up to 120 s and gives up above it; both SDKs honoured only 0 < s <= 60 before
# (Stainless's bound, which code written against them expects). At 60 s a call sleeps at most
# 2 minutes by default, and every wait of a per-minute rate limit (60-second windows) stays
# retryable. Not a config field: it is set by what the SDKs do, not by a deployment.
SDK_RETRY_AFTER_MAX_SECONDS = 60


# The rollup's cadence, on AWS and in `hardcap serve` alike (hardcap_core/rollup/run.py,
# `paced_passes`): a pass starts every ROLLUP_INTERVAL_SECONDS from the start of the one before,
# so a lost cache forgets at most about that much settled usage (docs/design.md, "Losing the
# cache"); a full pass (kept settles charged, every tenant's thresholds and budget use checked)
# comes first and then once every ROLLUP_FULL_SECONDS — on AWS, each invocation's first, and the
# template's RollupSchedule invokes the function every minute. Not config fields: the rollup is
# not the gateway's section, and `hardcap serve --rollup-interval` sets the local one.
ROLLUP_INTERVAL_SECONDS = 5.0
ROLLUP_FULL_SECONDS = 60.0
# A scheduled invocation stops once no pass found work for this long (and at once when its
# first pass finds none): an idle stack pays for one short pass a minute, not ~52 s of passes
# over empty streams, while traffic (a record at least every ROLLUP_LINGER_SECONDS) keeps the
# passes going. What it widens: usage that arrives after a lull this long waits for the next
# scheduled invocation (up to a minute) instead of the next pass (docs/design.md, "Losing the
# cache"). `hardcap serve`'s timer never stops (nothing to save locally).
ROLLUP_LINGER_SECONDS = 20.0


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    """A circuit breaker per upstream, its state shared by every instance through the cache."""

    failures: int = 5  # consecutive failures that open it
    cooldown_seconds: float = 30.0  # how long it stays open before probing
    half_open_probes: int = 1  # requests let through at once to probe an open upstream


@dataclass(frozen=True, slots=True)
class EstimatorSettings:
    """How much output to reserve up front: ``max_tokens``, a ``fixed`` amount, or a rolling p95."""

    kind: EstimatorKind = "max_tokens"
    fixed_tokens: int | None = None
    min_samples: int = 50


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """The ``gateway:`` section: how this gateway talks to the budget server and streams."""

    redis_url: str | None = None
    redis_cluster: bool = False
    reservation_ttl_seconds: float = 120.0
    max_body_bytes: int = 1_048_576
    extend_step_tokens: int = 64
    extend_when_within: int = 32
    truncate_guard_tokens: int = 4
    truncate_guard_ms: float = 50.0
    # Refuse new chat requests (503) while the event loop runs this late; 0: never.
    shed_when_loop_lag_ms: float = 1000.0
    upstream_timeout_seconds: float = 300.0
    # A stream's status line and headers (and any 1xx before them) must all have arrived by
    # then: a provider answers a stream's head before it generates, and a 103 every 0.5 s
    # would otherwise reset the per-read timeout for ever.
    upstream_head_timeout_seconds: float = 60.0
    chars_per_token: float = 4.0
    log_prompts: bool = False
    # How long a request may wait in its tenant's admission queue for holds in flight to
    # settle before it is refused budget_busy (a route or tenant may say otherwise); 0: never.
    queue_wait_seconds: float = 5.0
    # Output tokens per stream in flight that a budget keeps free for those streams' extends.
    extend_headroom_tokens: int = 48
    # Leases (POST /v1/hardcap/leases): how deep sub-leases nest (1: none), the longest TTL.
    lease_max_depth: int = 4
    lease_max_ttl_seconds: float = 86_400.0
    # Stored Responses (``store`` true, the API's default; ledger/stored_responses.py): how
    # long one is kept (OpenAI keeps them 30 days), and the most bytes one record may take
    # (its input items, the chain before it included, and its response): past that it is
    # served but not stored, and its reply says ``store: false``.
    stored_response_ttl_seconds: float = 2_592_000.0
    stored_response_max_bytes: int = 1_048_576
    # An OTLP/HTTP endpoint to export a trace of every chat request to (docs/tracing.md); None:
    # no traces (HARDCAP_OTLP_ENDPOINT or the SDK's OTEL_EXPORTER_OTLP_* variables also set it).
    otlp_endpoint: str | None = None
    breaker: BreakerSettings = field(default_factory=BreakerSettings)


# Every gateway default, for code that needs one without a config (the meter's, the ledger's).
DEFAULT_GATEWAY = GatewaySettings()


def check_redis_url(url: str) -> str:
    """The URL if its scheme is one Redis clients accept; the error never shows the rest."""
    # The URL may hold a password, so the message shows only its scheme.
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in ("redis", "rediss", "unix"):
        shown = f"scheme {scheme!r}" if sep else "no scheme"
        raise ValueError(f"{shown}: use redis://, rediss:// (TLS) or unix://")
    return url


def env_overrides(gateway: GatewaySettings, environ: Mapping[str, str]) -> GatewaySettings:
    """``gateway`` with ``HARDCAP_REDIS_URL``, ``HARDCAP_REDIS_CLUSTER`` and the OTLP endpoint
    (``HARDCAP_OTLP_ENDPOINT``, else the SDK's ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_ENDPOINT``; none at all with ``OTEL_SDK_DISABLED=true``) applied."""
    update: dict[str, Any] = {}
    if url := environ.get(env.REDIS_URL, "").strip():
        try:
            update["redis_url"] = check_redis_url(url)
        except ValueError as exc:
            raise ConfigError(f"{env.REDIS_URL}: {exc}") from None
    if flag := environ.get(env.REDIS_CLUSTER, "").strip().lower():
        if flag not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ConfigError(f"{env.REDIS_CLUSTER}={flag!r}: use true or false")
        update["redis_cluster"] = flag in ("1", "true", "yes", "on")
    if endpoint := otlp_endpoint(environ):
        update["otlp_endpoint"] = endpoint
    if environ.get(env.OTEL_SDK_DISABLED, "").strip().lower() == "true":
        update["otlp_endpoint"] = None
    return dataclasses.replace(gateway, **update) if update else gateway


def otlp_endpoint(environ: Mapping[str, str]) -> str | None:
    """The OTLP endpoint the environment names, ours first, then the SDK's (traces' first)."""
    named = (
        (env.OTLP_ENDPOINT, environ.get(env.OTLP_ENDPOINT, "")),
        (env.OTEL_TRACES_ENDPOINT, environ.get(env.OTEL_TRACES_ENDPOINT, "")),
        (env.OTEL_ENDPOINT, environ.get(env.OTEL_ENDPOINT, "")),
    )
    for name, value in named:
        if value := value.strip():
            try:
                return check_otlp_endpoint(value)
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}") from None
    return None


def check_otlp_endpoint(url: str) -> str:
    """``url`` if it is an http(s) URL (OTLP over HTTP); ValueError otherwise."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest:
        raise ValueError(f"{url!r}: an OTLP/HTTP endpoint is an http:// or https:// URL")
    return url
