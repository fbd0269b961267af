"""What an Anthropic Messages request's input is counted: the gateway's estimate, which is what
admission reserves first, and what Anthropic bills beyond OpenAI's rules.

The estimate is :func:`hardcap_core.wire.openai_input.input_tokens` on the translated (OpenAI
chat) body, plus what Anthropic bills beyond OpenAI's rules (:func:`anthropic_extra_tokens`),
so it is an upper bound whichever kind of upstream the route has. A PDF is read once for both
(:mod:`hardcap_core.wire.pdf`): its pages' text bound and OpenAI's image of each page in the
first, what Anthropic's image of a page costs more in the second.

``POST /v1/messages/count_tokens`` answers what the route counts (:mod:`hardcap_core.tokenize`):
its tokenizer's count where it has one (exact for a public encoding; the calibrated bound, or
the upstream's own count_tokens with ``count_api: true``, for an Anthropic model), else this
estimate. Either is what admission reserves when the bound does not fit, so a client that
sizes its request by this answer is not refused for input it was told fits. The price of the
bound alone: English prose counts about 2.6 times its real tokens (:mod:`hardcap_core.tokens`).
"""

from __future__ import annotations

import math
from typing import Any

from hardcap_core.chat import ChatRequest
from hardcap_core.wire.media import base64_bytes, image_size, url_image_tokens
from hardcap_core.wire.openai_input import pdf_documents
from hardcap_core.wire.pdf import PAGE_IMAGE_TOKENS

# Anthropic adds a system prompt when tools are given: 159 to 530 input tokens by model and
# tool_choice (tool-use docs, "Pricing"); the largest is charged.
TOOL_SYSTEM_PROMPT_TOKENS = 530
# Images: Anthropic bills width x height / 750 after fitting the long edge into 1568 px and the
# area into about 1.15 megapixels (vision docs); about 1,600 tokens at most.
ANTHROPIC_IMAGE_LONG_EDGE = 1568
ANTHROPIC_IMAGE_BOUND = 1600
# PDFs: each page is billed as its text plus an image of it (PDF docs: "1,500 to 3,000 tokens
# per page" of text, plus the image's cost). OpenAI's count of the body holds the text's bound
# and OpenAI's image of each page (wire/pdf.py); what Anthropic's image costs more is added.
PDF_PAGE_EXTRA_TOKENS = PAGE_IMAGE_TOKENS["anthropic"] - PAGE_IMAGE_TOKENS["openai"]


def anthropic_extra_tokens(body: dict[str, Any]) -> int:
    """What Anthropic bills for a translated ``body`` beyond OpenAI's rules: the tool-use
    system prompt, images where its rule costs more, and its image of each PDF page."""
    extra = TOOL_SYSTEM_PROMPT_TOKENS if body.get("tools") else 0
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if isinstance(url, str):
                extra += max(0, _anthropic_image(url) - url_image_tokens(url, None))
    return extra + sum(cost.pages for _, cost in pdf_documents(body)) * PDF_PAGE_EXTRA_TOKENS


def _anthropic_image(url: str) -> int:
    data = base64_bytes(url.partition(",")[2], 64 * 1024) if url.startswith("data:") else b""
    size = image_size(data) if data else None
    if size is None:
        return ANTHROPIC_IMAGE_BOUND
    width, height = float(size[0]), float(size[1])
    scale = min(1.0, ANTHROPIC_IMAGE_LONG_EDGE / max(width, height))
    # Larger images are scaled down to about the bound's area (its docs list 1092 x 1092 at
    # 1,590 tokens), so the bound caps what the long edge alone would give.
    return min(ANTHROPIC_IMAGE_BOUND, math.ceil(width * height * scale * scale / 750))


def count_tokens_reply(request: ChatRequest, counted: int | None = None) -> dict[str, int]:
    """The body of a count_tokens answer for a parsed (``counting=True``) request: ``counted``,
    the route's count (:meth:`~hardcap_core.tokenize.routes.InputCounts.reported`), else the
    request's estimate."""
    return {"input_tokens": request.input_tokens if counted is None else counted}
