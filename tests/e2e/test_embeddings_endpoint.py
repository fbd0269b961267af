"""The official `openai` SDK against `/v1/embeddings`, through the gateway to the mock upstream,
on real Valkey: strings, lists of strings, token arrays, `dimensions` and both encodings; the
input held before the call and settled to the provider's `prompt_tokens`; a batch over the
budget refused whole; a route whose provider has no embeddings refused naming the model."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from tests.stack import KEYS, Mock, config_data, gateway_thread, mock_fixture
from tests.stack import openai_client as client

AUTH = {"authorization": f"Bearer {KEYS['alpha']}"}


mock = mock_fixture(MockSettings(pace_ms=0.5, seed=29))


def used(base: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/hardcap/usage", headers=AUTH)
    r.raise_for_status()
    rows = {(b["level"], b["dimension"]): b for b in r.json()["budgets"]}
    row: dict[str, Any] = rows[("tenant", "total_tokens")]
    return row


def test_strings_and_token_arrays_are_settled_to_the_providers_prompt_tokens(
    base: str, mock: Mock
) -> None:
    c = client(base)
    raw = c.embeddings.with_raw_response.create(
        model="small", input="Budgets that hold, however many requests run.", user="alpha"
    )
    one = raw.parse()  # the SDK asks for base64 by default and decodes it
    assert one.model == "small" and len(one.data) == 1 and len(one.data[0].embedding) == 8
    truth = mock.truth("alpha")
    assert one.usage.prompt_tokens == one.usage.total_tokens == truth["prompt_tokens"] > 0
    assert raw.headers["x-hardcap-tokens-charged"] == str(truth["prompt_tokens"])
    assert float(raw.headers["x-hardcap-cost-usd"]) > 0

    many = c.embeddings.create(
        model="small", input=["one text", "and another"], dimensions=4,
        encoding_format="float", user="alpha",
    )  # fmt: skip
    assert [d.index for d in many.data] == [0, 1] and len(many.data[1].embedding) == 4
    tokens = c.embeddings.create(model="small", input=[[1, 2, 3], [4, 5]], user="alpha")
    assert tokens.usage.prompt_tokens == 5 and len(tokens.data) == 2
    flat = c.embeddings.create(model="small", input=[7, 8, 9, 10], user="alpha")
    assert flat.usage.prompt_tokens == 4
    truth = mock.truth("alpha")
    row = used(base)
    assert row["used"] == truth["prompt_tokens"] and row["reserved"] == 0
    assert truth.get("completion_tokens", 0) == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["ok", 5]}, "input[1]"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "stream": True}, "stream"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(base: str, body: dict[str, Any], param: str) -> None:
    got = httpx.post(f"{base}/embeddings", json={"model": "small", **body}, headers=AUTH)
    assert got.status_code == 400
    assert got.json()["error"]["param"] == param


def test_a_batch_over_the_budget_is_refused_whole(mock: Mock, flushed: LocalValkey) -> None:
    budget = [{"dimension": "total_tokens", "limit": 50, "window": "day"}]
    data = config_data(mock.url, flushed.url, **{"tenants.0.budgets": budget})
    with gateway_thread(data) as base:
        batch = ["a text of a few words to embed"] * 20
        with pytest.raises(openai.RateLimitError) as refused:
            client(base).embeddings.create(model="small", input=batch, user="alpha")
        assert refused.value.code == "budget_exceeded"
        assert mock.truth("alpha") == {}  # nothing was sent
        assert (used(base)["used"], used(base)["reserved"]) == (0, 0)
        small = client(base).embeddings.create(model="small", input="fits", user="alpha")
        assert used(base)["used"] == small.usage.prompt_tokens <= 50


def test_a_route_without_embeddings_is_refused_naming_the_model(
    mock: Mock, flushed: LocalValkey, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARDCAP_TEST_ANTHROPIC_KEY", "sk-ant-mock")
    data = config_data(mock.url, flushed.url)
    data["upstreams"].append(
        {"name": "anthropic-mock", "kind": "anthropic", "base_url": f"{mock.url}/v1",
         "api_key_env": "HARDCAP_TEST_ANTHROPIC_KEY", "timeout_seconds": 5}
    )  # fmt: skip
    data["routes"].append(
        {"name": "claude", "upstream": "anthropic-mock", "model": "mock-small",
         "price": {"input_per_million": 3.0, "output_per_million": 15.0}}
    )  # fmt: skip
    with gateway_thread(data) as base:
        with pytest.raises(openai.BadRequestError) as refused:
            client(base).embeddings.create(model="claude", input="x", user="alpha")
        assert refused.value.param == "model" and "embeddings" in refused.value.message
        assert (used(base)["used"], used(base)["reserved"]) == (0, 0)
        assert json.dumps(mock.truth("alpha")) == "{}"


def test_a_route_that_counts_with_its_tokenizer_settles_the_same(
    mock: Mock, flushed: LocalValkey
) -> None:
    data = config_data(mock.url, flushed.url)
    data["routes"].append(
        {"name": "exact-always", "upstream": "mock", "model": "mock-small",
         "price": {"input_per_million": 1.0, "output_per_million": 2.0},
         "tokenizer": "cl100k_base", "exact_count": "always"}
    )  # fmt: skip
    with gateway_thread(data) as base:
        done = client(base).embeddings.create(
            model="exact-always", input=["counted before the call", [1, 2, 3]], user="alpha"
        )
        truth = mock.truth("alpha")
        assert done.usage.prompt_tokens == truth["prompt_tokens"]
        assert used(base)["used"] == truth["prompt_tokens"] and used(base)["reserved"] == 0


def test_the_quote_of_an_embeddings_body_is_its_input_and_one_output_token(
    base: str, mock: Mock
) -> None:
    body = {"model": "small", "input": [[1, 2, 3, 4], [5, 6]]}
    got = httpx.post(f"{base}/embeddings/quote", json=body, headers=AUTH)
    assert got.status_code == 200, got.text
    q = got.json()
    assert q["decision"]["action"] == "admit"
    assert (q["input_tokens"], q["max_tokens"]) == (6, 1)
    assert mock.truth("alpha") == {}
