"""Prices of cached input and cache writes, and the prices a request is held at."""

from __future__ import annotations

from hardcap_core.auth import hash_key
from hardcap_core.budgets import Prices
from hardcap_core.config import parse_config


def test_cached_reads_and_cache_writes_have_their_own_prices() -> None:
    p = Prices.per_million(1.0, 2.0, cached_input_usd=0.1, cache_write_usd=1.25)
    # 100 input tokens: 30 read from the cache, 20 written to it, 50 plain; 10 output.
    assert p.cost(100, 10, cached=30, written=20) == 50 * 1000 + 30 * 100 + 20 * 1250 + 10 * 2000


def test_unset_cache_prices_never_undercharge() -> None:
    p = Prices.per_million(1.0, 2.0)
    assert p.cost(100, 0, cached=100) == 100 * 1000  # a read at the input price
    assert p.cost(100, 0, written=100) == 100 * 1250  # a write at 1.25x it


def _config(upstream_kind: str) -> dict[str, object]:
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
