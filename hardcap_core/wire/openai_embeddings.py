"""OpenAI embeddings (``POST /v1/embeddings``), as a :class:`~hardcap_core.wire.base.WireFormat`.

The cheapest request to cap exactly: all it bills is its input, known before the call. The
input (a string, a list of strings, a token array, a list of token arrays) is counted here —
a text by the gateway's upper bound of its tokens, a token array by its length — and the
request goes through the same pipeline as a chat request: admitted for its input and one
output token (a hold needs an output cap; nothing is generated, and the settle charges the
provider's ``usage.prompt_tokens`` and no output), sent to an OpenAI-compatible upstream's
``/embeddings`` (``providers/openai_compat.py``), settled, and answered with the provider's
reply, its usage the tokens the ledger charged. A batch over the budget is refused whole.

Every field of the pinned SDK's ``EmbeddingCreateParams`` is in :data:`EMBEDDINGS_FIELDS`;
anything else is refused naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hardcap_core.chat import OPENAI_EMBEDDINGS, ChatRequest
from hardcap_core.errors import GatewayError, InvalidRequest
from hardcap_core.events import Completion
from hardcap_core.ledger import BudgetState, RateState
from hardcap_core.tokenize.heuristics import input_text_tokens
from hardcap_core.wire import json_body
from hardcap_core.wire.base import Charged
from hardcap_core.wire.field_policy import Effect, Field, FieldPolicy
from hardcap_core.wire.headers import budget_headers
from hardcap_core.wire.openai_chat import ChunkEncoder, error_body

DIALECT = OPENAI_EMBEDDINGS
MAX_INPUTS = 2048  # OpenAI's most inputs in one request
EMBEDDINGS_FIELDS = FieldPolicy(
    "the embeddings API",
    {
        "model": Field(Effect.PRICED, "names the route, whose price table prices the request"),
        "input": Field(Effect.COUNTED, "every text or token array is billed and counted"),
        "dimensions": Field(Effect.PASS, "the size of each vector; not billed"),
        "encoding_format": Field(Effect.PASS, "floats or base64; not billed"),
        "user": Field(Effect.PASS, "an end-user id (also the end-user level of the budgets)"),
    },
)


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest(ChatRequest):
    """An embeddings request: its body is the embeddings body, which has no messages."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        return []


def parse_embeddings_request(raw: bytes) -> EmbeddingsRequest:
    """Validate an embeddings body and count its input; raise :class:`InvalidRequest` naming
    the bad field."""
    body = json_body.loads(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    given = {k: v for k, v in body.items() if v is not None}
    EMBEDDINGS_FIELDS.check(given)
    model = given.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string.", param="model")
    tokens = input_tokens(given.get("input"))
    dimensions = given.get("dimensions")
    if dimensions is not None and (not _is_int(dimensions) or dimensions < 1):
        raise InvalidRequest("'dimensions' must be an integer of at least 1.", param="dimensions")
    if given.get("encoding_format", "float") not in ("float", "base64"):
        raise InvalidRequest("'encoding_format' must be float or base64.", param="encoding_format")
    user = given.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidRequest("'user' must be a string.", param="user")
    return EmbeddingsRequest(
        body=given,
        model=model,
        stream=False,
        include_usage=False,
        max_tokens=1,  # the hold's output: nothing is generated (see the module)
        max_tokens_field="max_tokens",
        input_tokens=tokens,
        dialect=DIALECT,
    )


def input_tokens(value: Any) -> int:
    """An upper bound on the tokens ``input`` is billed: each text's bound, each token array's
    length (exact). Raise :class:`InvalidRequest` for a shape the API does not take."""
    if isinstance(value, str):
        return _text(value, "input")
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            "'input' must be a string, an array of strings, or token arrays (non-empty).",
            param="input",
        )
    if len(value) > MAX_INPUTS:
        raise InvalidRequest(f"'input' holds at most {MAX_INPUTS} items.", param="input")
    if all(_is_int(t) for t in value):
        return _tokens(value, "input")
    total = 0
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if isinstance(item, str):
            total += _text(item, where)
        elif isinstance(item, list) and item and all(_is_int(t) for t in item):
            total += _tokens(item, where)
        else:
            raise InvalidRequest(
                f"'{where}' must be a non-empty string or token array.", param=where
            )
    return total


def _text(text: str, where: str) -> int:
    if not text:
        raise InvalidRequest(f"'{where}' must not be empty.", param=where)
    return input_text_tokens(text)


def _tokens(tokens: list[Any], where: str) -> int:
    if any(t < 0 for t in tokens):
        raise InvalidRequest(f"'{where}' holds a negative token id.", param=where)
    return len(tokens)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class OpenAIEmbeddings:
    dialect = DIALECT

    def parse(self, raw: bytes) -> ChatRequest:
        return parse_embeddings_request(raw)

    def encoder(self, request: ChatRequest, *, model: str, same_dialect: bool) -> ChunkEncoder:
        # Never used: an embeddings request does not stream (the protocol asks for one).
        return ChunkEncoder(model, include_usage=False, passthrough=False)

    def reply(
        self, completion: Completion, *, model: str, same_dialect: bool, charged: Charged
    ) -> dict[str, Any]:
        body = dict(completion.raw, model=model)
        data = body.get("data")
        body["data"] = [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []
        total = charged.input_tokens + charged.output_tokens
        body["usage"] = {"prompt_tokens": charged.input_tokens, "total_tokens": total}
        return body

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return error_body(error)

    def budget_headers(
        self, budgets: Sequence[BudgetState], rates: Sequence[RateState], now_ms: int
    ) -> dict[str, str]:
        return budget_headers(budgets, rates, now_ms)
