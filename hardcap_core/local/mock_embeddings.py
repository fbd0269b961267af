"""The mock's embeddings mode: `POST /v1/embeddings`, billed as OpenAI bills it.

It bills `usage.prompt_tokens`: each text's cl100k_base tokens (`mock_billing`), each token
array's length, and counts them in the shared ground truth as the tenant's prompt tokens (the
request's `user`, else "anonymous"; no completion tokens). Each vector is `dimensions` long
(default 8), drawn from a seeded generator; `encoding_format: "base64"` (what the openai SDK
asks for by default) packs it as little-endian float32, as OpenAI does.
"""

from __future__ import annotations

import base64
import random
import struct
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hardcap_core.local.mock_billing import text_tokens
from hardcap_core.local.mock_truth import GroundTruth

DEFAULT_DIMENSIONS = 8


def embeddings_routes(truth: GroundTruth, seed: int | None) -> list[Route]:
    """The embeddings route, sharing the mock's ground truth."""
    rng = random.Random(seed)

    async def embeddings(request: Request) -> Response:
        body = await request.json()
        items = _items(body.get("input") if isinstance(body, dict) else None)
        if items is None:
            return _error("input must be a string, strings, or token arrays")
        tokens = sum(text_tokens(i) if isinstance(i, str) else len(i) for i in items)
        user = body.get("user")
        tenant = user if isinstance(user, str) and user else "anonymous"
        account = truth.receive(tenant, tokens, None, refused=False)
        if account is not None:
            account.close(True)
        size = body.get("dimensions") or DEFAULT_DIMENSIONS
        b64 = body.get("encoding_format") == "base64"
        data = []
        for index in range(len(items)):
            vector = [round(rng.uniform(-1, 1), 6) for _ in range(size)]
            value: Any = (
                base64.b64encode(struct.pack(f"<{size}f", *vector)).decode() if b64 else vector
            )
            data.append({"object": "embedding", "index": index, "embedding": value})
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse(
            {"object": "list", "data": data, "model": body.get("model"), "usage": usage}
        )

    return [Route("/v1/embeddings", embeddings, methods=["POST"])]


def _items(value: Any) -> list[Any] | None:
    """The inputs as a list of texts and token arrays, or None for a shape OpenAI refuses."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        return None
    if all(isinstance(t, int) for t in value):
        return [value]
    if all(isinstance(i, str | list) for i in value):
        return value
    return None


def _error(message: str) -> JSONResponse:
    error = {"message": message, "type": "invalid_request_error", "param": "input", "code": None}
    return JSONResponse({"error": error}, status_code=400)
