"""The embeddings field table against the pinned openai SDK's request type, and the input
count of each shape the API takes."""

from __future__ import annotations

import pytest
from openai.types import embedding_create_params as params

from hardcap_core.errors import InvalidRequest
from hardcap_core.tokenize.heuristics import input_text_tokens
from hardcap_core.wire.openai_embeddings import (
    EMBEDDINGS_FIELDS,
    MAX_INPUTS,
    input_tokens,
    parse_embeddings_request,
)


def test_the_table_is_the_sdks_fields() -> None:
    sdk = params.EmbeddingCreateParams
    assert set(EMBEDDINGS_FIELDS.fields) == set(sdk.__required_keys__ | sdk.__optional_keys__)


def test_each_shape_is_counted_texts_by_their_bound_and_token_arrays_exactly() -> None:
    assert input_tokens("hello world") == input_text_tokens("hello world")
    assert input_tokens(["a b", "c"]) == input_text_tokens("a b") + input_text_tokens("c")
    assert input_tokens([1, 2, 3]) == 3
    assert input_tokens([[1, 2], [3], "x"]) == 3 + input_text_tokens("x")


@pytest.mark.parametrize(
    "value", ["", [], [""], [[]], [1, "a", [2]], [-1], [True], {"a": 1}, ["x"] * (MAX_INPUTS + 1)]
)
def test_a_shape_the_api_refuses_is_a_400(value: object) -> None:
    with pytest.raises(InvalidRequest):
        input_tokens(value)


def test_the_request_holds_one_output_token_and_keeps_the_body() -> None:
    chat = parse_embeddings_request(b'{"model": "m", "input": "hi", "dimensions": 3, "user": "u"}')
    assert (chat.stream, chat.max_tokens, chat.messages) == (False, 1, [])
    assert chat.body == {"model": "m", "input": "hi", "dimensions": 3, "user": "u"}
    assert chat.input_tokens == input_text_tokens("hi")
