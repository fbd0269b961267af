"""What a request is checked against: budgets, windows, rate limits, and the hierarchy they hang on.

These are plain values built from the config. The ledger turns them into Redis keys and script
arguments; nothing here talks to the server.

Units: tokens are integers; money is integer nano-USD (1 USD = 1_000_000_000 nUSD) so that Lua,
which only has doubles, adds it exactly up to about 9 million dollars.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from fractions import Fraction
from typing import Any

NANO_USD_PER_USD = 1_000_000_000
ID_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
# A user level's id: its tenant's id, "~", then the user (what a token's claim or a request's
# end-user field said, or a digest of it: hardcap_core/gateway/callers.py), so that users of
# two tenants under one org never share a level.
USER_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}~[A-Za-z0-9_.@+\-]{1,96}$")


class Dimension(StrEnum):
    """What a budget counts."""

    INPUT_TOKENS = "input_tokens"
    OUTPUT_TOKENS = "output_tokens"
    TOTAL_TOKENS = "total_tokens"
    COST_USD = "cost_usd"

    @property
    def short(self) -> str:
        return _DIM_SHORT[self]


_DIM_SHORT = {
    Dimension.INPUT_TOKENS: "in",
    Dimension.OUTPUT_TOKENS: "out",
    Dimension.TOTAL_TOKENS: "tot",
    Dimension.COST_USD: "usd",
}
DIMENSION_BY_SHORT = {v: k for k, v in _DIM_SHORT.items()}


class LevelKind(StrEnum):
    """A level of the hierarchy: an API key belongs to a tenant, a tenant may belong to an org,
    and a request may be one user's (of a verified token, or an end user the request names)."""

    KEY = "key"
    USER = "user"
    TENANT = "tenant"
    ORG = "org"

    @property
    def short(self) -> str:
        return self.value[0]


LEVEL_BY_SHORT = {k.short: k for k in LevelKind}


@dataclass(frozen=True, slots=True)
class Level:
    kind: LevelKind
    id: str

    def __post_init__(self) -> None:
        pattern = USER_ID_PATTERN if self.kind is LevelKind.USER else ID_PATTERN
        if not pattern.match(self.id):
            raise ValueError(f"{self.kind.value} id {self.id!r} must match {pattern.pattern}")

    @property
    def tag(self) -> str:
        """Compact name used inside Redis hashes, e.g. ``t:acme``."""
        return f"{self.kind.short}:{self.id}"

    def __str__(self) -> str:
        return f"{self.kind.value} {self.id}"


@dataclass(frozen=True, slots=True)
class WindowBounds:
    """One concrete window: its id (part of a key name) and [start, end) in epoch milliseconds."""

    spec: str
    id: str
    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class Window:
    """A budget window: ``fixed`` N seconds from the epoch, or calendar ``day``/``month`` UTC."""

    kind: str  # "fixed" | "day" | "month"
    seconds: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "day", "month"):
            raise ValueError(f"unknown window kind {self.kind!r}")
        if self.kind == "fixed" and self.seconds <= 0:
            raise ValueError("a fixed window needs seconds > 0")

    @classmethod
    def parse(cls, text: str) -> Window:
        """``day``, ``month``, or a fixed length such as ``3600s``, ``60m``, ``24h``, ``7d``."""
        text = text.strip().lower()
        if text in ("day", "month"):
            return cls(text)
        m = re.fullmatch(r"(\d+)\s*([smhd])", text)
        if not m:
            raise ValueError(
                f"window {text!r}: use day, month, or a length like 3600s, 60m, 24h, 7d"
            )
        mult = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return cls("fixed", int(m.group(1)) * mult)

    @property
    def spec(self) -> str:
        """Short stable name used in key names: ``d``, ``m`` or ``f<seconds>``."""
        return {"day": "d", "month": "m"}.get(self.kind, f"f{self.seconds}")

    def bounds(self, now_ms: int) -> WindowBounds:
        """The window containing ``now_ms``."""
        if self.kind == "fixed":
            length = self.seconds * 1000
            n = now_ms // length
            return WindowBounds(self.spec, str(n), n * length, (n + 1) * length)
        t = datetime.fromtimestamp(now_ms / 1000, UTC)
        if self.kind == "day":
            start = datetime(t.year, t.month, t.day, tzinfo=UTC)
            start_ms = int(calendar.timegm(start.timetuple())) * 1000
            end_ms = start_ms + 86_400_000
            return WindowBounds(self.spec, start.strftime("%Y%m%d"), start_ms, end_ms)
        start = datetime(t.year, t.month, 1, tzinfo=UTC)
        nxt = datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=UTC)
        return WindowBounds(
            self.spec,
            start.strftime("%Y%m"),
            int(calendar.timegm(start.timetuple())) * 1000,
            int(calendar.timegm(nxt.timetuple())) * 1000,
        )


# A budget's notification thresholds unless its config says otherwise (percent of its limit).
DEFAULT_NOTIFY_AT = (50, 80, 100)


@dataclass(frozen=True, slots=True)
class Budget:
    """A hard limit on one dimension at one level over one window."""

    level: Level
    dimension: Dimension
    limit: int  # tokens, or nano-USD for cost
    window: Window
    # Percent of the limit at which the rollup notifies, once per window (rollup/notify.py).
    # Not part of a budget's identity: the ledger counts the same whatever it notifies at.
    notify_at: tuple[int, ...] = field(default=DEFAULT_NOTIFY_AT, compare=False)

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise ValueError("a budget limit cannot be negative")

    @property
    def field(self) -> str:
        """The hash field this budget is stored under: ``<level tag>:<dim>:<window spec>``."""
        return f"{self.level.tag}:{self.dimension.short}:{self.window.spec}"


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Rate limits on one level: requests per minute (sliding window), tokens per minute (any
    sliding 60 s window holds at most that many input + output tokens; lua/lib.lua)."""

    level: Level
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


# Service tiers a provider reports for its standard price: OpenAI's "default", Anthropic's
# "standard". A request may also name "auto" (its project's default, whatever that is).
STANDARD_TIERS = frozenset({"default", "standard"})


@dataclass(frozen=True, slots=True)
class LongContext:
    """A dearer price past a prompt size: a request of more than ``above_input_tokens`` input
    tokens (cache reads and writes included) is billed every token at its prices times these
    multipliers (Anthropic's long-context pricing, OpenAI's on its 1M-context models)."""

    above_input_tokens: int
    input_multiplier: float
    output_multiplier: float


@dataclass(frozen=True, slots=True)
class Terms:
    """What a request asks for that changes its price."""

    tier: str | None = None  # the service_tier it names (None: none)
    cache_1h: bool = False  # it marks a prompt-cache write to be kept an hour


NO_TERMS = Terms()


@dataclass(frozen=True, slots=True)
class Prices:
    """Price per token in nano-USD, rounded up from the config's USD per million tokens.

    Cached input (read from the provider's prompt cache) and cache writes have prices of their
    own; by default a read costs what input costs, a write 1.25x and a write kept an hour 2x
    (never under-charged). A service tier scales every price by its multiplier (``tiers``), a
    long-context tier by its own (``long_context``); multipliers stack, each price is rounded
    up. ``terms`` are the request's (:meth:`with_terms`): the tier it asked, whether it marks
    hour-long cache writes."""

    input_nusd: int = 0
    output_nusd: int = 0
    cached_input_nusd: int | None = None  # None: input_nusd
    cache_write_nusd: int | None = None  # None: 1.25 x input_nusd, rounded up
    cache_write_1h_nusd: int | None = None  # None: 2 x input_nusd
    tiers: tuple[tuple[str, float], ...] = ()  # service tier -> multiplier of every price
    long_context: LongContext | None = None
    sends_tier: bool = True  # the upstream is sent the request's service_tier
    terms: Terms = NO_TERMS
    # Server tools billed per use (Anthropic's web search, web fetch), by kind: nUSD a use,
    # rounded up. A kind not listed is not priced here: a request using it is refused.
    per_use: tuple[tuple[str, int], ...] = ()

    @classmethod
    def per_million(
        cls,
        input_usd: float,
        output_usd: float,
        cached_input_usd: float | None = None,
        cache_write_usd: float | None = None,
        cache_write_1h_usd: float | None = None,
        **more: Any,
    ) -> Prices:
        """Prices from USD per million tokens; ``more``: the other fields, as they are."""
        # $ per 1M tokens -> nUSD per token is a factor of 1000; round up so we never undercharge.
        return cls(
            _ceil_thousand(input_usd),
            _ceil_thousand(output_usd),
            None if cached_input_usd is None else _ceil_thousand(cached_input_usd),
            None if cache_write_usd is None else _ceil_thousand(cache_write_usd),
            None if cache_write_1h_usd is None else _ceil_thousand(cache_write_1h_usd),
            **more,
        )

    @property
    def cached_read(self) -> int:
        return self.input_nusd if self.cached_input_nusd is None else self.cached_input_nusd

    @property
    def cache_write(self) -> int:
        if self.cache_write_nusd is not None:
            return self.cache_write_nusd
        return -(-self.input_nusd * 5 // 4)

    @property
    def cache_write_1h(self) -> int:
        if self.cache_write_1h_nusd is not None:
            return self.cache_write_1h_nusd
        return self.input_nusd * 2

    @property
    def free(self) -> bool:
        """Every price is 0: whatever a tier multiplies, it stays 0."""
        return not any((self.input_nusd, self.output_nusd, self.cached_read,
                        self.cache_write, self.cache_write_1h))  # fmt: skip

    def per_use_nusd(self, kind: str) -> int | None:
        """What one use of the server tool ``kind`` costs, in nano-USD (None: not priced)."""
        return next((nusd for name, nusd in self.per_use if name == kind), None)

    def with_terms(self, terms: Terms) -> Prices:
        """These prices for a request with ``terms``."""
        return self if terms == self.terms else replace(self, terms=terms)

    def prices_tier(self, tier: str | None) -> bool:
        """Whether a request naming service tier ``tier`` can be priced here: none, "auto" or
        the standard one, a tier these prices list, or one the upstream is not sent."""
        if tier is None or tier == "auto" or tier in STANDARD_TIERS or not self.sends_tier:
            return True
        return self.free or any(name == tier for name, _ in self.tiers)

    def tier_multiplier(self, reported: str | None = None) -> float:
        """How the service tier scales every price. The tier the provider ``reported`` it
        served, if it is listed (or standard: 1); else the tier the request asked; for one
        that asked none or "auto" (the provider's account default, which may be any), the
        dearest listed, and at least the standard price."""
        tiers = dict(self.tiers)
        if reported in tiers:
            return tiers[reported]
        if reported in STANDARD_TIERS:
            return 1.0
        asked = self.terms.tier if self.sends_tier else None
        if asked in tiers:
            return tiers[asked]
        if asked in STANDARD_TIERS:
            return 1.0
        return max([1.0, *tiers.values()])

    def rates(self, input_tokens: int, tier: str | None = None) -> tuple[int, int, int, int, int]:
        """The per-token prices (input, cache read, cache write, hour-long cache write,
        output) of a request of ``input_tokens`` served at service tier ``tier`` (as
        :meth:`tier_multiplier` reads it): at the long-context tier past its threshold."""
        if not self.tiers and self.long_context is None:  # one price, whatever the request
            w1 = self.cache_write_1h
            return self.input_nusd, self.cached_read, self.cache_write, w1, self.output_nusd
        tier_ratio = _ratio(self.tier_multiplier(tier))
        in_ratio = out_ratio = tier_ratio
        lc = self.long_context
        if lc is not None and input_tokens > lc.above_input_tokens:
            in_ratio = tier_ratio * _ratio(lc.input_multiplier)
            out_ratio = tier_ratio * _ratio(lc.output_multiplier)
        plain = (self.input_nusd, self.cached_read, self.cache_write, self.cache_write_1h)
        i, c, w, w1 = (_scale(p, in_ratio) for p in plain)
        return i, c, w, w1, _scale(self.output_nusd, out_ratio)

    def cost(
        self,
        input_tokens: int,
        output_tokens: int,
        cached: int = 0,
        written: int = 0,
        written_1h: int | None = None,
        tier: str | None = None,
    ) -> int:
        """What ``input_tokens`` (of which ``cached`` read from and ``written`` written to the
        prompt cache, ``written_1h`` of those to be kept an hour) and ``output_tokens`` cost,
        in nano-USD, at service tier ``tier`` if the provider reported one. Writes not split
        by how long they are kept (``written_1h`` None) are all hour-long ones if the request
        marked any: the dearer, never under-charged."""
        cached, written = max(cached, 0), max(written, 0)
        if written_1h is None:
            hour = written if self.terms.cache_1h else 0
        else:
            hour = min(max(written_1h, 0), written)
        plain = max(input_tokens - cached - written, 0)
        i, c, w, w1, o = self.rates(input_tokens, tier)
        return plain * i + cached * c + (written - hour) * w + hour * w1 + output_tokens * o

    def held(self, input_estimate: int) -> tuple[int, int]:
        """The per-token input and output prices a request of at most ``input_estimate`` input
        tokens is held at: input at the dearest way it may be billed (plain, read, written,
        and written for an hour if it marks such writes), at its service tier and at the
        long-context tier if the estimate, an upper bound, is past it."""
        i, c, w, w1, o = self.rates(input_estimate)
        return max(i, c, w, w1 if self.terms.cache_1h else 0), o


_ONE = Fraction(1)


def _ratio(multiplier: float) -> Fraction:
    """A multiplier as the decimal it was written as (1.1 is 11/10, not the float below it)."""
    return _ONE if multiplier == 1 else Fraction(repr(multiplier))


def _scale(nusd: int, ratio: Fraction) -> int:
    """``nusd`` times ``ratio``, rounded up: never under-charged."""
    if ratio is _ONE:
        return nusd
    return -(-nusd * ratio.numerator // ratio.denominator)


def per_thousand_uses(usd_per_1000: float) -> int:
    """nano-USD a use from USD per 1,000 uses, rounded up (never under-charged)."""
    if usd_per_1000 < 0:
        raise ValueError("a price cannot be negative")
    scaled = round(usd_per_1000 * 1_000_000, 6)
    whole = int(scaled)
    return whole if whole == scaled else whole + 1


def _ceil_thousand(usd_per_million: float) -> int:
    if usd_per_million < 0:
        raise ValueError("a price cannot be negative")
    scaled = round(usd_per_million * 1000, 6)
    whole = int(scaled)
    return whole if whole == scaled else whole + 1


@dataclass(frozen=True, slots=True)
class Scope:
    """Everything one request is checked against: its levels (key first, root last) and their rules.

    The hash tag of every Redis key is the root of the hierarchy, so one admission can check and
    reserve on all levels in a single script on one cluster slot.
    """

    levels: tuple[Level, ...]
    budgets: tuple[Budget, ...] = ()
    rate_limits: tuple[RateLimit, ...] = ()
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError("a scope needs at least one level")
        known = set(self.levels)
        for b in self.budgets:
            if b.level not in known:
                raise ValueError(f"budget on {b.level} which is not in this scope")
        for r in self.rate_limits:
            if r.level not in known:
                raise ValueError(f"rate limit on {r.level} which is not in this scope")

    @property
    def root(self) -> Level:
        return self.levels[-1]

    def windows(self) -> tuple[Window, ...]:
        """Distinct windows of this scope's budgets, in a stable order."""
        seen: dict[str, Window] = {}
        for b in self.budgets:
            seen.setdefault(b.window.spec, b.window)
        return tuple(seen.values())
