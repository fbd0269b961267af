"""What an Anthropic Messages request's input is counted: the gateway's estimate, which is what
admission reserves first, and what Anthropic bills beyond OpenAI's rules.

The estimate is :func:`hardcap_core.wire.openai_input.input_tokens` on the translated (OpenAI
chat) body, plus what Anthropic bills beyond OpenAI's rules (:func:`anthropic_extra_tokens`),
so it is an upper bound whichever kind of upstream the route has. A PDF counts its pages' text
bound and GPT-4o's image of each page in the first (:mod:`hardcap_core.wire.pdf`); each route
target replaces the image of each page by its model's, as it does for images
(:func:`hardcap_core.tokenize.images.image_extra_tokens`).

``POST /v1/messages/count_tokens`` answers what the route counts (:mod:`hardcap_core.tokenize`):
its tokenizer's count where it has one (exact for a public encoding; the calibrated bound, or
the upstream's own count_tokens with ``count_api: true``, for an Anthropic model), else this
estimate. Either is what admission reserves when the bound does not fit, so a client that
sizes its request by this answer is not refused for input it was told fits. The price of the
bound alone: English prose counts about 2.6 times its real tokens
(:mod:`hardcap_core.tokenize.heuristics`).
"""

from __future__ import annotations

from typing import Any

from hardcap_core.chat import ChatRequest

# Anthropic adds a system prompt when tools are given: 159 to 530 input tokens by model and
# tool_choice (tool-use docs, "Pricing"); the largest is charged.
TOOL_SYSTEM_PROMPT_TOKENS = 530
# Images, and the image of each PDF page, are billed by the route's model
# (hardcap_core/tokenize/images.py, added per target by hardcap_core/tokenize/routes.py): the
# parse does not know the route. A PDF page is billed as its text plus an image of it (PDF
# docs: "1,500 to 3,000 tokens per page" of text, plus the image's cost): the most one image
# costs with the model, 1,640 tokens up to Claude Opus 4.6 / Sonnet 4.6, 4,784 from Opus 4.7.


def anthropic_extra_tokens(body: dict[str, Any]) -> int:
    """What Anthropic bills for a translated ``body`` beyond OpenAI's rules: the tool-use
    system prompt (its images and the images of its PDF pages: by the route's model, see
    :func:`hardcap_core.tokenize.images.image_extra_tokens`)."""
    return TOOL_SYSTEM_PROMPT_TOKENS if body.get("tools") else 0


def count_tokens_reply(request: ChatRequest, counted: int | None = None) -> dict[str, int]:
    """The body of a count_tokens answer for a parsed (``counting=True``) request: ``counted``,
    the route's count (:meth:`~hardcap_core.tokenize.routes.InputCounts.reported`), else the
    request's estimate."""
    return {"input_tokens": request.input_tokens if counted is None else counted}
