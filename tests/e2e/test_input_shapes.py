"""Every shape of billed input, against a small budget: what the mock bills never passes it.

One tenant has 20,000 total tokens a day. For each request shape of the bench table (a 255 KB
json_schema, tools and legacy functions, images, audio, files, crafted text...), requests go
one at a time until the gateway refuses; on a fresh budget, 8 at once until a wave is refused.
Ground truth is what the mock upstream billed (its prompt tokens come from a real tokenizer,
cl100k_base) plus what it generated; it must stay within the budget, and no reservation may
be left behind.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
import redis

from hardcap_core.local.valkey import LocalValkey
from tests.input_shapes import shape
from tests.load.harness import reserved_left
from tests.stack import KEYS, Mock, config_data, gateway_thread

BUDGET = 20_000
MAX_TOKENS = 64
SHAPES = [
    "plain chat",
    "long English",
    "code",
    "json_schema 255 KB",
    "json_schema 8 KB",
    "tools + functions",
    "image high (PNG 1024x1024)",
    "image by URL (size unknown)",
    "audio WAV 3 s",
    "file (text, 5 KB)",
    "CJK",
    "emoji",
    "random ASCII",
    "base64 blob in text",
    "tool-call history",
    "prediction + unknown fields",
    "crafted letters (non-merging pairs)",
]


@pytest.fixture
def gateway(valkey: LocalValkey, mock: Mock) -> Iterator[str]:
    """A gateway whose tenant alpha has 20,000 tokens a day, on a flushed Valkey."""
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    budgets = [{"dimension": "total_tokens", "limit": BUDGET, "window": "day"}]
    overrides = {"tenants.0.budgets": budgets, "gateway.max_body_bytes": 1_048_576}
    with gateway_thread(config_data(mock.url, valkey.url, **overrides)) as url:
        yield url


REFUSALS = frozenset({"budget_exceeded", "budget_busy"})


def send(client: openai.OpenAI, body: dict[str, Any]) -> str:
    """Send ``body`` through the SDK (fields it has no argument for go as extra_body):
    "ok" if it was answered, else the code of the 429 that refused it."""
    extra = {k: v for k, v in body.items() if k not in ("model", "messages")}
    try:
        client.chat.completions.create(
            model="small",
            messages=body["messages"],
            max_tokens=MAX_TOKENS,
            user="alpha",
            extra_body=extra,
        )
    except openai.RateLimitError as e:
        return str(e.code)
    return "ok"


def spent(mock: Mock) -> int:
    truth = mock.truth("alpha")
    assert not truth.get("in_flight")
    return int(truth.get("prompt_tokens", 0)) + int(truth.get("completion_tokens", 0))


def client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway, api_key=KEYS["alpha"], max_retries=0, timeout=30)


@pytest.mark.parametrize("name", SHAPES)
def test_one_at_a_time_until_refused_stays_in_budget(gateway: str, mock: Mock, name: str) -> None:
    body, sdk, answered = json.loads(shape(name)), client(gateway), 0
    while (outcome := send(sdk, body)) == "ok":
        answered += 1
        assert answered < 500, "never refused"
    assert outcome in REFUSALS
    print(f"\n{name}: {answered} answered one at a time, billed {spent(mock)} of {BUDGET}")
    assert spent(mock) <= BUDGET
    assert reserved_left(gateway, KEYS["alpha"]) == 0


@pytest.mark.parametrize("name", SHAPES)
def test_eight_at_once_until_refused_stay_in_budget(gateway: str, mock: Mock, name: str) -> None:
    body, sdk, waves = json.loads(shape(name)), client(gateway), []
    with ThreadPoolExecutor(8) as pool:
        while not waves or "ok" in waves[-1]:
            waves.append(list(pool.map(lambda _: send(sdk, body), range(8))))
            assert set(waves[-1]) <= REFUSALS | {"ok"}
            assert len(waves) < 100, "never refused"
    answered = sum(wave.count("ok") for wave in waves)
    print(f"\n{name}: {answered} answered 8 at a time, billed {spent(mock)} of {BUDGET}")
    assert spent(mock) <= BUDGET
    assert reserved_left(gateway, KEYS["alpha"]) == 0


def test_the_255_kb_schema_is_refused_before_anything_is_billed(gateway: str, mock: Mock) -> None:
    # The hostile tenant's request: admitted on this budget, it was billed 63,799 tokens.
    assert send(client(gateway), json.loads(shape("json_schema 255 KB"))) == "budget_exceeded"
    assert spent(mock) == 0


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (
            b'{"model": "small", "messages": [], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "levels deep",
        ),
        (b'{"model": "small", "seed": ' + b"9" * 5_000 + b"}", "5000 digits"),
        (b'{"model": "small", "temperature": NaN, "messages": []}', "NaN"),
        (b'{"model": "small", "model": "reason", "messages": []}', "twice"),
    ],
)
def test_json_python_mishandles_is_a_400_through_the_gateway(
    gateway: str, mock: Mock, raw: bytes, said: str
) -> None:
    r = httpx.post(
        f"{gateway}/chat/completions",
        content=raw,
        headers={"authorization": f"Bearer {KEYS['alpha']}", "content-type": "application/json"},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and said in error["message"]
    assert mock.truth("alpha") == {} or spent(mock) == 0


# Bad input through the gateway, on both endpoints, streamed or not: a 400 naming the field
# path, nothing billed. Each was a 500 (a lone surrogate: the upstream body failed to encode)
# or a 400 that said what was wrong but not where.
LONE = '"hi \\ud800 there"'  # valid JSON, not Unicode text
DEEP = "[" * 5_000 + "]" * 5_000
HUGE = "9" * 5_000
SCHEMA_INT = "1" * 200


def _tool_schema(maximum: str) -> str:
    return (
        '{"type": "object", "properties": {"n": {"type": "integer", "maximum": ' + maximum + "}}}"
    )


def _openai(
    system: str = '"be brief"',
    user: str = '"hi"',
    description: str = '"d"',
    max_tokens: str = "64",
    schema: str = '{"type": "object"}',
) -> str:
    tool = '{"type": "function", "function": {"name": "f", "description": ' + description
    return (
        '{"model": "small", "user": "alpha", "max_tokens": ' + max_tokens + ', "messages": ['
        '{"role": "system", "content": ' + system + '}, {"role": "user", "content": ' + user
        + '}], "tools": [' + tool + ', "parameters": ' + schema + "}}]"
    )  # fmt: skip


def _anthropic(
    system: str = '"be brief"',
    user: str = '"hi"',
    description: str = '"d"',
    max_tokens: str = "64",
    schema: str = '{"type": "object"}',
) -> str:
    return (
        '{"model": "small", "metadata": {"user_id": "alpha"}, "max_tokens": ' + max_tokens
        + ', "system": ' + system + ', "messages": [{"role": "user", "content": ' + user + "}],"
        ' "tools": [{"name": "f", "description": ' + description + ', "input_schema": '
        + schema + "}]"
    )  # fmt: skip


BAD_INPUT = [
    ("/chat/completions", _openai(user=LONE), "messages[1].content", "surrogate"),
    ("/chat/completions", _openai(description=LONE), "tools[0].function.description", "surrogate"),
    ("/chat/completions", _openai(system=LONE), "messages[0].content", "surrogate"),
    ("/chat/completions", _openai(system=DEEP), "messages[0].content", "levels deep"),
    ("/chat/completions", _openai(max_tokens=HUGE), "max_tokens", "5000 digits"),
    (
        "/chat/completions",
        _openai(schema=_tool_schema(SCHEMA_INT)),
        "tools[0].function.parameters.properties.n.maximum",
        "200 digits",
    ),
    ("/messages", _anthropic(user=LONE), "messages[0].content", "surrogate"),
    ("/messages", _anthropic(description=LONE), "tools[0].description", "surrogate"),
    ("/messages", _anthropic(system=LONE), "system", "surrogate"),
    ("/messages", _anthropic(system=DEEP), "system", "levels deep"),
    ("/messages", _anthropic(max_tokens=HUGE), "max_tokens", "5000 digits"),
    (
        "/messages",
        _anthropic(schema=_tool_schema(SCHEMA_INT)),
        "tools[0].input_schema.properties.n.maximum",
        "200 digits",
    ),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("path", "raw", "field", "said"),
    BAD_INPUT,
    ids=[f"{path[1:]}-{field}-{said.split()[-1]}" for path, _, field, said in BAD_INPUT],
)
def test_bad_input_is_a_400_naming_the_field_on_both_endpoints(
    gateway: str, mock: Mock, path: str, raw: str, field: str, said: str, stream: bool
) -> None:
    body = raw + (', "stream": true}' if stream else "}")
    r = httpx.post(
        gateway + path,
        content=body.encode(),
        headers={"authorization": f"Bearer {KEYS['alpha']}", "content-type": "application/json"},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert f"'{field}'" in error["message"] and said in error["message"], error
    if path == "/chat/completions":
        assert error["param"] == field
    assert mock.truth("alpha") == {} or spent(mock) == 0
