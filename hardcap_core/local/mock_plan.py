"""What the mock upstream (see `mock_upstream`) answers to a request, decided up front.

Kept apart from the server: `make_plan` is a pure function of the request and a
`random.Random`, so seeded runs are reproducible and the choices are testable without a server.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

# Word pieces as a BPE tokenizer would cut them: mostly a leading space plus a short word, some
# suffixes and punctuation. The mean length is about 4 characters, like real English output, so
# byte counts seen by the gateway relate to token counts as they would with a real model. No
# piece contains a quote or a backslash, so pieces can be put verbatim inside a JSON string.
# fmt: off
VOCABULARY: tuple[str, ...] = (
    " the", " the", " the", " the", " a", " a", " a", " of", " of", " to", " to", " and", " and",
    " in", " in", " I", " an", " do",
    " is", " is", " it", " that", " for", " on", " with", " as", " by", " be", " are", " this",
    " we", " you", " can", " will", " not", " or", " at", " from", " each", " one", " all",
    " when", " which", " more", " than", " so", " if", " no", " per", " its", " our", " has",
    " only", " every", " also", " into", " over", " under", " before", " after", " then",
    " budget", " token", " tokens", " limit", " gateway", " model", " request", " tenant",
    " stream", " cost", " price", " key", " cache", " server", " client", " reply", " time",
    " test", " data", " user", " value", " count", " rate", " cap", " usage", " spend",
    " answer", " question", " system", " service", " call", " text", " word", " line", " run",
    " build", " deploy", " read", " write", " send", " check", " keep", " hold", " stop",
    " start", " end", " open", " close", " make", " use", " need", " want", " know", " see",
    " think", " say", " go", " get", " set", " show", " give", " take", " find", " work",
    " new", " old", " good", " high", " low", " fast", " slow", " small", " large", " hard",
    " soft", " real", " safe", " clear", " full", " free", " same", " other", " last", " next",
    " first", " second", " few", " many", " much", " most", " some", " any", " long", " short",
    " way", " part", " case", " point", " step", " plan", " idea", " place", " world", " day",
    " Python", " Lambda", " function", " result", " number", " error", " retry", " queue",
    "ing", "ed", "s", "s", "er", "ly", "tion", "ment", "ness", "able", "al", "ive", "est",
    "'s", "n't", "'re",
    ".", ".", ".", ".", ",", ",", ",", ",", ",", ":", ";", " -", "?", "!", " (", ")",
    " 1", " 2", " 3", "0", "5", "%",
)
# fmt: on

_DIRECTIVE = re.compile(r"\[mock:([a-z_]+)=([0-9]+(?:\.[0-9]+)?)\]")
_WEATHER = re.compile(r"\bweather\b", re.IGNORECASE)

# Upper bound on any drawn length, like a real model's own output limit. Without it, the far
# tail of a log-normal (rare, but seeded benchmarks hit it) would stream for minutes.
MAX_DRAWN_TOKENS = 16_384
# `{"`, field, `":`, ` "` ... `"}`: the fixed pieces around the words of a tool-call argument.
_ARGUMENT_FRAME_TOKENS = 5


def draw_length(rng: random.Random, median: int, sigma: float) -> int:
    """A log-normal length: `round(median * exp(sigma * N(0, 1)))`, clamped to [1, 16384]."""
    drawn = round(median * math.exp(sigma * rng.gauss(0.0, 1.0)))
    return max(1, min(drawn, MAX_DRAWN_TOKENS))


def draw_words(rng: random.Random, count: int) -> list[str]:
    """`count` word pieces from the vocabulary, each one token."""
    return rng.choices(VOCABULARY, k=count)


def argument_tokens(rng: random.Random, count: int, field: str) -> list[str]:
    """Tokens that join into a JSON object `{"<field>": "<words>"}` of about `count` tokens.

    Never fewer than the frame plus one word, so the arguments of an uncapped tool call are
    always valid JSON; a caller that caps the list (max_tokens) gets a truncated object, which
    is what a real provider sends with finish_reason "length".
    """
    words = draw_words(rng, max(1, count - _ARGUMENT_FRAME_TOKENS))
    return ['{"', field, '":', ' "', *words, '"}']


def text_of(content: Any) -> str:
    """The text of a message's `content`: a string, or the text parts of a content array."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def estimate_prompt_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """`ceil(characters of all message texts / 4) + 4 per message`.

    The same family of heuristic as the gateway's own pre-flight estimate (characters / 4 plus
    a per-message overhead), so the two agree closely. A known limitation: it is not a real
    tokenizer, and it ignores tool definitions, tool-call arguments and images.
    """
    messages = list(messages)
    characters = sum(len(text_of(message.get("content"))) for message in messages)
    return math.ceil(characters / 4) + 4 * len(messages)


def _directives(text: str) -> dict[str, float]:
    """The `[mock:name=value]` test directives found in `text`, e.g. {"status": 503.0}."""
    return {name: float(value) for name, value in _DIRECTIVE.findall(text)}


class StreamOptions(BaseModel):
    """`stream_options` of a request."""

    include_usage: bool = False


class ChatRequest(BaseModel):
    """The fields of a Chat Completions request the mock looks at; others are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    reasoning_effort: str | None = None

    def tenant(self) -> str:
        """`user`, else `metadata.tenant`, else "anonymous"."""
        if self.user:
            return self.user
        tenant = (self.metadata or {}).get("tenant")
        return tenant if isinstance(tenant, str) and tenant else "anonymous"

    def last_user_text(self) -> str:
        """The text of the last user message, where the test directives live."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return text_of(message.get("content"))
        return ""


FinishReason = Literal["stop", "length", "tool_calls"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything one answer will contain, drawn when the request arrives.

    `status` >= 400 means "answer with this error instead" (`[mock:status=N]`); `die_after`
    means "cut the stream after this many tokens" (`[mock:die_after=N]`). With a `tool_name`,
    `content` holds the fragments of the tool call's JSON arguments.
    """

    status: int
    prompt_tokens: int
    reasoning: list[str]
    content: list[str]
    tool_name: str | None
    finish_reason: FinishReason
    pace_ms: float
    die_after: int | None
    gzip: bool = False  # compress the stream whatever the client asked (`[mock:gzip=1]`)

    @property
    def completion_tokens(self) -> int:
        """Reasoning plus output tokens, as providers bill them."""
        return len(self.reasoning) + len(self.content)


def _tool_to_call(req: ChatRequest) -> dict[str, Any] | None:
    """The function definition the mock will call, or None for a plain text answer."""
    functions = [t["function"] for t in req.tools or [] if isinstance(t.get("function"), dict)]
    choice = req.tool_choice
    if not functions or choice == "none":
        return None
    if isinstance(choice, dict):
        name = str((choice.get("function") or {}).get("name"))
        named: list[dict[str, Any]] = [f for f in functions if f.get("name") == name]
        return named[0] if named else {"name": name}
    if choice == "required" or _WEATHER.search(req.last_user_text()):
        first: dict[str, Any] = functions[0]
        return first
    return None


def make_plan(
    req: ChatRequest,
    rng: random.Random,
    *,
    median_tokens: int,
    sigma: float,
    reasoning_tokens: int,
    pace_ms: float,
) -> Plan:
    """Draw the answer to `req`: lengths, words, tool call, finish reason, injected faults."""
    knobs = _directives(req.last_user_text())
    reasoning: list[str] = []
    if "reason" in req.model or req.reasoning_effort is not None:
        count = reasoning_tokens or draw_length(rng, median_tokens, sigma)
        reasoning = draw_words(rng, count)
    forced = knobs.get("tokens")
    drawn = draw_length(rng, median_tokens, sigma) if forced is None else int(forced)
    tool = _tool_to_call(req)
    finish: FinishReason = "stop"
    if tool is None:
        content = draw_words(rng, drawn)
    else:
        properties = (tool.get("parameters") or {}).get("properties") or {}
        # Escaped, so any property name still makes a valid JSON object.
        field = json.dumps(str(next(iter(properties), "text")))[1:-1]
        content, finish = argument_tokens(rng, drawn, field), "tool_calls"
        if forced is not None:
            content = content[:drawn]
    # Like real providers, the cap covers reasoning and output together.
    cap = req.max_completion_tokens or req.max_tokens
    if cap is not None and len(reasoning) + len(content) > cap:
        finish = "length"
        reasoning = reasoning[:cap]
        content = content[: cap - len(reasoning)]
    die_after = knobs.get("die_after")
    return Plan(
        status=int(knobs.get("status", 200)),
        prompt_tokens=estimate_prompt_tokens(req.messages),
        reasoning=reasoning,
        content=content,
        tool_name=None if tool is None else str(tool.get("name", "")),
        finish_reason=finish,
        pace_ms=knobs.get("pace_ms", pace_ms),
        die_after=None if die_after is None else int(die_after),
        gzip=bool(knobs.get("gzip")),
    )
