"""Exact input counts for routes with a public tokenizer (hardcap_core/tokenize/).

- The shipped vocabularies are tiktoken's own: the same token ids as tiktoken loading its
  pinned file itself, on varied, unicode and adversarial text; a file that differs is refused.
- OpenAI's chat format as its cookbook documents it: our rule without its margin gives the
  prompt tokens the cookbook shows the API counting (124 for gpt-4o, 129 for gpt-4).
- Never under: for every shape of the input corpus, and for hypothesis' variations of it, the
  count of an exact route is at least what the mock upstream bills in that encoding.
- Lazy: importing the gateway and building its counts loads no vocabulary and imports no
  tiktoken; the build keeps only the vocabularies a config's routes use.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hardcap_core.budgets import Level, LevelKind
from hardcap_core.config import parse_config
from hardcap_core.config.schema import default_tokenizer
from hardcap_core.errors import ConfigError
from hardcap_core.ledger import Queued, Refusal, Refused
from hardcap_core.local import mock_billing
from hardcap_core.tokenize import vocabularies
from hardcap_core.tokenize.counters import BoundCounter, BpeCounter, CalibratedCounter
from hardcap_core.tokenize.routes import InputCounts
from hardcap_core.wire import openai_input
from hardcap_core.wire.anthropic_count import anthropic_extra_tokens
from hardcap_core.wire.openai_input import exact_input_tokens, input_tokens
from hardcap_core.wire.openai_request import parse_chat_request
from tests.input_shapes import CJK, EMOJI, OTHER_SCRIPTS, PROSE, SHAPES, crafted_letters, shape
from tests.input_shapes import greedy_text as greedy
from tests.stack import route_config

ENCODINGS = ("o200k_base", "cl100k_base")
ROOT = Path(__file__).resolve().parents[2]
URLS = {  # where tiktoken downloads each file from: its cache is keyed by this
    name: f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
    for name in ENCODINGS
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """tiktoken's own encodings, each loaded by tiktoken from its documented offline cache
    (TIKTOKEN_CACHE_DIR, file named by the SHA-1 of its URL) and checked by tiktoken against
    the hash it pins, with tiktoken's own pattern and special tokens."""
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    for name, url in URLS.items():
        raw = gzip.decompress(vocabularies.vocabulary_file(name).read_bytes())
        (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(raw)
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    try:
        yield {name: tiktoken.get_encoding(name) for name in ENCODINGS}
    finally:
        if old is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


ADVERSARIAL = [
    "",
    "<|endoftext|> <|endofprompt|> <|fim_prefix|>",  # special-token text is ordinary text
    "\ud800 a lone surrogate \udfff",
    "\x00\x01\x7f control \t\r\n\x0b\x0c",
    " " * 300 + "\n" * 40 + "\t" * 17,
    "1234567890" * 30,
    "camelCaseIdentifiersEverywhereAndHTTPServerURL",
    "don't won't they'll we've I'M YOU'RE",
    "".join(EMOJI) * 5,
    CJK,
    OTHER_SCRIPTS,
    PROSE,
    "e\u0301\u0308 \u200d\ufeff \U0001f3f3\ufe0f\u200d\U0001f308",
]


@pytest.mark.parametrize("name", ENCODINGS)
def test_same_tokens_as_tiktoken_on_varied_and_adversarial_text(
    name: str, reference: dict[str, Any]
) -> None:
    ours = vocabularies.encoding(name)
    theirs = reference[name]
    assert ours.n_vocab == theirs.n_vocab
    assert ours._special_tokens == theirs._special_tokens
    texts = [*ADVERSARIAL, crafted_letters(2_000), greedy(300, "abcxyz.,;:!? ")]
    texts += [shape(s) for s in ("code", "random ASCII", "punctuation runs", "emoji")]
    for text in texts:
        assert ours.encode_ordinary(text) == theirs.encode_ordinary(text), text[:40]


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(min_size=0, max_size=300))
def test_same_tokens_as_tiktoken_on_any_text(
    name: str, text: str, reference: dict[str, Any]
) -> None:
    assert vocabularies.encoding(name).encode_ordinary(text) == reference[name].encode_ordinary(
        text
    )


def test_a_vocabulary_that_is_not_tiktokens_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    raw = gzip.decompress(vocabularies.vocabulary_file("cl100k_base").read_bytes())
    tampered = raw.replace(b" 100\n", b" 101\n", 1)  # one rank moved
    (data / "cl100k_base.tiktoken.gz").write_bytes(gzip.compress(tampered))
    monkeypatch.setattr(vocabularies, "data_dir", lambda: data)
    with pytest.raises(ConfigError, match="not the one tiktoken pins"):
        vocabularies._load("cl100k_base")


# -- OpenAI's chat format ------------------------------------------------------------------------

# The cookbook's example (How to count tokens with tiktoken): the API counted 124 prompt tokens
# for it on gpt-4o and gpt-4o-mini, 129 on gpt-4 and gpt-3.5-turbo.
COOKBOOK = [
    {"role": "system", "content": "You are a helpful, pattern-following assistant that "
     "translates corporate jargon into plain English."},
    {"role": "system", "name": "example_user",
     "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant",
     "content": "Things working well together will increase revenue."},
    {"role": "system", "name": "example_user", "content": "Let's circle back when we have more "
     "bandwidth to touch base on opportunities for increased leverage."},
    {"role": "system", "name": "example_assistant",
     "content": "Let's talk later when we're less busy about how to do better."},
    {"role": "user", "content": "This late pivot means we don't have time to boil the ocean for "
     "the client deliverable."},
]  # fmt: skip
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {
                    "type": "string",
                    "description": "The city and state, e.g. San Francisco, CA",
                },
                "unit": {
                    "type": "string",
                    "description": "The unit of temperature to return",
                    "enum": ["celsius", "fahrenheit"],
                },
            },
            "required": ["location"],
        },
    },
}
WEATHER_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant that can answer to questions "
     "about the weather."},
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]  # fmt: skip


def cookbook_messages(messages: list[dict[str, Any]], name: str) -> int:
    """The cookbook's num_tokens_from_messages (3 per message, 1 per name, 3 priming)."""
    encode = vocabularies.encoding(name).encode_ordinary
    total = 3
    for message in messages:
        total += 3 + sum(len(encode(v)) for v in message.values())
        total += 1 if "name" in message else 0
    return total


def cookbook_tools(tools: list[dict[str, Any]], name: str) -> int:
    """The cookbook's num_tokens_for_tools, less the messages (its gpt-4o and gpt-4 frames)."""
    encode = vocabularies.encoding(name).encode_ordinary
    func_init = 7 if name == "o200k_base" else 10
    total = 0
    for tool in tools:
        fn = tool["function"]
        total += func_init + len(encode(f"{fn['name']}:{fn['description'].removesuffix('.')}"))
        properties = fn["parameters"]["properties"]
        if properties:
            total += 3
            for key, p in properties.items():
                total += 3
                if "enum" in p:
                    total += -3 + sum(3 + len(encode(item)) for item in p["enum"])
                desc = p["description"].removesuffix(".")
                total += len(encode(f"{key}:{p['type']}:{desc}"))
    return total + 12 if tools else total


def count_without_margin(body: dict[str, Any], name: str) -> int:
    """Our exact count less its stated margin: the cookbook's rule."""
    margin = (openai_input.EXACT_MESSAGE_TOKENS - 3) * len(body["messages"])
    return BpeCounter(name).count(body) - margin


@pytest.mark.parametrize(("name", "api"), [("o200k_base", 124), ("cl100k_base", 129)])
def test_the_chat_format_gives_the_api_count_of_the_cookbook_example(name: str, api: int) -> None:
    body = {"model": "gpt-4o", "messages": COOKBOOK}
    assert cookbook_messages(COOKBOOK, name) == api
    assert count_without_margin(body, name) == api
    assert BpeCounter(name).count(body) == api + len(COOKBOOK)  # the margin: 1 a message


@pytest.mark.parametrize(("name", "api"), [("o200k_base", 101), ("cl100k_base", 105)])
def test_tools_count_at_least_the_cookbook_rule(name: str, api: int) -> None:
    """The cookbook shows the API counting 101 (gpt-4o) and 105 (gpt-4) for its tool example."""
    body = {"model": "m", "messages": WEATHER_MESSAGES, "tools": [WEATHER_TOOL]}
    assert cookbook_messages(WEATHER_MESSAGES, name) + cookbook_tools([WEATHER_TOOL], name) == api
    assert BpeCounter(name).count(body) >= api


words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=40)
enum = st.lists(st.text(min_size=0, max_size=12), min_size=1, max_size=30)
prop = st.fixed_dictionaries(
    {"type": st.sampled_from(["string", "integer"]), "description": words},
    optional={"enum": enum},
)


def function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties}
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": parameters}}  # fmt: skip


tools = st.lists(
    st.builds(function, words, words, st.dictionaries(words, prop, max_size=6)),
    min_size=1,
    max_size=4,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text()},
        optional={"name": words},
    ),
    min_size=1, max_size=6,
)  # fmt: skip


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=messages, tools=tools)
def test_never_below_the_cookbook_rule(
    name: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> None:
    body = {"model": "m", "messages": messages, "tools": tools}
    rule = cookbook_messages(messages, name) + cookbook_tools(tools, name)
    assert BpeCounter(name).count(body) >= rule


# -- never under the bill, on the corpus ---------------------------------------------------------


@pytest.fixture(params=ENCODINGS)
def billed_in(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Callable[[dict[str, Any]], int]]]:
    """An encoding, and the mock upstream's bill with it (its own tokenizer is cl100k_base:
    for o200k_base the same rules are run with that encoding)."""
    name: str = request.param
    if name != "cl100k_base":
        monkeypatch.setattr(mock_billing, "_encoding", lambda: vocabularies.encoding(name))
    yield name, mock_billing.prompt_tokens


@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_exact_count_is_never_below_the_bill_on_the_corpus(
    shape_name: str, billed_in: tuple[str, Callable[[dict[str, Any]], int]]
) -> None:
    name, bill = billed_in
    body = json.loads(shape(shape_name))
    exact, bound = BpeCounter(name).count(body), input_tokens(body)
    assert exact >= bill(body)
    if shape_name == "plain chat":
        assert exact < bound  # what the tokenizer saves


fragments = st.sampled_from(
    [PROSE, CJK, OTHER_SCRIPTS, "".join(EMOJI), crafted_letters(200), greedy(60, "abcxyz.;! ")]
)
texts = st.one_of(st.text(max_size=200), fragments, st.tuples(fragments, st.text()).map("".join))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    shape_name=st.sampled_from(list(SHAPES)),
    extra=texts,
    name_text=st.one_of(st.none(), texts),
    unknown=st.one_of(st.none(), st.dictionaries(st.text(max_size=8), texts, max_size=3)),
)
def test_exact_count_is_never_below_the_bill_on_variations(
    billed_in: tuple[str, Callable[[dict[str, Any]], int]],
    shape_name: str,
    extra: str,
    name_text: str | None,
    unknown: dict[str, str] | None,
) -> None:
    """Any shape of the corpus, with text added to its messages (and a name, and fields
    Hardcap does not know, on the message and the body), is never counted below its bill."""
    name, bill = billed_in
    body = json.loads(shape(shape_name))
    message = body["messages"][-1]
    if isinstance(message.get("content"), list):
        message["content"].append({"type": "text", "text": extra})
    else:
        message["content"] = (message.get("content") or "") + extra
    if name_text is not None:
        message["name"] = name_text
    if unknown is not None:
        message["x_unknown"] = unknown
        body["x_vendor"] = unknown
    assert BpeCounter(name).count(body) >= bill(body)


def test_what_the_tokenizer_cannot_see_keeps_its_bound() -> None:
    """Images, audio and files count the same as in the bound; text counts less."""
    for shape_name in ("image high (PNG 1024x1024)", "audio WAV 3 s", "file (text, 5 KB)"):
        body = json.loads(shape(shape_name))
        media = [p for p in body["messages"][0]["content"] if p["type"] != "text"]
        alone = {"messages": [{"role": "user", "content": media}]}
        bound_part = input_tokens(alone) - input_tokens({"messages": [{"role": "user"}]})
        exact_part = exact_input_tokens(alone, len) - exact_input_tokens(
            {"messages": [{"role": "user"}]}, len
        )
        assert exact_part == bound_part + openai_input.EXACT_PART_MARGIN * len(media)


def test_the_calibrated_bound_is_between_cl100k_and_the_bound() -> None:
    for shape_name in SHAPES:
        body = json.loads(shape(shape_name))
        calibrated = CalibratedCounter().count(body)
        assert calibrated <= BoundCounter().count(body)
        assert calibrated >= mock_billing.prompt_tokens(body)


# -- config and startup --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "tokenizer"),
    [
        ("gpt-4o", "o200k_base"), ("gpt-4o-mini-2024-07-18", "o200k_base"),
        ("chatgpt-4o-latest", "o200k_base"), ("gpt-4.1", "o200k_base"),
        ("gpt-5-mini", "o200k_base"), ("o3-mini", "o200k_base"), ("openai/o4-mini", "o200k_base"),
        ("gpt-4", "cl100k_base"), ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"), ("claude-sonnet-4-5", "anthropic"),
        ("anthropic.claude-3-haiku-20240307-v1:0", "anthropic"), ("llama-3.3-70b", "bound"),
        ("mock-small", "bound"),
    ],
)  # fmt: skip
def test_default_tokenizer_by_model_family(model: str, tokenizer: str) -> None:
    assert default_tokenizer(model) == tokenizer


def test_config_takes_a_tokenizer_and_refuses_what_it_cannot_do() -> None:
    route = parse_config(route_config(model="gpt-4o")).routes["r"]
    assert (route.tokenizer, route.exact_count, route.count_api) == (
        "o200k_base", "when_needed", False,
    )  # fmt: skip
    route = parse_config(
        route_config(model="gpt-4o", tokenizer="bound", exact_count="always")
    ).routes
    assert (route["r"].tokenizer, route["r"].exact_count) == ("bound", "always")
    with pytest.raises(ConfigError, match="tokenizer"):
        parse_config(route_config(tokenizer="p50k_base"))
    with pytest.raises(ConfigError, match="count_api needs tokenizer anthropic"):
        parse_config(route_config(model="gpt-4o", count_api=True))
    with pytest.raises(ConfigError, match="needs an anthropic upstream"):
        parse_config(route_config(model="claude-sonnet-4-5", count_api=True))


def test_a_route_whose_vocabulary_is_not_shipped_fails_at_startup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vocabularies, "data_dir", lambda: tmp_path)
    with pytest.raises(ConfigError, match="'o200k_base' is not shipped"):
        InputCounts(parse_config(route_config(model="gpt-4o")))
    InputCounts(parse_config(route_config(model="llama")))  # the bound needs no vocabulary


async def test_an_unusable_vocabulary_falls_back_to_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = InputCounts(parse_config(route_config(model="gpt-4o")))
    route = counts.chains["r"][0]
    chat = parse_chat_request(json.dumps({"model": "r", "messages": COOKBOOK}).encode())
    (tmp_path / "o200k_base.tiktoken.gz").write_bytes(gzip.compress(b"bm90 0\n"))
    monkeypatch.setattr(vocabularies, "data_dir", lambda: tmp_path)
    monkeypatch.setattr(vocabularies, "_loaded", {})
    assert await counts.count(route, chat) is None
    assert await counts.reported(route, chat) == chat.input_tokens


def test_nothing_is_loaded_until_a_count_needs_it() -> None:
    """Importing the gateway and building it for tokenizer routes imports no tiktoken and
    loads no vocabulary (each costs hundreds of milliseconds at a cold start)."""
    probe = """
import json, sys
from hardcap_core.config import parse_config
from hardcap_core.gateway.app import create_app
from hardcap_core.tokenize import vocabularies
from hardcap_core.tokenize.routes import InputCounts
data = {"gateway": {"redis_url": "redis://127.0.0.1:1"},
        "upstreams": [{"name": "u", "base_url": "http://127.0.0.1:1/v1"}],
        "routes": [{"name": "a", "upstream": "u", "model": "gpt-4o"},
                   {"name": "b", "upstream": "u", "model": "gpt-4"}]}
create_app(parse_config(data))
InputCounts(parse_config(data))
print(json.dumps({"tiktoken": "tiktoken" in sys.modules, "loaded": sorted(vocabularies.loaded())}))
"""
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), "POWERTOOLS_LOG_LEVEL": "WARNING"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == {"tiktoken": False, "loaded": []}


def test_the_build_keeps_only_the_vocabularies_the_routes_use(tmp_path: Path) -> None:
    """What infra/Makefile runs on the artifact: a config whose routes count with o200k_base
    only ships o200k_base; one without tokenizer routes ships none."""
    makefile = (ROOT / "infra" / "Makefile").read_text()
    assert '-m hardcap_core.tokenize.vocabularies prune "$(ARTIFACTS_DIR)"' in makefile
    site = tmp_path / "site"
    shutil.copytree(vocabularies.data_dir().parent, site / vocabularies.DATA_PACKAGE)
    data = site / vocabularies.DATA_PACKAGE / "data"
    assert {p.name for p in data.glob("*.tiktoken.gz")} >= {
        "o200k_base.tiktoken.gz", "cl100k_base.tiktoken.gz",
    }  # fmt: skip
    yaml = tmp_path / "config.yaml"
    yaml.write_text(json.dumps(route_config(model="gpt-4o-mini")))  # JSON is YAML
    main = vocabularies.main
    assert main(["prune", str(site), str(yaml)]) == 0
    assert {p.name for p in data.glob("*.tiktoken.gz")} == {"o200k_base.tiktoken.gz"}
    yaml.write_text(json.dumps(route_config(model="llama-3.3-70b")))
    assert main(["prune", str(site), str(yaml)]) == 0
    assert not list(data.glob("*.tiktoken.gz"))
    claude = route_config(model="claude-sonnet-4-5")
    claude["routes"][0]["upstream"] = "a"
    assert vocabularies.used_by(parse_config(claude)) == {"cl100k_base"}  # calibrated bound's


async def test_a_chain_is_counted_as_its_dearest_target_bills() -> None:
    """A route falling back to an Anthropic model is counted by both targets, the larger
    (with what Anthropic bills beyond OpenAI's rules); one falling back to a route without a
    tokenizer keeps the bound (nothing to gain)."""
    data = route_config(model="gpt-4o", fallbacks=["claude"])
    data["routes"] += [
        {"name": "claude", "upstream": "a", "model": "claude-sonnet-4-5"},
        {"name": "plain", "upstream": "u", "model": "gpt-4o", "fallbacks": ["llama"]},
        {"name": "llama", "upstream": "u", "model": "llama-3.3-70b"},
    ]
    counts = InputCounts(parse_config(data))
    body = json.loads(shape("tools + functions"))
    chat = parse_chat_request(json.dumps(body).encode())
    gpt, claude, plain = (counts.chains[name][0] for name in ("r", "claude", "plain"))
    anthropic = CalibratedCounter().count(body) + anthropic_extra_tokens(body)
    assert await counts.count(claude, chat) == anthropic
    assert await counts.count(gpt, chat) == max(BpeCounter("o200k_base").count(body), anthropic)
    assert not counts.counts_better(plain)
    assert await counts.count(plain, chat) is None
    assert await counts.reported(plain, chat) == counts.bound(plain, chat) == chat.input_tokens


@pytest.mark.parametrize(
    ("first", "counted_again"),
    [("queued", True), ("exceeded", True), ("tpm", True), ("rpm", False), ("admitted", False)],
)
async def test_the_count_is_made_only_where_the_bound_is_short(
    first: str, counted_again: bool
) -> None:
    """Reserved its bound first; counted (once) and reserved again with the count only where
    that may change the answer: queued, budget spent, tokens per minute (not requests)."""

    tenant = Level(LevelKind.TENANT, "t")

    def refused(reason: Refusal, dimension: str) -> Refused:
        return Refused(reason, tenant, dimension, None, 1000, (), (), 0)

    answers = {
        "queued": Queued(0, refused(Refusal.BUSY, "total_tokens"), 0),
        "exceeded": refused(Refusal.EXCEEDED, "total_tokens"),
        "tpm": refused(Refusal.RATE_LIMITED, "tokens"),
        "rpm": refused(Refusal.RATE_LIMITED, "requests"),
        "admitted": "admitted",
    }
    counts = InputCounts(parse_config(route_config(model="gpt-4o")))
    route = counts.chains["r"][0]
    chat = parse_chat_request(json.dumps({"model": "r", "messages": COOKBOOK}).encode())
    asked: list[int] = []
    recorded: list[bool] = []

    async def reserve(tokens: int, record_refusal: bool) -> Any:
        asked.append(tokens)
        recorded.append(record_refusal)
        if len(asked) == 1:
            return answers[first]
        return answers[first] if first == "rpm" else "admitted"

    inputs = await counts.reserving(route, chat)
    assert inputs.tokens == chat.input_tokens  # the bound, at parse
    assert await inputs.admit(reserve) == ("admitted" if counted_again else answers[first])
    exact = BpeCounter("o200k_base").count(chat.body)
    if counted_again:
        assert asked == [chat.input_tokens, exact]
        assert recorded == [False, True]  # the bound's refusal left no usage record
    elif first == "rpm":  # a refusal that stands is recorded, once
        assert asked == [chat.input_tokens, chat.input_tokens]
        assert recorded == [False, True]
    else:
        assert asked == [chat.input_tokens]
    assert inputs.reserved_count == (exact if counted_again else None)
    await inputs.admit(reserve)  # a queued request asking again is not counted again
    assert asked[-1] == inputs.tokens
