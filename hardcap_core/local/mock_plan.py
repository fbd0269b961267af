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
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from hardcap_core.local.mock_billing import prompt_tokens

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


def estimate_prompt_tokens(req: ChatRequest) -> int:
    """The prompt tokens the mock bills for `req`, as OpenAI would: a real tokenizer
    (cl100k_base) over every billed input field, images by their tiles, audio by its
    duration (see `mock_billing`)."""
    return prompt_tokens(req.model_dump(exclude_unset=True))


def _directives(text: str) -> dict[str, float]:
    """The `[mock:name=value]` test directives found in `text`, e.g. {"status": 503.0}."""
    return {name: float(value) for name, value in _DIRECTIVE.findall(text)}


class StreamOptions(BaseModel):
    """`stream_options` of a request."""

    include_usage: bool = False


class ChatRequest(BaseModel):
    """The fields of a Chat Completions request the mock looks at; the others are kept too,
    because they are billed (`estimate_prompt_tokens`)."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None  # the legacy form of `tools`
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


FinishReason = Literal["stop", "length", "tool_calls", "function_call"]
# How the output streams: text content, a tool call's arguments, a legacy function call's
# arguments (`[mock:function_call=1]`), or spoken words with their audio (`[mock:audio=1]`).
Shape = Literal["content", "tool_calls", "function_call", "audio"]

# Audio: each spoken word is one transcript token plus this many audio tokens. OpenAI bills
# assistant audio at 1 token per 50 ms and streams 24 kHz 16-bit mono PCM, 2,400 bytes per
# token; a word takes about 400 ms (150 words a minute): 8 audio tokens, 19,200 bytes.
AUDIO_TOKENS_PER_WORD = 8
AUDIO_BYTES_PER_TOKEN = 2_400

# `[mock:malformed=K]`: the kinds of bad event (see `mock_replies` for what each sends).
BAD_UTF8, NULL_CHOICE, ERROR_OBJECT, USAGE_NOT_OBJECT, NOT_JSON, JSON_ARRAY = range(1, 7)
MALFORMED_KINDS = {
    BAD_UTF8: "bad_utf8",  # invalid UTF-8 bytes inside a content token's chunk (billed)
    NULL_CHOICE: "null_choice",  # `choices: [null]`
    ERROR_OBJECT: "error_object",  # `{"error": "boom"}`: the provider failed and stops
    USAGE_NOT_OBJECT: "usage_not_object",  # `usage: 5`, and 5 wherever usage goes
    NOT_JSON: "not_json",  # data that is not JSON
    JSON_ARRAY: "json_array",  # a JSON array holding a chunk with a content token (billed)
}
# Kinds whose bad event carries one more billed token than the plan's output.
BILLED_MALFORMED = frozenset({BAD_UTF8, JSON_ARRAY})

# `[mock:lie=K]`: the usage report says what no provider could have billed (a buggy or
# compromised upstream, or a proxy in front of it); what it generates and bills stays the
# truth. Each kind is the count it lies about and what it says.
LIES: dict[int, tuple[str, int]] = {
    1: ("output", (1 << 53) + 1),  # 9,007,199,254,740,993
    2: ("output", -1_000_000_000),
    3: ("output", (1 << 63) - 1),
    4: ("input", (1 << 53) + 1),
    5: ("input", -1_000_000_000),
}
# `[mock:redirect=N]`: answer a redirect instead (not billed, nothing generated): a 302 whose
# body is a whole completion, or a 307 with no body, its Location another path of the mock.
REDIRECTS = frozenset({301, 302, 303, 307, 308})


def lie_about(plan: Plan, usage: dict[str, Any], *, input_key: str, output_key: str) -> None:
    """Make ``usage`` (a provider's usage object, changed in place) tell ``plan``'s lie."""
    if plan.lie is None:
        return
    count, value = LIES[plan.lie]
    usage[output_key if count == "output" else input_key] = value


def per_piece(shape: Shape) -> int:
    """Tokens billed for one output piece: a spoken word bills its audio too."""
    return 1 + AUDIO_TOKENS_PER_WORD if shape == "audio" else 1


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything one answer will contain, drawn when the request arrives.

    `status` >= 400 means "answer with this error instead" (`[mock:status=N]`). A stream is a
    sequence of steps: each reasoning token, then each output piece (a content token, an
    argument fragment, or a spoken word). `die_after` drops the connection after that many
    steps (`[mock:die_after=N]`); `eof_after` ends the body cleanly there, without a finish
    chunk, usage or [DONE] (`[mock:eof_after=N]`). With a `tool_name`, `content` holds the
    fragments of the call's JSON arguments; with `shape` "audio", the spoken words.

    `hidden` reasoning tokens are generated during the silent phase (`silent_ms`) and never
    streamed, but billed, as a reasoning model that thinks silently bills them.
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
    shape: Shape = "content"
    hidden: int = 0  # billed reasoning tokens generated in the silent phase, never streamed
    silent_ms: float = 0.0  # this long before the first chunk, nothing but keep-alive comments
    keepalive_ms: float | None = None  # an SSE comment this often during the silent phase
    malformed: int | None = None  # the kind of bad event to send (`MALFORMED_KINDS`)
    malformed_at: int = 1  # ... before this step (0: as the stream's first event)
    eof_after: int | None = None
    retry_after: float | None = None  # a Retry-After header on the error (`[mock:retry_after=S]`)
    hang: bool = False  # never answer until the client leaves (`[mock:hang=1]`)
    drop: bool = False  # a whole reply drops its connection mid-body (a "disconnect" fault)
    cache_read: int = 0  # prompt tokens reported read from the cache (`[mock:cache_read=N]`)
    cache_write: int = 0  # prompt tokens reported written to it (`[mock:cache_write=N]`)
    # Anthropic mode: thinking streamed as a summary, one thinking token per this many billed
    # (`[mock:summarize=N]`), as Claude 4 models stream it and bill the whole thinking.
    summarize: int = 1
    # Anthropic mode: after this many steps the stream stalls, sending nothing until the
    # client leaves (`[mock:stall_after=N]`).
    stall_after: int | None = None
    lie: int | None = None  # the usage report lies (`LIES`)
    redirect: int | None = None  # answer this 3xx instead (`REDIRECTS`)
    set_cookie: bool = False  # the reply sets a cookie (`[mock:set_cookie=1]`)

    @property
    def reasoning_tokens(self) -> int:
        """Hidden plus streamed reasoning tokens."""
        return self.hidden + len(self.reasoning)

    @property
    def audio_tokens(self) -> int:
        return len(self.content) * AUDIO_TOKENS_PER_WORD if self.shape == "audio" else 0

    @property
    def completion_tokens(self) -> int:
        """Reasoning plus output tokens, as providers bill them (a billed bad event included)."""
        extra = 1 if self.malformed in BILLED_MALFORMED else 0
        return self.reasoning_tokens + len(self.content) * per_piece(self.shape) + extra


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


def _function_to_call(req: ChatRequest) -> dict[str, Any]:
    """The function a legacy `function_call` answer calls: the first of `functions` or
    `tools`, else one named "lookup"."""
    for function in req.functions or []:
        return function
    tools = [t["function"] for t in req.tools or [] if isinstance(t.get("function"), dict)]
    return tools[0] if tools else {"name": "lookup"}


def _fit(
    cap: int, hidden: int, reasoning: list[str], content: list[str], per_piece: int
) -> tuple[int, list[str], list[str], bool]:
    """Hidden reasoning, reasoning and output cut to `cap` billed tokens, in the order they
    are generated; and whether anything was cut."""
    kept = min(hidden, cap)
    thought = reasoning[: cap - kept]
    room = (cap - kept - len(thought)) // per_piece
    cut = kept < hidden or len(thought) < len(reasoning) or len(content) > room
    return kept, thought, content[:room], cut


def make_plan(
    req: ChatRequest,
    rng: random.Random,
    *,
    median_tokens: int,
    sigma: float,
    reasoning_tokens: int,
    pace_ms: float,
) -> Plan:
    """Draw the answer to `req`: lengths, words, tool call, finish reason, injected faults.

    Raises ValueError for a directive with a value it does not know.
    """
    knobs = _directives(req.last_user_text())
    reasoning: list[str] = []
    if "thinking" in knobs:
        reasoning = draw_words(rng, int(knobs["thinking"]))
    elif "reason" in req.model or req.reasoning_effort is not None:
        count = reasoning_tokens or draw_length(rng, median_tokens, sigma)
        reasoning = draw_words(rng, count)
    forced = knobs.get("tokens")
    drawn = draw_length(rng, median_tokens, sigma) if forced is None else int(forced)
    shape: Shape = "content"
    tool = _tool_to_call(req)
    if knobs.get("tool_use") and tool is None:
        tool = _function_to_call(req)
    if knobs.get("function_call"):
        tool, shape = _function_to_call(req), "function_call"
    elif knobs.get("audio"):
        tool, shape = None, "audio"
    elif tool is not None:
        shape = "tool_calls"
    finish: FinishReason = "stop"
    if tool is None:
        content = draw_words(rng, drawn)
    else:
        properties = (tool.get("parameters") or {}).get("properties") or {}
        # Escaped, so any property name still makes a valid JSON object.
        field = json.dumps(str(next(iter(properties), "text")))[1:-1]
        content = argument_tokens(rng, drawn, field)
        finish = "function_call" if shape == "function_call" else "tool_calls"
        if forced is not None:
            content = content[:drawn]
    pace = knobs.get("pace_ms", pace_ms)
    hidden = int(knobs.get("hidden", 0))
    # Like real providers, the cap covers reasoning and output together; `[mock:ignore_cap=1]`
    # generates the whole drawn length whatever it says.
    cap = None if knobs.get("ignore_cap") else req.max_completion_tokens or req.max_tokens
    if cap is not None:
        hidden, reasoning, content, cut = _fit(cap, hidden, reasoning, content, per_piece(shape))
        finish = "length" if cut else finish
    lie, redirect = knobs.get("lie"), knobs.get("redirect")
    if lie is not None and int(lie) not in LIES:
        raise ValueError(f"[mock:lie={lie:g}]: the kinds are {sorted(LIES)}")
    if redirect is not None and int(redirect) not in REDIRECTS:
        raise ValueError(f"[mock:redirect={redirect:g}]: one of {sorted(REDIRECTS)}")
    malformed = knobs.get("malformed")
    if malformed is not None and int(malformed) not in MALFORMED_KINDS:
        raise ValueError(f"[mock:malformed={malformed:g}]: the kinds are {MALFORMED_KINDS}")
    die_after, eof_after = knobs.get("die_after"), knobs.get("eof_after")
    stall_after = knobs.get("stall_after")
    keepalive = knobs.get("keepalive_ms")
    retry_after = knobs.get("retry_after")
    # A Retry-After goes with a 429 unless another status is named.
    status = int(knobs.get("status", 200 if retry_after is None else 429))
    return Plan(
        status=status,
        prompt_tokens=estimate_prompt_tokens(req),
        reasoning=reasoning,
        content=content,
        tool_name=None if tool is None else str(tool.get("name", "")),
        finish_reason=finish,
        pace_ms=pace,
        die_after=None if die_after is None else int(die_after),
        gzip=bool(knobs.get("gzip")),
        shape=shape,
        hidden=hidden,
        # Silent thinking takes as long as its tokens at the model's pace, unless told.
        silent_ms=knobs.get("silent_ms", hidden * pace),
        keepalive_ms=keepalive or None,
        malformed=None if malformed is None else int(malformed),
        malformed_at=int(knobs.get("malformed_at", 1)),
        eof_after=None if eof_after is None else int(eof_after),
        retry_after=retry_after,
        hang=bool(knobs.get("hang")),
        cache_read=int(knobs.get("cache_read", 0)),
        cache_write=int(knobs.get("cache_write", 0)),
        summarize=max(1, int(knobs.get("summarize", 1))),
        stall_after=None if stall_after is None else int(stall_after),
        lie=None if lie is None else int(lie),
        redirect=None if redirect is None else int(redirect),
        set_cookie=bool(knobs.get("set_cookie")),
    )
