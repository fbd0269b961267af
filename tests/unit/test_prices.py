"""Prices of cached input and cache writes, of service tiers and long context, and the prices
a request is held at."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hardcap_core.auth import hash_key
from hardcap_core.budgets import LongContext, Prices, Terms
from hardcap_core.chat import ChatRequest
from hardcap_core.config import parse_config
from hardcap_core.errors import ConfigError, InvalidRequest
from hardcap_core.events import Usage
from hardcap_core.gateway.money import Charge, request_prices, settle_charge
from hardcap_core.outcome import Outcome
from hardcap_core.providers.anthropic_events import usage_of
from hardcap_core.providers.openai_compat import OpenAICompatible
from hardcap_core.providers.transport import CallbackTransport
from hardcap_core.wire.openai_request import parse_chat_request, price_terms


def test_cached_reads_and_cache_writes_have_their_own_prices() -> None:
    p = Prices.per_million(1.0, 2.0, cached_input_usd=0.1, cache_write_usd=1.25)
    # 100 input tokens: 30 read from the cache, 20 written to it, 50 plain; 10 output.
    assert p.cost(100, 10, cached=30, written=20) == 50 * 1000 + 30 * 100 + 20 * 1250 + 10 * 2000


def test_unset_cache_prices_never_undercharge() -> None:
    p = Prices.per_million(1.0, 2.0)
    assert p.cost(100, 0, cached=100) == 100 * 1000  # a read at the input price
    assert p.cost(100, 0, written=100) == 100 * 1250  # a write at 1.25x it


def _config(upstream_kind: str) -> dict[str, Any]:
    up: dict[str, object] = {
        "name": "up",
        "kind": upstream_kind,
        "base_url": "http://127.0.0.1:9/v1",
    }
    return {
        "upstreams": [up, {"name": "other", "base_url": "http://127.0.0.1:9/v1"}],
        "routes": [
            {"name": "main", "upstream": "up", "fallbacks": ["dear"],
             "price": {"input_per_million": 1.0, "output_per_million": 2.0}},
            {"name": "dear", "upstream": "other",
             "price": {"input_per_million": 3.0, "output_per_million": 1.0}},
        ],
        "tenants": [{"id": "t", "keys": [{"id": "k", "hash": hash_key("sk-t")}]}],
    }  # fmt: skip


def test_a_request_is_held_at_the_dearest_prices_of_its_chain() -> None:
    config = parse_config(_config("anthropic"))
    held = config.hold_prices(config.routes["main"])
    # Input at the dearest of the chain's input and cache-write prices (main's writes: 1250),
    # output at the dearest output price.
    assert (held.input_nusd, held.output_nusd) == (3000, 2000)
    assert [r.name for r in config.chain(config.routes["main"])] == ["main", "dear"]


def test_an_openai_upstream_bills_cache_writes_as_input() -> None:
    config = parse_config(_config("openai"))
    assert config.routes["main"].prices.cache_write == 1000
    anthropic = parse_config(_config("anthropic"))
    assert anthropic.routes["main"].prices.cache_write == 1250


# -- fields that change the price (issue 20) ------------------------------------------------------

SONNET = Prices.per_million(3.0, 15.0, 0.30)  # Anthropic's: 5-minute writes 1.25x, 1-hour 2x
HOUR = Terms(cache_1h=True)


def test_hour_long_cache_writes_cost_twice_the_input_price() -> None:
    # The case: 19,250 tokens written for an hour, one output token. Anthropic bills
    # $0.1155; the 5-minute write price recorded $0.0722.
    bill = 19_250 * 6_000 + 15_000
    assert SONNET.cost(19_250, 1, written=19_250, written_1h=19_250) == bill
    assert bill - 15_000 == 115_500_000  # $0.1155
    # A split by time to live: 5-minute writes at 1.25x, hour-long ones at 2x.
    assert SONNET.cost(100, 0, written=100, written_1h=40) == 60 * 3_750 + 40 * 6_000
    # Writes the provider did not split are hour-long ones if the request marked any.
    assert SONNET.with_terms(HOUR).cost(100, 0, written=100) == 100 * 6_000
    assert SONNET.cost(100, 0, written=100) == 100 * 3_750
    assert Prices.per_million(3.0, 15.0, cache_write_1h_usd=5.0).cache_write_1h == 5_000


def test_a_request_marking_an_hour_long_write_is_held_at_its_price() -> None:
    config = parse_config(_config("anthropic"))
    main = config.routes["main"]
    # Each target of the chain at its own hour-long write price: the fallback's, 2 x 3,000.
    assert config.hold_prices(main, HOUR).input_nusd == 6_000
    alone = parse_config({**_config("anthropic"), "routes": [
        {"name": "main", "upstream": "up", "price": {"input_per_million": 3.0,
                                                     "output_per_million": 15.0}}]})  # fmt: skip
    route = alone.routes["main"]
    assert alone.hold_prices(route).input_nusd == 3_750
    assert alone.hold_prices(route, HOUR).input_nusd == 6_000
    # With a $0.08 budget, the request is held at $0.12 (20,000 tokens estimated):
    # refused up front, where 5-minute prices held $0.075 and let a $0.1155 bill through.
    assert 20_000 * alone.hold_prices(route, HOUR).input_nusd > 80_000_000
    assert 20_000 * alone.hold_prices(route).input_nusd < 80_000_000


TIERED = Prices.per_million(1.25, 10.0, 0.25, tiers=(("flex", 0.5), ("priority", 2.0)))


@pytest.mark.parametrize(
    ("asked", "reported", "multiplier"),
    [
        ("priority", "priority", 2.0),
        ("priority", "default", 1.0),  # downgraded: charged what it was served at
        ("priority", None, 2.0),  # no word from the provider: what it asked
        ("flex", "flex", 0.5),
        ("default", None, 1.0),
        (None, "priority", 2.0),  # the project's default tier is priority
        (None, "standard", 1.0),  # Anthropic's name for it
        (None, None, 2.0),  # no tier asked nor reported: the dearest it may have been
        ("auto", "scale", 2.0),  # a tier the route does not list: the dearest
    ],
)
def test_service_tiers_charge_the_tier_reported(
    asked: str | None, reported: str | None, multiplier: float
) -> None:
    prices = TIERED.with_terms(Terms(tier=asked))
    base = 1_000 * 1_250 + 100 * 250 + 10 * 10_000
    assert prices.cost(1_100, 10, cached=100, tier=reported) == base * multiplier


def test_a_tier_is_priced_only_where_the_route_lists_it() -> None:
    plain = Prices.per_million(1.25, 10.0)
    for tier in (None, "auto", "default"):
        assert plain.prices_tier(tier)
    assert not plain.prices_tier("priority") and not plain.prices_tier("flex")
    assert TIERED.prices_tier("priority") and not TIERED.prices_tier("scale")
    assert Prices().prices_tier("priority")  # a free route is free at any tier
    assert Prices.per_million(3.0, 15.0, sends_tier=False).prices_tier("priority")


def test_multipliers_are_exact_decimals_rounded_up() -> None:
    # 3,000 nUSD x 1.1 is 3,300, not the float 3300.0000000000005 rounded up to 3,301.
    us = Prices.per_million(3.0, 15.0, tiers=(("us", 1.1),)).with_terms(Terms(tier="us"))
    assert us.rates(10)[0] == 3_300
    odd = Prices(3, 7, tiers=(("priority", 1.5),)).with_terms(Terms(tier="priority"))
    assert odd.rates(10)[0] == 5 and odd.rates(10)[4] == 11  # 4.5 and 10.5, rounded up


LONG = LongContext(above_input_tokens=200_000, input_multiplier=2.0, output_multiplier=1.5)


def test_past_the_long_context_threshold_every_token_costs_more() -> None:
    prices = Prices.per_million(3.0, 15.0, 0.30, long_context=LONG)
    assert prices.cost(200_000, 10) == 200_000 * 3_000 + 10 * 15_000
    assert prices.cost(200_001, 10) == 200_001 * 6_000 + 10 * 22_500
    # Cache prices are multiplied too; so is a service tier's price (multipliers stack).
    assert prices.cost(300_000, 0, cached=100_000, written=100_000, written_1h=0) == (
        100_000 * 6_000 + 100_000 * 600 + 100_000 * 7_500
    )
    tiered = Prices.per_million(3.0, 15.0, tiers=(("priority", 2.0),), long_context=LONG)
    assert tiered.with_terms(Terms(tier="priority")).rates(250_000) == (
        12_000, 12_000, 15_000, 24_000, 45_000
    )  # fmt: skip


def test_the_hold_is_at_the_tier_the_input_estimate_falls_in() -> None:
    data = _config("anthropic")
    data["routes"] = [{"name": "main", "upstream": "up", "price": {
        "input_per_million": 3.0, "output_per_million": 15.0,
        "long_context": {"above_input_tokens": 200_000, "input_multiplier": 2.0,
                         "output_multiplier": 1.5}}}]  # fmt: skip
    config = parse_config(data)
    route = config.routes["main"]
    short, long = (
        config.hold_prices(route, input_tokens=200_000),
        config.hold_prices(route, input_tokens=200_001),
    )
    assert (short.input_nusd, short.output_nusd) == (3_750, 15_000)
    assert (long.input_nusd, long.output_nusd) == (7_500, 22_500)


def tiered_config(main_tiers: dict[str, float], dear_tiers: dict[str, float]) -> dict[str, Any]:
    data = _config("openai")
    data["routes"][0]["price"]["service_tiers"] = main_tiers
    data["routes"][1]["price"]["service_tiers"] = dear_tiers
    return data


def chat(body: dict[str, Any]) -> ChatRequest:
    return parse_chat_request(json.dumps(body).encode())


def test_a_tier_a_target_has_no_price_for_is_refused_naming_the_field() -> None:
    config = parse_config(tiered_config({"priority": 2.0}, {}))
    route = config.routes["main"]
    body: dict[str, Any] = {"model": "main", "messages": [{"role": "user", "content": "hi"}]}
    held, charged = request_prices(config, route, chat(body), 10)
    # Main's prices at the dearest tier it lists (2 x 1,000 in, 2 x 2,000 out), the
    # fallback's (3,000 in): each the highest of the chain.
    assert (held.input_nusd, held.output_nusd, charged.terms) == (3_000, 4_000, Terms())
    with pytest.raises(InvalidRequest) as info:
        request_prices(config, route, chat({**body, "service_tier": "priority"}), 10)
    assert info.value.param == "service_tier" and "'dear'" in str(info.value)
    config = parse_config(tiered_config({"priority": 2.0}, {"priority": 1.5}))
    held, charged = request_prices(config, config.routes["main"], chat({
        **body, "service_tier": "priority"}), 10)  # fmt: skip
    assert (held.input_nusd, held.output_nusd) == (4_500, 4_000)
    assert charged.terms == Terms(tier="priority")
    standard, _ = request_prices(config, route, chat({**body, "service_tier": "default"}), 10)
    assert (standard.input_nusd, standard.output_nusd) == (3_000, 2_000)


def test_the_standard_tier_cannot_be_listed_and_multipliers_are_positive() -> None:
    cases: list[tuple[dict[str, float], str]] = [
        ({"default": 1.0}, "'default' is the standard tier"),
        ({"priority": 0}, "greater than 0"),
    ]
    for tiers, error in cases:
        with pytest.raises(ConfigError, match=error):
            parse_config(tiered_config(tiers, {}))
    data = _config("openai")
    data["routes"][0]["price"]["long_context"] = {"above_input_tokens": 10}
    with pytest.raises(ConfigError, match=r"long_context\.input_multiplier"):
        parse_config(data)


def test_a_request_says_what_it_asks_that_changes_its_price() -> None:
    text = {"type": "text", "text": "a long document"}
    marked = {**text, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    five = {**text, "cache_control": {"type": "ephemeral"}}
    tool = {"type": "function", "function": {"name": "f"}, "cache_control": {"ttl": "1h"}}

    def terms(*parts: Any, **fields: Any) -> Terms:
        return price_terms({"messages": [{"role": "user", "content": list(parts)}], **fields})

    assert terms(text, five) == Terms()
    assert terms(text, {**five, "cache_control": {"ttl": "5m"}}) == Terms()
    assert terms(five, marked) == Terms(cache_1h=True)
    assert terms(text, tools=[tool]) == Terms(cache_1h=True)
    assert terms(text, service_tier="flex") == Terms(tier="flex")
    with pytest.raises(InvalidRequest) as info:
        parse_chat_request(b'{"model": "m", "messages": [{"role": "user"}], "service_tier": 1}')
    assert info.value.param == "service_tier"


def test_the_settled_charge_keeps_the_split_and_the_tier_reported() -> None:
    report = Usage(300, 5, cached_input_tokens=100, cache_write_input_tokens=150,
                   cache_write_1h_input_tokens=50, service_tier="priority")  # fmt: skip
    charge = settle_charge(Outcome.COMPLETED, report, final=report, input_estimate=900,
                           received=5, ended_output=lambda: 5)  # fmt: skip
    assert charge == Charge(300, 5, 100, 150, 50, "priority")
    prices = TIERED.with_terms(Terms(tier="priority"))
    assert charge.cost(prices) == prices.cost(300, 5, 100, 150, 50, "priority")
    cut = settle_charge(Outcome.TRUNCATED, None, final=None, input_estimate=900,
                        received=5, ended_output=lambda: 8)  # fmt: skip
    # All written: for an hour, if the request marked it; an estimate, cut without a report.
    assert cut == Charge(900, 8, 0, 900, estimated=True)
    assert cut.cost(SONNET.with_terms(HOUR)) == 900 * 6_000 + 8 * 15_000


def test_providers_report_the_tier_and_the_hour_long_writes() -> None:
    raw = {"input_tokens": 10, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 70,
           "cache_creation": {"ephemeral_5m_input_tokens": 20, "ephemeral_1h_input_tokens": 50},
           "output_tokens": 3, "service_tier": "priority"}  # fmt: skip
    usage = usage_of(raw)
    assert (usage.input_tokens, usage.cache_write_input_tokens) == (180, 70)
    assert (usage.cache_write_1h_input_tokens, usage.service_tier) == (50, "priority")
    split_only = usage_of({"input_tokens": 1, "cache_creation": raw["cache_creation"]})
    assert (split_only.input_tokens, split_only.cache_write_input_tokens) == (71, 70)
    assert usage_of({"input_tokens": 5}).cache_write_1h_input_tokens is None
    provider = OpenAICompatible(CallbackTransport(lambda _: (500, {}, [])))
    chunk = {"id": "c", "choices": [], "service_tier": "flex",
             "usage": {"prompt_tokens": 9, "completion_tokens": 3}}  # fmt: skip
    event = provider._event(json.dumps(chunk))
    assert event.usage is not None and event.usage.service_tier == "flex"
