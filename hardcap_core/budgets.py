"""What a request is checked against: budgets, windows, rate limits, and the hierarchy they hang on.

These are plain values built from the config. The ledger turns them into Redis keys and script
arguments; nothing here talks to the server.

Units: tokens are integers; money is integer nano-USD (1 USD = 1_000_000_000 nUSD) so that Lua,
which only has doubles, adds it exactly up to about 9 million dollars.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

NANO_USD_PER_USD = 1_000_000_000
ID_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


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
    """A level of the hierarchy: an API key belongs to a tenant, a tenant may belong to an org."""

    KEY = "key"
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
        if not ID_PATTERN.match(self.id):
            raise ValueError(f"{self.kind.value} id {self.id!r} must match {ID_PATTERN.pattern}")

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


@dataclass(frozen=True, slots=True)
class Budget:
    """A hard limit on one dimension at one level over one window."""

    level: Level
    dimension: Dimension
    limit: int  # tokens, or nano-USD for cost
    window: Window

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


@dataclass(frozen=True, slots=True)
class Prices:
    """Price per token in nano-USD, rounded up from the config's USD per million tokens.

    Cached input (read from the provider's prompt cache) and cache writes have prices of their
    own; by default a read costs what input costs and a write 1.25x (never under-charged)."""

    input_nusd: int = 0
    output_nusd: int = 0
    cached_input_nusd: int | None = None  # None: input_nusd
    cache_write_nusd: int | None = None  # None: 1.25 x input_nusd, rounded up

    @classmethod
    def per_million(
        cls,
        input_usd: float,
        output_usd: float,
        cached_input_usd: float | None = None,
        cache_write_usd: float | None = None,
    ) -> Prices:
        # $ per 1M tokens -> nUSD per token is a factor of 1000; round up so we never undercharge.
        return cls(
            _ceil_thousand(input_usd),
            _ceil_thousand(output_usd),
            None if cached_input_usd is None else _ceil_thousand(cached_input_usd),
            None if cache_write_usd is None else _ceil_thousand(cache_write_usd),
        )

    @property
    def cached_read(self) -> int:
        return self.input_nusd if self.cached_input_nusd is None else self.cached_input_nusd

    @property
    def cache_write(self) -> int:
        if self.cache_write_nusd is not None:
            return self.cache_write_nusd
        return -(-self.input_nusd * 5 // 4)

    def cost(self, input_tokens: int, output_tokens: int, cached: int = 0, written: int = 0) -> int:
        """What ``input_tokens`` (of which ``cached`` read from and ``written`` written to the
        prompt cache) and ``output_tokens`` cost, in nano-USD."""
        cached, written = max(cached, 0), max(written, 0)
        plain = max(input_tokens - cached - written, 0)
        return (
            plain * self.input_nusd
            + cached * self.cached_read
            + written * self.cache_write
            + output_tokens * self.output_nusd
        )

    def highest(self, other: Prices) -> Prices:
        """The higher of each price: a hold that covers either."""
        return Prices(
            max(self.input_nusd, other.input_nusd, self.cache_write, other.cache_write),
            max(self.output_nusd, other.output_nusd),
        )


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
