"""PDFs through the gateway against a 10,000-token budget: what the mock bills never passes it.

One tenant has 10,000 total tokens a day. The issue's ways past the cap with a PDF, each a
file of a few kilobytes billed tens of thousands of tokens (120 KB of text in one compressed
stream; pages hidden behind a comment; pages sharing one stream; pages in an object stream;
encrypted pages), go the ways they went past it: as OpenAI `file_data` to an OpenAI-compatible
upstream or to an Anthropic one, and as an Anthropic `document` block. The mock bills, in both
its modes, each page's text (pypdf's extraction, tokenized by cl100k_base) and an image of
each page. Each is refused before anything is billed; a small PDF is answered until the budget
says no, one at a time and 8 at once, and what the mock billed stays within the budget.

The image of each page is held at the route's model's largest image (Claude up to 4.6: 1,640;
Claude Opus 4.7: 4,784; gpt-4.1-nano's patches: 3,779; GPT-4o's tiles: 1,445), and the mock
bills it by the same model's rule: the hold follows the route's model and is never below the
bill.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from tests.load.harness import reserved_left
from tests.pdf_samples import (
    compressed_text_pdf,
    pages_pdf,
    prose,
    shared_stream_pdf,
    text_content,
    written_pdf,
)
from tests.stack import KEYS, Mock, config_data, gateway_thread

BUDGET = 10_000
MAX_TOKENS = 32
KEY_ENV = "HC_TEST_DOCUMENTS_ANTHROPIC_KEY"
WAYS = ["openai file_data to openai", "openai file_data to anthropic", "anthropic document"]
TO_OPENAI = WAYS[:1]
PAGE = text_content(prose(300))
# name: (the PDF, the ways it went past the cap: estimated under 10,000, billed far more).
ATTACKS = {
    "120 KB of text in one compressed stream": (compressed_text_pdf(), WAYS),
    "45 pages written /Type %c<newline>/Page": (
        shared_stream_pdf(45, PAGE, page_type=b"/Type %c\n/Page"),
        WAYS,
    ),
    "40 pages sharing one content stream": (
        shared_stream_pdf(40, text_content(prose(3000))),
        TO_OPENAI,
    ),
    "60 pages in an object stream": (shared_stream_pdf(60, PAGE, in_object_stream=True), TO_OPENAI),
    "3 pages encrypted (RC4)": (
        written_pdf([text_content(prose(30_000))] * 3, password="owner"),
        TO_OPENAI,
    ),
}
CASES = [(name, way) for name, (_, ways) in ATTACKS.items() for way in ways]
SMALL = pages_pdf([text_content(prose(600))])  # one page: answered a few times
REFUSALS = frozenset({"budget_exceeded", "budget_busy"})


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0.2, seed=20))
    yield m
    m.stop()


@pytest.fixture
def gateway(valkey: LocalValkey, mock: Mock, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A gateway whose tenant alpha has 10,000 tokens a day, with an OpenAI-compatible route
    (``small``) and an Anthropic one (``claude``), both on the mock."""
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    budgets = [{"dimension": "total_tokens", "limit": BUDGET, "window": "day"}]
    data = config_data(
        mock.url, valkey.url, **{"tenants.0.budgets": budgets, "gateway.max_body_bytes": 1_048_576}
    )
    # The OpenAI route on GPT-4o: a model of no known family is held every rule's dearest page
    # image (gpt-4o-mini's 48,169 tokens), more than this budget. The mock bills GPT-4o's rule.
    data["routes"][0]["model"] = "gpt-4o"
    data["upstreams"].append(
        {"name": "claude", "kind": "anthropic", "base_url": f"{mock.url}/v1",
         "timeout_seconds": 5, "api_key_env": KEY_ENV}
    )  # fmt: skip
    price = {"input_per_million": 1.0, "output_per_million": 2.0}
    data["routes"].append(
        {"name": "claude", "upstream": "claude", "model": "mock-small", "price": price,
         "max_output_tokens": 1024}
    )  # fmt: skip
    with gateway_thread(data) as url:
        yield url


def send(base: str, way: str, pdf: bytes) -> str:
    """One request carrying ``pdf``: "ok" if answered, else the code of the 429 refusing it."""
    data = base64.b64encode(pdf).decode()
    question = "Summarize the report."
    try:
        if way == "anthropic document":
            source = {"type": "base64", "media_type": "application/pdf", "data": data}
            content: Any = [
                {"type": "document", "source": source},
                {"type": "text", "text": question},
            ]
            sdk = anthropic.Anthropic(
                base_url=base.removesuffix("/v1"), api_key=KEYS["alpha"], max_retries=0
            )
            with sdk:
                sdk.messages.create(
                    model="claude", max_tokens=MAX_TOKENS, metadata={"user_id": "alpha"},
                    messages=[{"role": "user", "content": content}],
                )  # fmt: skip
            return "ok"
        file = {"filename": "report.pdf", "file_data": f"data:application/pdf;base64,{data}"}
        parts: Any = [{"type": "text", "text": question}, {"type": "file", "file": file}]
        with openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0) as client:
            client.chat.completions.create(
                model="small" if way.endswith("to openai") else "claude", max_tokens=MAX_TOKENS,
                user="alpha", messages=[{"role": "user", "content": parts}],
            )  # fmt: skip
        return "ok"
    except openai.RateLimitError as e:
        return str(e.code)
    except anthropic.RateLimitError as e:
        body = e.body if isinstance(e.body, dict) else {}
        error = body.get("error")
        return str(error.get("code") or error.get("type")) if isinstance(error, dict) else "429"


def spent(mock: Mock) -> int:
    truth = mock.truth("alpha")
    assert not truth.get("in_flight")
    return int(truth.get("prompt_tokens", 0)) + int(truth.get("completion_tokens", 0))


@pytest.mark.parametrize(("name", "way"), CASES)
def test_each_way_past_the_cap_is_refused_before_anything_is_billed(
    gateway: str, mock: Mock, name: str, way: str
) -> None:
    outcome = send(gateway, way, ATTACKS[name][0])
    assert outcome == "budget_exceeded", outcome
    assert spent(mock) == 0
    assert reserved_left(gateway, KEYS["alpha"]) == 0


@pytest.mark.parametrize("way", WAYS)
def test_a_small_pdf_one_at_a_time_until_refused_stays_in_budget(
    gateway: str, mock: Mock, way: str
) -> None:
    answered = 0
    while (outcome := send(gateway, way, SMALL)) == "ok":
        answered += 1
        assert answered < 50, "never refused"
    assert outcome in REFUSALS and answered >= 1
    print(f"\n{way}: {answered} answered one at a time, billed {spent(mock)} of {BUDGET}")
    assert spent(mock) <= BUDGET
    assert reserved_left(gateway, KEYS["alpha"]) == 0


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("pdf", [SMALL, compressed_text_pdf()], ids=["small", "120 KB of text"])
def test_eight_at_once_until_refused_stay_in_budget(
    gateway: str, mock: Mock, way: str, pdf: bytes
) -> None:
    waves: list[list[str]] = []
    with ThreadPoolExecutor(8) as pool:
        while not waves or "ok" in waves[-1]:
            waves.append(list(pool.map(lambda _: send(gateway, way, pdf), range(8))))
            assert set(waves[-1]) <= REFUSALS | {"ok"}
            assert len(waves) < 20, "never refused"
    assert spent(mock) <= BUDGET
    assert reserved_left(gateway, KEYS["alpha"]) == 0


def test_a_route_s_max_pdf_pages_refuses_more_pages_with_a_400(
    valkey: LocalValkey, mock: Mock
) -> None:
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    data = config_data(mock.url, valkey.url, **{"gateway.max_body_bytes": 1_048_576})
    data["routes"][0]["max_pdf_pages"] = 2
    three = base64.b64encode(pages_pdf([text_content("A page.")] * 3)).decode()
    file = {"filename": "report.pdf", "file_data": f"data:application/pdf;base64,{three}"}
    parts: Any = [{"type": "text", "text": "Summarize."}, {"type": "file", "file": file}]
    with gateway_thread(data) as url, openai.OpenAI(base_url=url, api_key=KEYS["alpha"]) as sdk:
        with pytest.raises(openai.BadRequestError, match="max_pdf_pages") as caught:
            sdk.chat.completions.create(
                model="small", max_tokens=8, user="alpha",
                messages=[{"role": "user", "content": parts}],
            )  # fmt: skip
        assert caught.value.param == "messages[0].content[1].file.file_data"
        assert spent(mock) == 0


# route: (upstream, model, the most one image costs with it: the hold of each page's image)
MODELS = {
    "sonnet": ("claude", "claude-sonnet-4-5", 1_640),
    "opus": ("claude", "claude-opus-4-7", 4_784),
    "gpt-4o": ("mock", "gpt-4o", 1_445),
    "nano": ("mock", "gpt-4.1-nano", 3_779),
}


@pytest.fixture
def models(valkey: LocalValkey, mock: Mock, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A gateway with a route per model of :data:`MODELS`, on the mock in both its modes."""
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    mock.reset()
    data = config_data(mock.url, valkey.url, **{"gateway.max_body_bytes": 1_048_576})
    data["upstreams"].append(
        {"name": "claude", "kind": "anthropic", "base_url": f"{mock.url}/v1",
         "timeout_seconds": 5, "api_key_env": KEY_ENV}
    )  # fmt: skip
    price = {"input_per_million": 1.0, "output_per_million": 2.0}
    data["routes"] += [
        {"name": name, "upstream": upstream, "model": model, "price": price,
         "max_output_tokens": 1024}
        for name, (upstream, model, _) in MODELS.items()
    ]  # fmt: skip
    with gateway_thread(data) as url:
        yield url


def test_a_page_s_image_is_held_by_the_route_s_model_and_never_below_its_bill(
    models: str, mock: Mock
) -> None:
    pages = 3
    pdf = pages_pdf([text_content(prose(600))] * pages)
    data = base64.b64encode(pdf).decode()
    file = {"filename": "report.pdf", "file_data": f"data:application/pdf;base64,{data}"}
    parts: Any = [{"type": "text", "text": "Summarize the report."}, {"type": "file", "file": file}]
    messages = [{"role": "user", "content": parts}]
    held, billed = {}, {}
    with openai.OpenAI(base_url=models, api_key=KEYS["alpha"], max_retries=0) as client:
        for route in MODELS:
            quoted = httpx.post(
                f"{models}/hardcap/quote",
                json={"model": route, "messages": messages, "max_tokens": 8, "user": "alpha"},
                headers={"authorization": f"Bearer {KEYS['alpha']}"},
            ).json()
            held[route] = quoted["input_tokens"]
            answer = client.chat.completions.create(
                model=route, messages=messages, max_tokens=8, user="alpha"
            )
            billed[route] = answer.usage.prompt_tokens if answer.usage else 0
    print(f"\nheld {held}\nbilled {billed}")
    for route in MODELS:
        assert billed[route] <= held[route] <= 3 * billed[route], route
    # The same request, its pages' images the only difference between two routes of a kind.
    assert held["opus"] - held["sonnet"] == pages * (4_784 - 1_640)
    assert held["nano"] - held["gpt-4o"] == pages * (3_779 - 1_445)
    # The mock bills a page as its model's provider does: Opus 4.7's larger images, patches.
    assert billed["opus"] > billed["sonnet"] and billed["nano"] > billed["gpt-4o"]
    assert reserved_left(models, KEYS["alpha"]) == 0
