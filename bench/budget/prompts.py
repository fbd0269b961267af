"""Realistic chat requests for the benchmarks: multi-turn chat, RAG, and agent steps.

The overshoot benchmark's prompts used to be a few words, where the gateway's upper-bound
input estimate costs nothing. Real traffic carries thousands of prompt tokens, and there that
bound (about 2.6x on English) decides how many requests a budget admits at once. So the
requests here have the sizes production sees, measured the way the mock upstream bills them
(tiktoken ``cl100k_base``, :mod:`hardcap_core.local.mock_billing`):

* ``chat``: a multi-turn conversation of 500-4,000 prompt tokens, then a user question;
* ``rag``: a system prompt, retrieved passages (titles, sources, numbers, prose) and a question,
  2,000-16,000 prompt tokens;
* ``agent``: a system prompt, 5-20 JSON tool schemas, and a short history of tool calls and
  their JSON results; most steps answer with a tool call, the last with text.

Text is English built from word lists and sentence templates (common words, names, numbers,
versions, code), not lorem ipsum, whose byte-pair encoding is nothing like real text's. Every
generator is a pure function of a seed. Each request also says how long its answer is
(``[mock:tokens=N]``, drawn from the workload's own output distribution) and, for agent tool
steps, that the answer is a tool call (``[mock:tool_use=1]``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hardcap_core.local.mock_billing import prompt_tokens, text_tokens

WORKLOADS = ("chat", "rag", "agent")
MAX_TOKENS = 1024  # every request's max_tokens; no drawn output length reaches it
# Prompt tokens (billed, cl100k_base) each workload's requests fall within.
PROMPT_RANGES = {"chat": (500, 4_000), "rag": (2_000, 16_000)}
TOOL_RANGE = (5, 20)  # tool schemas per agent step

# fmt: off
NOUNS = (
    "account", "address", "answer", "api", "application", "approach", "area", "article", "batch",
    "bill", "branch", "budget", "bug", "build", "cache", "call", "change", "chart", "check",
    "city", "client", "cluster", "code", "column", "company", "config", "contract", "cost",
    "customer", "dashboard", "data", "database", "date", "deadline", "decision", "deployment",
    "design", "detail", "device", "document", "draft", "email", "engine", "error", "event",
    "feature", "field", "file", "flight", "form", "function", "goal", "group", "guide", "hotel",
    "idea", "image", "incident", "index", "invoice", "issue", "item", "job", "key", "language",
    "layer", "lesson", "library", "limit", "list", "log", "market", "meeting", "message",
    "method", "metric", "model", "module", "month", "network", "note", "number", "order",
    "owner", "package", "page", "partner", "payment", "plan", "policy", "price", "problem",
    "process", "product", "project", "query", "question", "queue", "rate", "record", "region",
    "release", "report", "request", "result", "review", "risk", "role", "rule", "sample",
    "schedule", "schema", "screen", "script", "section", "server", "service", "session",
    "setting", "shipment", "signal", "source", "spreadsheet", "stage", "step", "storage",
    "story", "strategy", "stream", "student", "summary", "supplier", "system", "table", "task",
    "team", "template", "tenant", "test", "ticket", "timeline", "token", "tool", "trade",
    "trip", "update", "user", "value", "vendor", "version", "warehouse", "week", "window",
    "workflow", "year",
)
ADJECTIVES = (
    "active", "annual", "automatic", "available", "basic", "better", "broken", "careful",
    "central", "cheap", "clear", "common", "complete", "complex", "critical", "current",
    "daily", "default", "detailed", "different", "direct", "early", "easy", "empty", "entire",
    "existing", "expensive", "external", "extra", "fast", "final", "financial", "first",
    "fixed", "formal", "full", "general", "global", "good", "great", "hard", "heavy", "high",
    "important", "initial", "internal", "large", "late", "legal", "little", "local", "long",
    "low", "main", "major", "manual", "minor", "missing", "monthly", "new", "next", "normal",
    "old", "open", "original", "other", "overall", "popular", "possible", "previous", "primary",
    "private", "public", "quick", "rare", "real", "recent", "regular", "remote", "safe",
    "secure", "separate", "serious", "shared", "short", "simple", "single", "slow", "small",
    "special", "specific", "stable", "standard", "strong", "successful", "total", "typical",
    "unusual", "useful", "valid", "weekly", "whole", "wrong",
)
VERBS = (  # (base, third person, past)
    ("add", "adds", "added"), ("allow", "allows", "allowed"), ("apply", "applies", "applied"),
    ("build", "builds", "built"), ("change", "changes", "changed"),
    ("check", "checks", "checked"), ("compare", "compares", "compared"),
    ("create", "creates", "created"), ("deliver", "delivers", "delivered"),
    ("describe", "describes", "described"), ("explain", "explains", "explained"),
    ("find", "finds", "found"), ("fix", "fixes", "fixed"), ("handle", "handles", "handled"),
    ("improve", "improves", "improved"), ("include", "includes", "included"),
    ("keep", "keeps", "kept"), ("load", "loads", "loaded"), ("manage", "manages", "managed"),
    ("measure", "measures", "measured"), ("move", "moves", "moved"),
    ("need", "needs", "needed"), ("open", "opens", "opened"), ("plan", "plans", "planned"),
    ("prepare", "prepares", "prepared"), ("process", "processes", "processed"),
    ("reduce", "reduces", "reduced"), ("remove", "removes", "removed"),
    ("replace", "replaces", "replaced"), ("report", "reports", "reported"),
    ("require", "requires", "required"), ("review", "reviews", "reviewed"),
    ("run", "runs", "ran"), ("send", "sends", "sent"), ("ship", "ships", "shipped"),
    ("show", "shows", "showed"), ("sign", "signs", "signed"), ("start", "starts", "started"),
    ("store", "stores", "stored"), ("support", "supports", "supported"),
    ("track", "tracks", "tracked"), ("update", "updates", "updated"), ("use", "uses", "used"),
    ("validate", "validates", "validated"), ("write", "writes", "wrote"),
)
ADVERBS = (
    "again", "already", "also", "usually", "carefully", "clearly", "currently", "directly",
    "easily", "especially", "finally", "first", "generally", "quickly", "really", "recently",
    "simply", "slowly", "still", "together", "probably", "often", "rarely", "now",
)
PREPOSITIONS = (
    "in", "on", "for", "with", "from", "after", "before", "during", "without", "across",
    "into", "through", "under", "over", "between", "about", "by", "at",
)
DETERMINERS = ("the", "the", "the", "a", "this", "that", "our", "your", "each", "every", "their")
NAMES = (
    "Alice", "Bob", "Carlos", "Dana", "Elena", "Farid", "Grace", "Hiro", "Ingrid", "Jamal",
    "Kenji", "Laura", "Miguel", "Nadia", "Olivia", "Priya", "Quentin", "Rosa", "Samir", "Tomás",
    "Acme Corp", "Globex", "Initech", "Northwind", "Contoso", "Umbrella Health", "Stark Logistics",
    "Berlin", "Toronto", "Singapore", "São Paulo", "Nairobi", "Seattle", "Lyon", "Osaka",
)
OPENERS = (
    "However,", "In practice,", "For example,", "As a result,", "In most cases,", "Note that",
    "According to the latest report,", "Since last quarter,", "In short,", "By contrast,",
    "To be safe,", "Meanwhile,", "On the other hand,", "As expected,", "Unfortunately,",
)
# Less common words, most of them several tokens each: real prose is not all top-1000 words.
RARE = (
    "reconciliation", "idempotency", "throughput", "amortization", "procurement", "onboarding",
    "escalation", "latency", "provenance", "remediation", "deduplication", "throttling",
    "underwriting", "telemetry", "jurisdiction", "depreciation", "consignment", "subrogation",
    "pharmacokinetics", "geofencing", "tokenization", "anonymization", "interoperability",
    "backpressure", "sharding", "quiescence", "arbitrage", "fiduciary", "chargeback",
    "reimbursement", "indemnification", "cryptographic", "heuristics", "orchestration",
    "postmortem", "rollback", "failover", "hyperparameter", "embeddings", "Kubernetes",
    "PostgreSQL", "DynamoDB", "OAuth", "GDPR", "SOC 2", "HIPAA", "eBPF", "WebSocket",
    "microservice", "multitenancy", "checksum", "serializer", "middleware", "paginated",
    "asynchronous", "non-refundable", "cross-border", "low-latency", "read-only", "pre-approved",
    "quarter-over-quarter", "well-documented", "back-office", "third-party", "end-to-end",
)
TYPES = ("string", "integer", "number", "boolean")
# fmt: on


def _verb(rng: random.Random, form: int) -> str:
    return rng.choice(VERBS)[form]


def _noun_phrase(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.12:
        return rng.choice(NAMES)
    if roll < 0.2:
        count = rng.choice((2, 3, 5, 12, 40, 250, 1_200, rng.randint(2, 9_999)))
        return f"{count:,} {rng.choice(NOUNS)}s"
    adjective = f"{rng.choice(ADJECTIVES)} " if rng.random() < 0.55 else ""
    rare = f"{rng.choice(RARE)} " if rng.random() < 0.3 else ""
    return f"{rng.choice(DETERMINERS)} {adjective}{rare}{rng.choice(NOUNS)}"


def _detail(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.5:
        return f" {rng.choice(PREPOSITIONS)} {_noun_phrase(rng)}"
    if roll < 0.6:
        return f" by {rng.randint(2, 95)}%"
    if roll < 0.7:
        return f" on {rng.choice(('March', 'June', 'October', 'January'))} {rng.randint(1, 28)}"
    if roll < 0.78:
        return f" in version {rng.randint(1, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 9)}"
    return ""


SHORT_FORMS = (
    "It is {adj} to {v} {np} if you {v2} it {p} {np2}.",
    "There are {n} of {np} that we {v2} {p} {np2}.",
    "This is why {np} is so {adj}: it has to {v} {np2}.",
    "We {v} it, but it was not {adj} for {np} to {v2} it as well.",
    "If you {v} {np}, you will need to {v2} it to {np2} first.",
    "That is {adj}, so do not {v} {np} until it is {adj2}.",
    "As far as I can see, {np} is {adj} and it can {v} all of {np2}.",
)


def _short(rng: random.Random) -> str:
    """A sentence of short function words (it, is, to, of), which real prose is full of."""
    text = rng.choice(SHORT_FORMS).format(
        adj=rng.choice(ADJECTIVES),
        adj2=rng.choice(ADJECTIVES),
        v=_verb(rng, 0),
        v2=_verb(rng, 0),
        p=rng.choice(PREPOSITIONS),
        n=rng.choice(("some", "many", "a few", "two", "three", "most")),
        np=_noun_phrase(rng),
        np2=_noun_phrase(rng),
    )
    return f"{text[0].upper()}{text[1:]}"


def sentence(rng: random.Random) -> str:
    """One declarative English sentence from the templates."""
    if rng.random() < 0.35:
        return _short(rng)
    subject = _noun_phrase(rng)
    verb = _verb(rng, 2 if rng.random() < 0.4 else 1)
    plural = subject.split()[-1].endswith("s") and not subject[0].isupper()
    if plural and verb.endswith("s") and not verb.endswith("ss"):
        verb = _verb(rng, 2)  # a plural subject takes the past, which has one form
    adverb = f"{rng.choice(ADVERBS)} " if rng.random() < 0.2 else ""
    body = f"{subject} {adverb}{verb} {_noun_phrase(rng)}{_detail(rng)}"
    roll = rng.random()
    if roll < 0.2:
        body += f", which {_verb(rng, 1)} {_noun_phrase(rng)}{_detail(rng)}"
    elif roll < 0.35:
        body += f" because {_noun_phrase(rng)} {_verb(rng, 2)} {_noun_phrase(rng)}"
    elif roll < 0.45:
        body += f" and {_verb(rng, 2)} {_noun_phrase(rng)}{_detail(rng)}"
    if rng.random() < 0.2:
        opener = rng.choice(OPENERS)
        return f"{opener} {body[0].lower() if not body[0:2].istitle() else body[0]}{body[1:]}."
    return f"{body[0].upper()}{body[1:]}."


def question(rng: random.Random) -> str:
    """A user's question."""
    templates = (
        "How do I {v} {np}{d}?",
        "Can you explain why {np} {v3} {np2}?",
        "What is the best way to {v} {np}{d}?",
        "Could you {v} {np} and tell me what changed{d}?",
        "Why does {np} keep failing when I {v} {np2}?",
        "Is it safe to {v} {np} before {np2} is done?",
        "Which {n} should we {v} first, and why?",
    )
    text = rng.choice(templates).format(
        v=_verb(rng, 0),
        v3=_verb(rng, 1),
        np=_noun_phrase(rng),
        np2=_noun_phrase(rng),
        n=rng.choice(NOUNS),
        d=_detail(rng),
    )
    return f"{text[0].upper()}{text[1:]}"


def _code(rng: random.Random) -> str:
    """A short Python snippet, as chats about code carry."""
    a, b, c = (f"{rng.choice(NOUNS)}_{rng.choice(NOUNS)}" for _ in range(3))
    lines = [
        "```python",
        f"def {_verb(rng, 0)}_{rng.choice(NOUNS)}({a}: dict, {b}: int = {rng.randint(1, 64)}):",
        f'    """{sentence(rng)}"""',
        f"    for item in {a}.get({rng.choice(NOUNS)!r}, []):",
        f"        if item[{rng.choice(NOUNS)!r}] > {b}:",
        f"            {c} = item.{_verb(rng, 0)}({b} * {rng.randint(2, 9)})",
        f"            return {c}",
        "    return None",
        "```",
    ]
    return "\n".join(lines)


def paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(sentence(rng) for _ in range(sentences))


def _reply(rng: random.Random) -> str:
    """An assistant's earlier answer: paragraphs, sometimes a list or code."""
    parts = [paragraph(rng, rng.randint(2, 5))]
    if rng.random() < 0.3:
        parts.append("\n".join(f"{i}. {sentence(rng)}" for i in range(1, rng.randint(3, 6))))
    if rng.random() < 0.2:
        parts.append(_code(rng))
    if rng.random() < 0.5:
        parts.append(paragraph(rng, rng.randint(1, 3)))
    return "\n\n".join(parts)


@dataclass(frozen=True)
class Request:
    """One generated request: its body (no model, user or stream fields: the caller adds them),
    what the mock bills as its prompt, and the output it asks the mock for."""

    workload: str
    body: dict[str, Any]
    prompt_tokens: int
    output_tokens: int
    tool_call: bool = False


def _lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, round(median * math.exp(sigma * rng.gauss(0.0, 1.0)))))


def _target(rng: random.Random, low: int, high: int) -> int:
    """A prompt size log-uniform in [low, high], a little inside so rounding stays in range."""
    return round(math.exp(rng.uniform(math.log(low * 1.04), math.log(high * 0.96))))


def _ask(text: str, output: int, tool: bool = False) -> str:
    """``text`` with the mock's directives for the answer's length (and kind)."""
    return f"{text} [mock:tokens={output}]" + (" [mock:tool_use=1]" if tool else "")


def _finish(
    workload: str, body: dict[str, Any], output: int, low: int, high: int, tool: bool = False
) -> Request:
    tokens = prompt_tokens(body)
    if not low <= tokens <= high:
        raise ValueError(f"{workload}: {tokens} prompt tokens, outside [{low}, {high}]")
    body["max_tokens"] = MAX_TOKENS
    return Request(workload, body, tokens, output, tool)


def chat(rng: random.Random) -> Request:
    """A multi-turn conversation of 500-4,000 prompt tokens ending with a user question."""
    low, high = PROMPT_RANGES["chat"]
    target = _target(rng, low, high)
    output = _lognormal(rng, 220, 0.7, 16, 900)
    system = f"You are a helpful assistant for {rng.choice(NAMES)}. {paragraph(rng, 2)}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    last = _ask(question(rng), output)
    # Turns are added while the whole, with the final question, stays under the target.
    while True:
        turn = [
            {"role": "user", "content": f"{paragraph(rng, rng.randint(0, 2))} {question(rng)}"},
            {"role": "assistant", "content": _reply(rng)},
        ]
        trial = [*messages, *turn, {"role": "user", "content": last}]
        if prompt_tokens({"messages": trial}) > target and len(messages) > 1:
            break
        messages += turn
    messages.append({"role": "user", "content": last})
    _pad(rng, messages, 1, low)
    return _finish("chat", {"messages": messages}, output, low, high)


def _pad(rng: random.Random, messages: list[dict[str, Any]], at: int, low: int) -> None:
    """Sentences added to ``messages[at]`` until the prompt reaches ``low`` tokens."""
    while prompt_tokens({"messages": messages}) < low:
        messages[at]["content"] += " " + sentence(rng)


def _passage(rng: random.Random, n: int, tokens: int) -> str:
    title = " ".join(w.capitalize() for w in (rng.choice(ADJECTIVES), rng.choice(NOUNS)))
    slug = f"{rng.choice(NOUNS)}-{rng.choice(NOUNS)}-{rng.randint(100, 999)}"
    head = f"[{n}] {title} {rng.choice(('Guide', 'FAQ', 'Policy', 'Notes', 'Handbook'))}\n"
    head += f"Source: https://docs.{rng.choice(NOUNS)}.example.com/{slug} (updated 2025-0"
    head += f"{rng.randint(1, 9)}-{rng.randint(10, 28)})\n"
    text = head
    while text_tokens(text) < tokens:
        text += paragraph(rng, rng.randint(3, 6)) + "\n\n"
    return text.rstrip()


def rag(rng: random.Random) -> Request:
    """Retrieved passages and a question, 2,000-16,000 prompt tokens."""
    low, high = PROMPT_RANGES["rag"]
    target = _target(rng, low, high)
    output = _lognormal(rng, 280, 0.5, 32, 900)
    system = (
        "Answer the question using only the documents below. Cite each claim as [n]. If the "
        "documents do not answer it, say so. " + paragraph(rng, 1)
    )
    passages = rng.randint(4, 12)
    each = max(120, (target - 150) // passages)
    docs = "\n\n".join(_passage(rng, i + 1, each) for i in range(passages))
    messages = [
        {"role": "system", "content": system},
        {
            "role": "user",
            "content": f"Documents:\n\n{docs}\n\nQuestion: {_ask(question(rng), output)}",
        },
    ]
    while prompt_tokens({"messages": messages}) > high:
        content = messages[1]["content"]
        cut = content.rfind("\n\n[", 0, content.rfind("Question:"))
        messages[1]["content"] = content[:cut] + content[content.rfind("\n\nQuestion:") :]
    _pad(rng, messages, 0, low)
    return _finish("rag", {"messages": messages}, output, low, high)


def tool_schema(rng: random.Random, used: set[str]) -> dict[str, Any]:
    """A function tool as OpenAI's API takes it: name, description, JSON Schema parameters."""
    name = f"{_verb(rng, 0)}_{rng.choice(NOUNS)}"
    while name in used:
        name = f"{_verb(rng, 0)}_{rng.choice(NOUNS)}_{rng.choice(NOUNS)}"
    used.add(name)
    properties: dict[str, Any] = {}
    for _ in range(rng.randint(1, 6)):
        field = f"{rng.choice(NOUNS)}_{rng.choice(('id', 'name', 'count', 'date', 'status'))}"
        kind = rng.choice((*TYPES, "enum", "array"))
        if kind == "enum":
            spec: dict[str, Any] = {"type": "string", "enum": rng.sample(ADJECTIVES, 3)}
        elif kind == "array":
            spec = {"type": "array", "items": {"type": rng.choice(TYPES)}}
        else:
            spec = {"type": kind}
        spec["description"] = sentence(rng)
        properties[field] = spec
    required = sorted(rng.sample(sorted(properties), rng.randint(1, len(properties))))
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": paragraph(rng, rng.randint(1, 2)),
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def _tool_result(rng: random.Random) -> str:
    rows = [
        {
            "id": f"{rng.choice(NOUNS)}_{rng.randint(1000, 99999)}",
            "status": rng.choice(ADJECTIVES),
            "owner": rng.choice(NAMES),
            "amount": round(rng.uniform(1, 5000), 2),
            "note": sentence(rng),
        }
        for _ in range(rng.randint(1, 5))
    ]
    return json.dumps({"results": rows, "total": len(rows)})


def agent(rng: random.Random) -> Request:
    """An agent step: 5-20 tool schemas, a task and a short history of tool calls and results;
    answered by a tool call (most steps) or, at the end of a task, by text."""
    tools = [tool_schema(rng, set()) for _ in range(rng.randint(*TOOL_RANGE))]
    names = [t["function"]["name"] for t in tools]
    tool = rng.random() < 0.7
    output = _lognormal(rng, 60, 0.5, 15, 400) if tool else _lognormal(rng, 180, 0.6, 24, 900)
    system = (
        f"You are an operations agent for {rng.choice(NAMES)}. Use the tools to complete the "
        f"task; call one tool at a time and explain the final result briefly. {paragraph(rng, 3)}"
    )
    task = f"{paragraph(rng, rng.randint(1, 3))} {question(rng)}"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": _ask(task, output, tool)},
    ]
    for _ in range(rng.randint(0, 3)):
        call_id = f"call_{rng.getrandbits(48):012x}"
        arguments = {"query": sentence(rng), "limit": rng.randint(1, 50)}
        call = {"name": rng.choice(names), "arguments": json.dumps(arguments)}
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": call}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": _tool_result(rng)})
    body = {"messages": messages, "tools": tools}
    return _finish("agent", body, output, 1, 10**6, tool)


GENERATORS: dict[str, Callable[[random.Random], Request]] = {
    "chat": chat,
    "rag": rag,
    "agent": agent,
}


def pool(workload: str, size: int, seed: int) -> list[Request]:
    """``size`` requests of ``workload``, the same for the same seed."""
    make = GENERATORS[workload]
    return [make(random.Random(f"{workload}:{seed}:{i}")) for i in range(size)]
