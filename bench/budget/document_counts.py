"""Documents per model family: what the gateway holds for a PDF against what the model bills.

For each real-shaped document of ``tests/pdf_samples.py`` (a report, slides, a scan, a form)
and a model of each page-image rule (Claude up to 4.6, Claude Opus 4.7, GPT-4o's tiles,
gpt-4.1-nano's patches), a one-document request on a route whose upstream model is that model:
the input the gateway reserves for the document (``InputCounts.bound`` of the request less the
same request without it: the page text's bound, and the model's largest image for each page)
and what the mock upstream bills for it (the provider's documented rule: each page's
pypdf-extracted text by cl100k_base, and an image of the page rendered at 144 dpi, by
``mock_billing`` for OpenAI's models, by ``mock_anthropic`` for Claude's). A Claude request is
an Anthropic ``document`` block, an OpenAI one a ``file`` part.

``before`` is the hold of the previous ``wire/pdf.py``: every page's image at the provider's
dearest (4,784 tokens on any Claude model, GPT-4o's 1,445 on any OpenAI model), whatever the
route's model. Goals: never below the bill (every row), at most 3x.

    python -m bench document_counts            # table + result file
    python -m bench document_counts --check    # exit 1 if a goal is missed
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import Any

from bench.lib.machine import ROOT, write_goal_result
from hardcap_core.chat import ChatRequest
from hardcap_core.config import parse_config
from hardcap_core.local import mock_anthropic, mock_billing
from hardcap_core.tokenize.images import largest
from hardcap_core.tokenize.routes import InputCounts
from hardcap_core.wire.anthropic_request import parse_messages_request
from hardcap_core.wire.openai_input import pdf_documents
from hardcap_core.wire.openai_request import parse_chat_request
from tests.pdf_samples import corpus

RESULT = ROOT / "bench" / "results" / "document-counts.json"
# model: its upstream kind
MODELS = {
    "claude-sonnet-4-5": "anthropic",
    "claude-opus-4-7": "anthropic",
    "gpt-4o": "openai",
    "gpt-4.1-nano": "openai",
}
# The previous wire/pdf.py's image of each page, by provider.
BEFORE_PAGE_IMAGE = {"anthropic": 4_784, "openai": 1_445}
GOAL_MOST = 3.0
QUESTION = "Summarize the document."


def request(model: str, pdf: bytes | None) -> dict[str, Any]:
    """A one-document request for ``model`` in its provider's format (None: no document)."""
    data = base64.b64encode(pdf).decode() if pdf is not None else None
    content: list[dict[str, Any]] = [{"type": "text", "text": QUESTION}]
    if MODELS[model] == "anthropic":
        if data is not None:
            source = {"type": "base64", "media_type": "application/pdf", "data": data}
            content.insert(0, {"type": "document", "source": source})
        return {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
    if data is not None:
        file = {"filename": "document.pdf", "file_data": f"data:application/pdf;base64,{data}"}
        content.append({"type": "file", "file": file})
    return {"model": model, "messages": [{"role": "user", "content": content}]}


def parsed(model: str, body: dict[str, Any]) -> ChatRequest:
    raw = json.dumps(body | {"model": "r"}).encode()
    return parse_messages_request(raw) if MODELS[model] == "anthropic" else parse_chat_request(raw)


def billed(model: str, body: dict[str, Any]) -> int:
    """What the model's provider bills for ``body``'s prompt, as the mock bills it."""
    if MODELS[model] == "anthropic":
        return mock_anthropic.anthropic_prompt_tokens(body)
    return mock_billing.prompt_tokens(body)


def measure(model: str) -> list[dict[str, Any]]:
    kind = MODELS[model]
    config = {
        "gateway": {"redis_url": "redis://127.0.0.1:1"},
        "upstreams": [{"name": "u", "kind": kind, "base_url": "http://127.0.0.1:1/v1"}],
        "routes": [{"name": "r", "upstream": "u", "model": model}],
    }
    counts = InputCounts(parse_config(config))
    route = counts.chains["r"][0]
    page_image = largest(route.image_rules)
    without = request(model, None)
    held_without = counts.bound(route, parsed(model, without))
    rows = []
    for name, pdf in corpus().items():
        body = request(model, pdf)
        chat = parsed(model, body)
        pages = sum(d.cost.pages for d in pdf_documents(chat.body))
        held = counts.bound(route, chat) - held_without
        bill = billed(model, body) - billed(model, without)
        before = held - pages * (page_image - BEFORE_PAGE_IMAGE[kind])
        rows.append(
            {
                "model": model,
                "document": name,
                "pages": pages,
                "page_image_held": page_image,
                "held": held,
                "billed": bill,
                "ratio": round(held / bill, 4),
                "before_held": before,
                "before_ratio": round(before / bill, 4),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = parser.parse_args(argv)

    rows = [row for model in MODELS for row in measure(model)]
    per_model = {}
    for model in MODELS:
        mine = [r for r in rows if r["model"] == model]
        per_model[model] = {
            "ratio_min": min(r["ratio"] for r in mine),
            "ratio_max": max(r["ratio"] for r in mine),
            "before_ratio_min": min(r["before_ratio"] for r in mine),
            "before_ratio_max": max(r["before_ratio"] for r in mine),
            "never_below": all(r["held"] >= r["billed"] for r in mine),
        }
    width = max(len(m) for m in MODELS)
    print(f"{'model':<{width}} {'document':<17} {'pages':>5} {'held':>7} {'billed':>7} "
          f"{'ratio':>6} {'before':>7}")  # fmt: skip
    for r in rows:
        print(f"{r['model']:<{width}} {r['document']:<17} {r['pages']:>5} {r['held']:>7} "
              f"{r['billed']:>7} {r['ratio']:>6.2f} {r['before_ratio']:>7.2f}")  # fmt: skip
    for model, s in per_model.items():
        before = f"{s['before_ratio_min']:.2f}-{s['before_ratio_max']:.2f}x"
        after = f"{s['ratio_min']:.2f}-{s['ratio_max']:.2f}x"
        print(f"{model:<{width}} {before} -> {after}, never below: {s['never_below']}")
    missed = [m for m, s in per_model.items() if not s["never_below"]]
    missed += [m for m, s in per_model.items() if s["ratio_max"] > GOAL_MOST]
    missed = write_goal_result(
        args.out,
        "document-counts",
        argv,
        goal={"never_below": True, "ratio_max": GOAL_MOST},
        rows=rows,
        per_model=per_model,
        missed=missed,
    )
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
