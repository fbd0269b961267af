"""Images per model family: what the gateway holds for an image against what the model bills.

For each model family of ``hardcap_core/tokenize/images.py`` and a set of image sizes and
``detail`` values, a one-image OpenAI chat request on a route whose upstream model is that
model: the input the gateway reserves for it (``InputCounts.bound``, the route's image rule
added to the parse's count) and what the mock upstream bills (``mock_billing``, by the model's
family as OpenAI bills; a Claude model by the Anthropic mock's own rule, ``mock_anthropic``).
The image's share is each side minus the same request without the image.

Goals: never over (the hold is at least the bill, every row), and usable >= 99 % (the bill
over the hold, summed over the images whose size the request carries, per model). An image
whose size the gateway cannot see (a remote URL) is held the largest the rule bills: listed,
not in the usable figure. A model of no known family is held every rule's dearest and billed
(by the mock) GPT-4o's: listed to show what that costs.

    python -m bench image_rules                # table + result file
    python -m bench image_rules --check        # exit 1 if a goal is missed
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import Any

from bench.budget.input_shapes import png
from bench.lib.machine import ROOT, write_goal_result
from hardcap_core.config import parse_config
from hardcap_core.local import mock_anthropic, mock_billing
from hardcap_core.tokenize.routes import InputCounts
from hardcap_core.wire.openai_request import parse_chat_request

RESULT = ROOT / "bench" / "results" / "image-rules.json"
MODELS = (
    "gpt-4o", "gpt-4o-mini", "o3", "computer-use-preview", "gpt-5",
    "gpt-4.1-mini", "gpt-4.1-nano", "o4-mini", "gpt-5-mini", "gpt-5-nano",
    "claude-sonnet-4-5", "claude-opus-4-7", "llama-3.3-70b-vision",
)  # fmt: skip
UNKNOWN = "llama-3.3-70b-vision"
# (width, height, detail); None: a remote URL, the size unseen.
IMAGES: tuple[tuple[int, int, str] | None, ...] = (
    (1024, 1024, "high"),
    (2048, 4096, "auto"),
    (1800, 2400, "high"),
    (800, 600, "high"),
    (4000, 3000, "low"),
    (200, 200, "high"),
    (1920, 1080, "auto"),
    None,
)
GOAL_USABLE = 0.99


def body(model: str, image: tuple[int, int, str] | None) -> dict[str, Any]:
    """A one-image request for ``model`` (None: the image left out)."""
    content: list[dict[str, Any]] = [{"type": "text", "text": "Describe this picture."}]
    if image is not None:
        width, height, detail = image
        url = "data:image/png;base64," + base64.b64encode(png(width, height)).decode()
        content.append({"type": "image_url", "image_url": {"url": url, "detail": detail}})
    return {"model": model, "messages": [{"role": "user", "content": content}]}


def remote(model: str) -> dict[str, Any]:
    part = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    return {"model": model, "messages": [{"role": "user", "content": [part]}]}


def billed_image(model: str, request: dict[str, Any], without: dict[str, Any]) -> int:
    """What the model's provider bills for the request's one image, as the mock bills it."""
    if "claude" in model:
        url = request["messages"][0]["content"][-1]["image_url"]["url"]
        source: dict[str, Any] = {"type": "url", "url": url}
        if url.startswith("data:"):
            source = {"type": "base64", "media_type": "image/png", "data": url.partition(",")[2]}
        return mock_anthropic.image_tokens(source, mock_anthropic.image_limits(model))
    return mock_billing.prompt_tokens(request) - mock_billing.prompt_tokens(without)


def held_image(counts: InputCounts, request: dict[str, Any], without: dict[str, Any]) -> int:
    """What the gateway holds for the request's image: its bound less the bound without it."""
    route = counts.chains["r"][0]
    with_image = parse_chat_request(json.dumps(request).encode())
    plain = parse_chat_request(json.dumps(without).encode())
    return counts.bound(route, with_image) - counts.bound(route, plain)


def measure(model: str) -> list[dict[str, Any]]:
    kind = "anthropic" if "claude" in model else "openai"
    config = {
        "gateway": {"redis_url": "redis://127.0.0.1:1"},
        "upstreams": [{"name": "u", "kind": kind, "base_url": "http://127.0.0.1:1/v1"}],
        "routes": [{"name": "r", "upstream": "u", "model": model}],
    }
    counts = InputCounts(parse_config(config))
    rows = []
    for image in IMAGES:
        if image is None:
            request = remote(model)
            without = {"model": model, "messages": [{"role": "user", "content": []}]}
        else:
            request, without = body(model, image), body(model, None)
        held = held_image(counts, request, without)
        billed = billed_image(model, request, without)
        rows.append(
            {
                "model": model,
                "image": "remote URL" if image is None else f"{image[0]}x{image[1]} {image[2]}",
                "size_known": image is not None,
                "held": held,
                "billed": billed,
                "ratio": round(held / billed, 4),
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
        known = [r for r in rows if r["model"] == model and r["size_known"]]
        per_model[model] = {
            "never_over": all(r["held"] >= r["billed"] for r in rows if r["model"] == model),
            "usable": round(sum(r["billed"] for r in known) / sum(r["held"] for r in known), 4),
        }
    width = max(len(m) for m in MODELS)
    print(f"{'model':<{width}} {'image':<16} {'held':>7} {'billed':>7} {'ratio':>6}")
    for r in rows:
        print(f"{r['model']:<{width}} {r['image']:<16} {r['held']:>7} {r['billed']:>7} "
              f"{r['ratio']:>6.2f}")  # fmt: skip
    for model, s in per_model.items():
        print(f"{model:<{width}} never over: {s['never_over']}, usable {s['usable'] * 100:.1f}%")
    known = [m for m in MODELS if m != UNKNOWN]
    missed = [m for m in known if not per_model[m]["never_over"]]
    missed += [m for m in known if per_model[m]["usable"] < GOAL_USABLE]
    missed += [UNKNOWN] if not per_model[UNKNOWN]["never_over"] else []
    missed = write_goal_result(
        args.out,
        "image-rules",
        argv,
        goal={"never_over": True, "usable_min": GOAL_USABLE},
        rows=rows,
        per_model=per_model,
        missed=missed,
    )
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
