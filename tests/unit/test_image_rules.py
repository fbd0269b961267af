"""Images billed per model family (hardcap_core/tokenize/images.py): each rule against its
provider's documented worked examples, the table by model name, a route's override, and the
route's bound holding what its model bills."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from hardcap_core.config import parse_config
from hardcap_core.errors import ConfigError
from hardcap_core.local import mock_billing
from hardcap_core.tokenize import images
from hardcap_core.tokenize.images import (
    ALL_RULES,
    CLAUDE,
    CLAUDE_HIGH_RES,
    GPT_4O,
    GPT_4O_MINI,
    PatchRule,
    TileRule,
    bill,
    rules_for,
)
from hardcap_core.tokenize.routes import InputCounts
from hardcap_core.wire.anthropic_request import parse_messages_request
from hardcap_core.wire.openai_request import parse_chat_request
from hardcap_core.wire.openai_responses_request import parse_responses_request
from tests.input_shapes import png
from tests.stack import route_config


def data_url(width: int, height: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(width, height)).decode()


# OpenAI's images-and-vision guide, "Calculating costs": GPT-4o's worked examples.
@pytest.mark.parametrize(
    ("size", "detail", "tokens"),
    [((1024, 1024), "high", 765), ((2048, 4096), "high", 1105), ((4096, 8192), "low", 85)],
)
def test_the_tile_rule_gives_the_guides_examples(
    size: tuple[int, int], detail: str, tokens: int
) -> None:
    assert GPT_4O.tokens(size, detail) == tokens


def test_the_tile_rule_takes_each_models_base_and_tile_costs() -> None:
    # 1024 x 1024 is 4 tiles after scaling: gpt-4o-mini bills 2,833 + 4 x 5,667.
    assert GPT_4O_MINI.tokens((1024, 1024), "high") == 2833 + 4 * 5667 == 25501
    assert GPT_4O_MINI.tokens((1024, 1024), "low") == 2833
    assert rules_for("o3")[0].tokens((1024, 1024), None) == 75 + 4 * 150
    assert rules_for("computer-use-preview")[0].tokens((1024, 1024), "auto") == 65 + 4 * 129
    assert rules_for("gpt-5")[0].tokens((1024, 1024), "high") == 70 + 4 * 140
    # auto (or none) may be high: counted as high, never as low.
    assert GPT_4O.tokens((1024, 1024), "auto") == GPT_4O.tokens((1024, 1024), None) == 765


def test_an_unknown_size_is_the_largest_image_the_rule_bills() -> None:
    sizes = [(w, h) for w in range(64, 5000, 97) for h in (10, 500, 768, 1536, 3000, 9000)]
    for rule in ALL_RULES:
        assert rule.tokens(None, "high") == rule.largest()
        assert max(rule.tokens(s, "high") for s in sizes) <= rule.largest()
    assert GPT_4O.largest() == 1445 and GPT_4O_MINI.largest() == 2833 + 8 * 5667


# The same guide's patch examples: 1024 x 1024 is 1,024 patches; 1800 x 2400 is scaled down to
# 1056 x 1408, 33 x 44 = 1,452 patches.
def test_the_patch_rule_gives_the_guides_examples() -> None:
    plain = PatchRule(1.0)
    assert plain.patches((1024, 1024)) == 1024
    assert plain.patches((1800, 2400)) == 1452
    assert plain.patches((40000, 10)) <= 1536 and plain.patches((10, 40000)) <= 1536
    mini = rules_for("gpt-4.1-mini")[0]
    assert mini.tokens((1024, 1024), "low") == 1659  # ceil(1024 x 1.62): low is not read
    assert rules_for("gpt-4.1-nano")[0].tokens((1800, 2400), None) == 3572  # ceil(1452 x 2.46)
    assert rules_for("o4-mini")[0].tokens(None, None) == 2642  # ceil(1536 x 1.72)


# Anthropic's vision page: tokens = width x height / 750 (1000 x 1000 ~1,334; 1092 x 1092
# ~1,590; 784 x 1,568 ~1,639, the largest its table lists unresized), scaled to a 1,568-px long
# edge and at most that, 1,640; Claude Opus 4.7 to 2,576 px.
def test_the_area_rule_gives_anthropics_table() -> None:
    assert CLAUDE.tokens((1000, 1000), None) == 1334
    assert CLAUDE.tokens((1092, 1092), None) == 1590
    assert CLAUDE.tokens((200, 200), None) == 64  # its 28-px patches: more than 200^2 / 750
    assert CLAUDE.tokens((784, 1568), None) == 1640
    assert CLAUDE.tokens((8000, 8000), None) == CLAUDE.tokens(None, None) == 1640
    assert CLAUDE_HIGH_RES.tokens((2000, 2000), None) == 4784  # 5,334 before its cap
    assert CLAUDE_HIGH_RES.tokens((1000, 1000), None) == 1334


@pytest.mark.parametrize(
    ("model", "rule"),
    [
        ("gpt-4o", GPT_4O),
        ("gpt-4o-2024-08-06", GPT_4O),
        ("chatgpt-4o-latest", GPT_4O),
        ("gpt-4.1", GPT_4O),
        ("gpt-4.5-preview", GPT_4O),
        ("gpt-4o-mini", GPT_4O_MINI),
        ("openai/gpt-4o-mini-2024-07-18", GPT_4O_MINI),
        ("o1-pro", TileRule(75, 150)),
        ("gpt-5-chat-latest", TileRule(70, 140)),
        ("gpt-4.1-nano", PatchRule(2.46)),
        ("gpt-5-mini", PatchRule(1.62)),
        ("o4-mini-2025-04-16", PatchRule(1.72)),
        ("claude-sonnet-4-5", CLAUDE),
        ("anthropic.claude-sonnet-4-20250514-v1:0", CLAUDE),
        ("us.anthropic.claude-3-5-sonnet-20241022-v2:0", CLAUDE),
        ("anthropic/claude-opus-4.1", CLAUDE),
        ("claude-opus-4-7", CLAUDE_HIGH_RES),
    ],
)
def test_the_table_finds_each_family(model: str, rule: Any) -> None:
    assert rules_for(model) == (rule,)


@pytest.mark.parametrize("model", ["gpt-5.1", "llama-3.3-70b", "my-deployment", "o1-mini"])
def test_an_unknown_model_is_billed_by_the_dearest_rule(model: str) -> None:
    rules = rules_for(model)
    assert rules == ALL_RULES
    for size in [(1024, 1024), (200, 200), (2048, 768), (3000, 3000), None]:
        assert bill(rules, size, "high") == max(r.tokens(size, "high") for r in ALL_RULES)
    assert bill(rules, (1024, 1024), "low") >= 2833  # low on gpt-4o-mini is its base
    # On an anthropic upstream, only Claude's rules: it serves nothing else.
    assert rules_for("sonnet", "anthropic") == (CLAUDE, CLAUDE_HIGH_RES)


def test_a_route_may_name_its_rule_and_numbers() -> None:
    def rules(**route: Any) -> Any:
        return parse_config(route_config(**route)).routes["r"].image_rules

    assert rules(model="gpt-4o-mini") == (GPT_4O_MINI,)
    assert rules(model="vision-ft", image_rule="tile") == (GPT_4O_MINI,)  # the dearest tile
    tile = {"base_tokens": 85, "tile_tokens": 170}
    assert rules(model="vision-ft", image_rule="tile", image_costs=tile) == (GPT_4O,)
    assert rules(model="gpt-4.1-mini", image_rule="patch", image_costs={"multiplier": 2}) == (
        PatchRule(2.0),
    )
    assert rules(model="claude-sonnet-4-5", image_rule="anthropic") == (CLAUDE,)
    assert rules(model="llava", image_rule="anthropic", image_costs={"long_edge": 1000}) == (
        images.AreaRule(1000, 4784),
    )
    for wrong in [
        {"image_rule": "tile", "image_costs": {"multiplier": 2}},
        {"image_rule": "auto", "image_costs": {"base_tokens": 85}},
        {"image_rule": "patch", "image_costs": {}},
        {"image_rule": "patch", "image_costs": {"multiplier": 0}},
        {"image_rule": "pixels"},
    ]:
        with pytest.raises(ConfigError) as e:
            parse_config(route_config(model="m", **wrong))
        assert "image_" in str(e.value) or "multiplier" in str(e.value)


def chat_body(model: str, url: str, detail: str | None = None) -> dict[str, Any]:
    image: dict[str, Any] = {"url": url} if detail is None else {"url": url, "detail": detail}
    content = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": image}]
    return {"model": model, "messages": [{"role": "user", "content": content}]}


@pytest.mark.parametrize(
    ("model", "url"),
    [
        ("gpt-4o-mini", data_url(1024, 1024)),
        ("gpt-4o-mini", "https://example.com/cat.png"),
        ("gpt-4.1-nano", data_url(1800, 2400)),
        ("o4-mini", data_url(3000, 500)),
        ("gpt-4o", data_url(1024, 1024)),
        ("o3", data_url(640, 480)),
    ],
)
def test_a_routes_bound_holds_what_its_model_bills(model: str, url: str) -> None:
    """The bound of an OpenAI chat request with an image is at least what the mock bills (as
    OpenAI bills it, by the model's rule); before, gpt-4o-mini was held GPT-4o's 765."""
    counts = InputCounts(parse_config(route_config(model=model)))
    body = chat_body(model, url)
    chat = parse_chat_request(json.dumps(body).encode())
    route = counts.chains["r"][0]
    billed = mock_billing.prompt_tokens(body)
    assert counts.bound(route, chat) >= billed
    if model == "gpt-4o-mini" and url.startswith("data:"):
        assert billed > 25501 and chat.input_tokens < billed  # the parse alone is short


def test_every_wire_format_is_held_its_models_bill() -> None:
    """Responses' input_image and Anthropic's image blocks (base64 and url) reach the same
    rule: they are translated to image_url parts."""
    counts = InputCounts(parse_config(route_config(model="gpt-4o-mini")))
    route = counts.chains["r"][0]
    url = data_url(1024, 1024)
    responses = {
        "model": "r",
        "input": [
            {
                "role": "user",
                "content": [{"type": "input_image", "image_url": url, "detail": "high"}],
            }
        ],
    }
    chat = parse_responses_request(json.dumps(responses).encode())
    assert counts.bound(route, chat) - chat.input_tokens == 25501 - 765
    source = {"type": "base64", "media_type": "image/png", "data": url.partition(",")[2]}
    for src in (source, {"type": "url", "url": "https://example.com/cat.png"}):
        content = [{"type": "image", "source": src}]
        body = {"model": "r", "max_tokens": 5, "messages": [{"role": "user", "content": content}]}
        anthropic = parse_messages_request(json.dumps(body).encode())
        extra = counts.bound(route, anthropic) - anthropic.input_tokens
        assert extra == (25501 - 765 if src is source else GPT_4O_MINI.largest() - 1445)


def test_a_chain_is_held_its_dearest_targets_images() -> None:
    data = route_config(model="gpt-4o", fallbacks=["mini", "claude"])
    data["routes"] += [
        {"name": "mini", "upstream": "u", "model": "gpt-4o-mini"},
        {"name": "claude", "upstream": "a", "model": "claude-opus-4-7"},
    ]
    counts = InputCounts(parse_config(data))
    chat = parse_chat_request(json.dumps(chat_body("r", data_url(1024, 1024))).encode())
    assert counts.bound(counts.chains["r"][0], chat) - chat.input_tokens == 25501 - 765
    claude = counts.chains["claude"][0]
    assert counts.bound(claude, chat) - chat.input_tokens == 1399 - 765  # ceil(1024^2 / 750)


@pytest.mark.parametrize("model", ["o3", "gpt-5", "computer-use-preview", "claude-sonnet-4-5"])
def test_a_model_that_bills_less_than_gpt_4o_is_held_its_own_bill(model: str) -> None:
    """The parse counted GPT-4o's rule; the route's rule replaces it, down as well as up."""
    counts = InputCounts(parse_config(route_config(model=model)))
    route = counts.chains["r"][0]
    with_image = parse_chat_request(json.dumps(chat_body(model, data_url(800, 600))).encode())
    text = parse_chat_request(
        json.dumps(
            {
                "model": model,
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "what is this?"}]}
                ],
            }
        ).encode()
    )
    held = counts.bound(route, with_image) - counts.bound(route, text)
    assert held == bill(rules_for(model), (800, 600), None) < GPT_4O.tokens((800, 600), None)


async def test_the_routes_tokenizer_count_holds_its_models_images_too() -> None:
    """Where the bound does not fit, the route's count replaces it: images by the same rule."""
    counts = InputCounts(parse_config(route_config(model="gpt-4o-mini")))
    route = counts.chains["r"][0]
    body = chat_body("gpt-4o-mini", data_url(1024, 1024))
    chat = parse_chat_request(json.dumps(body).encode())
    counted = await counts.count(route, chat)
    assert counted is not None and mock_billing.prompt_tokens(body) <= counted < 25501 + 50


@pytest.mark.parametrize("model", [
    "gpt-4o", "gpt-4o-mini", "o1", "computer-use-preview", "gpt-5", "gpt-4.1-mini",
    "gpt-4.1-nano", "o4-mini", "gpt-5-mini", "gpt-5-nano", "claude-3-5-sonnet", "mystery",
])  # fmt: skip
def test_no_size_or_detail_is_held_less_than_the_mock_bills(model: str) -> None:
    counts = InputCounts(parse_config(route_config(model=model)))
    route = counts.chains["r"][0]
    for width, height in [(1, 1), (31, 4000), (513, 513), (767, 769), (2049, 1000), (6000, 90)]:
        for detail in (None, "low", "high", "auto"):
            body = chat_body(model, data_url(width, height), detail)
            chat = parse_chat_request(json.dumps(body).encode())
            assert counts.bound(route, chat) >= mock_billing.prompt_tokens(body), (width, height)
