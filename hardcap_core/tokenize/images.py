"""What an image in a prompt is billed, per model family: the rules as data, one table.

Three rules, each an upper bound on what its provider documents (docs/config.md has the table
with its sources):

- :class:`TileRule` (OpenAI's GPT-4o family and its kin): ``detail: low`` is the base cost;
  otherwise the image is scaled to fit in 2048 x 2048, then down so its shortest side is at most
  768 px, and costs the base plus one tile cost per 512-px tile. The base and tile costs differ
  by model (gpt-4o 85/170, gpt-4o-mini 2,833/5,667, ...). ``auto`` counts as ``high``: the
  model may choose it.
- :class:`PatchRule` (gpt-4.1-mini/-nano, o4-mini, gpt-5-mini/-nano): 32-px patches covering
  the image, at most 1,536 (a larger image is scaled down so its width is a whole number of
  patches), times a per-model multiplier. ``detail`` is not read: OpenAI documents no low
  detail for these models.
- :class:`AreaRule` (Anthropic's Claude, directly or on Bedrock): ``width x height / 750``
  after scaling the long edge down to the model's limit (1,568 px; 2,576 px from Claude Opus
  4.7), at most the model's largest image (1,640 tokens; 4,784), and never below its
  28-px patches (``ceil(w/28) x ceil(h/28)``, how the newer docs state it).

A model's rules come from :data:`FAMILIES`, the first pattern found in its lowercased name. A
model no pattern knows gets every rule, and each image is billed by the dearest of them for its
size (:func:`bill`): never the lowest. A route may name its rule and numbers
(``image_rule`` / ``image_costs``, :func:`route_rules`).

The request was counted at parse with GPT-4o's tile rule (:mod:`hardcap_core.wire.media`), the
route not being known yet; :func:`image_extra_tokens` is what a route's rules bill beyond that,
added per target by :mod:`hardcap_core.tokenize.routes`. A PDF's image of each page is one image
of a size the request does not say (providers do not document what they render a page at): the
parse counted GPT-4o's largest (:mod:`hardcap_core.wire.pdf`), a route its model's (:func:`largest`:
Claude up to 4.6 1,640, Claude Opus 4.7 4,784, gpt-4.1-nano 3,779, no known family the dearest).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from hardcap_core.wire.media import (
    IMAGE_BOUND_TOKENS,
    base64_bytes,
    data_url_payload,
    image_size,
    image_tokens,
    tiles,
)
from hardcap_core.wire.openai_input import Document, file_document
from hardcap_core.wire.pdf import Allowance

Size = tuple[int, int]
RuleName = Literal["auto", "tile", "patch", "anthropic"]

# OpenAI's tile rule: fit in 2048 x 2048, shortest side to 768, 512-px tiles (the scaling is
# wire/media.py's, which counts GPT-4o's tiles at parse). The largest image after scaling is
# 2048 x 768: 4 x 2 tiles.
MAX_TILES = 8
# OpenAI's patch rule: 32-px patches, at most 1,536 of them.
PATCH_PX = 32
MAX_PATCHES = 1536
# Anthropic: a token per 750 pixels, images padded to 28-px patches.
PIXELS_PER_TOKEN = 750
ANTHROPIC_PATCH_PX = 28
# Enough of a base64 image to read its header (a JPEG's start of frame may follow its EXIF).
HEADER_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class TileRule:
    """OpenAI's tile rule with one model's base and per-tile costs."""

    base: int
    tile: int
    name: str = "tile"

    def tokens(self, size: Size | None, detail: str | None) -> int:
        """One image of ``size`` (None: unknown, the largest) at ``detail``."""
        if detail == "low":
            return self.base
        if size is None:
            return self.largest()
        return self.base + self.tile * min(tiles(size), MAX_TILES)

    def largest(self) -> int:
        """The most one image can cost: 2048 x 768 after scaling, 8 tiles."""
        return self.base + self.tile * MAX_TILES


@dataclass(frozen=True, slots=True)
class PatchRule:
    """OpenAI's patch rule with one model's multiplier."""

    multiplier: float
    max_patches: int = MAX_PATCHES
    name: str = "patch"

    def patches(self, size: Size) -> int:
        """The 32-px patches the image is billed, by the guide's steps: the patches covering
        it; past the cap, scaled by ``sqrt(cap x 32^2 / (w x h))`` and again so its width is a
        whole number of patches, then counted again (and never past the cap)."""
        width, height = size
        raw = math.ceil(width / PATCH_PX) * math.ceil(height / PATCH_PX)
        if raw <= self.max_patches:
            return raw
        shrink = math.sqrt(self.max_patches * PATCH_PX * PATCH_PX / (width * height))
        columns = math.floor(round(width * shrink / PATCH_PX, 6))
        if columns < 1:  # a sliver: one column, as tall as the cap allows
            return self.max_patches
        # The width becomes `columns` patches exactly; the height keeps the aspect ratio.
        scaled_height = height * columns * PATCH_PX / width
        rows = math.ceil(round(scaled_height / PATCH_PX, 6))
        return min(self.max_patches, columns * rows)

    def tokens(self, size: Size | None, detail: str | None) -> int:
        """One image of ``size`` (None: unknown, the largest); ``detail`` is not read."""
        patches = self.max_patches if size is None else self.patches(size)
        return math.ceil(round(patches * self.multiplier, 6))

    def largest(self) -> int:
        """The most one image can cost: the cap's patches, multiplied."""
        return math.ceil(round(self.max_patches * self.multiplier, 6))


@dataclass(frozen=True, slots=True)
class AreaRule:
    """Anthropic's rule with one model's long edge and largest image."""

    long_edge: int
    max_tokens: int
    name: str = "anthropic"

    def tokens(self, size: Size | None, detail: str | None) -> int:
        """One image of ``size`` (None: unknown, the largest); Anthropic has no ``detail``."""
        if size is None:
            return self.max_tokens
        width, height = float(size[0]), float(size[1])
        scale = min(1.0, self.long_edge / max(width, height))
        width, height = width * scale, height * scale
        area = math.ceil(round(width * height / PIXELS_PER_TOKEN, 6))
        patches = math.ceil(round(width / ANTHROPIC_PATCH_PX, 6)) * math.ceil(
            round(height / ANTHROPIC_PATCH_PX, 6)
        )
        # A larger image is scaled down to the largest the model takes.
        return max(1, min(self.max_tokens, max(area, patches)))

    def largest(self) -> int:
        """The most one image can cost: the model's largest native image."""
        return self.max_tokens


ImageRule = TileRule | PatchRule | AreaRule

# OpenAI's images-and-vision guide, "Calculating costs".
GPT_4O = TileRule(85, 170)  # gpt-4o, gpt-4.1, gpt-4.5, gpt-4-turbo
GPT_4O_MINI = TileRule(2833, 5667)
O_SERIES = TileRule(75, 150)  # o1, o1-pro, o3
COMPUTER_USE = TileRule(65, 129)  # computer-use-preview
GPT_5 = TileRule(70, 140)  # gpt-5, gpt-5-chat-latest
GPT_41_MINI = PatchRule(1.62)
GPT_41_NANO = PatchRule(2.46)
O4_MINI = PatchRule(1.72)
# The guide lists gpt-5-mini at 1.62 and gpt-5-nano at 2.46; OpenAI's pricing calculator and
# measurements posted on its forum show 1.2 and 1.5. The higher is the bound.
GPT_5_MINI = PatchRule(1.62)
GPT_5_NANO = PatchRule(2.46)
# Anthropic's vision docs: a long edge of 1,568 px and ~1.15 megapixels (~1,600 tokens) up to
# Claude Opus 4.6 / Sonnet 4.6, but the same page's table of the largest images not resized
# lists 784 x 1,568 (1:2), which is 1,639.1 tokens by its own formula: the larger reading, 1,640,
# is the most one image holds. Claude Opus 4.7 takes 2,576 px, ~3.75 megapixels (4,784 28-px
# patches, the page image wire/pdf.py bounds a PDF page by).
CLAUDE = AreaRule(1568, 1640)
CLAUDE_HIGH_RES = AreaRule(2576, 4784)

# Every rule: what a model no pattern knows is billed by, the dearest for each size.
ALL_RULES: tuple[ImageRule, ...] = (
    GPT_4O, GPT_4O_MINI, O_SERIES, COMPUTER_USE, GPT_5,
    GPT_41_MINI, GPT_41_NANO, O4_MINI, GPT_5_MINI, GPT_5_NANO,
    CLAUDE, CLAUDE_HIGH_RES,
)  # fmt: skip
ANTHROPIC_RULES: tuple[ImageRule, ...] = (CLAUDE, CLAUDE_HIGH_RES)

# A dated snapshot or a provider's suffix after a family's name (gpt-4o-2024-08-06,
# anthropic.claude-3-haiku-20240307-v1:0, claude-sonnet-4-5@20250929).
_END = r"(?:-\d{4}-\d\d-\d\d|-\d{8}|-latest|-preview)?(?:-v\d+(?::\d+)?|@\d+)?$"
_START = r"(?:^|[/.:])"

# By the upstream model's lowercased name: the first pattern found decides. Most specific first
# (gpt-4o-mini before gpt-4o). None found: ALL_RULES.
FAMILIES: tuple[tuple[re.Pattern[str], tuple[ImageRule, ...]], ...] = (
    (re.compile(_START + r"(?:gpt-4o-mini|gpt-4o-mini-search-preview)" + _END), (GPT_4O_MINI,)),
    (re.compile(_START + r"gpt-4\.1-mini" + _END), (GPT_41_MINI,)),
    (re.compile(_START + r"gpt-4\.1-nano" + _END), (GPT_41_NANO,)),
    (re.compile(_START + r"gpt-5-mini" + _END), (GPT_5_MINI,)),
    (re.compile(_START + r"gpt-5-nano" + _END), (GPT_5_NANO,)),
    (re.compile(_START + r"o4-mini" + _END), (O4_MINI,)),
    (re.compile(_START + r"(?:gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-4-turbo)" + _END), (GPT_4O,)),
    (re.compile(_START + r"(?:o1|o1-pro|o3|o3-pro)" + _END), (O_SERIES,)),
    (re.compile(_START + r"computer-use-preview" + _END), (COMPUTER_USE,)),
    (re.compile(_START + r"(?:gpt-5|gpt-5-chat)" + _END), (GPT_5,)),
    # Claude 3.x and 4 to 4.6 (claude-3-5-sonnet, claude-sonnet-4-5, anthropic/claude-opus-4.1).
    (
        re.compile(
            r"claude-3(?:[-.][57])?-(?:opus|sonnet|haiku)"
            r"|claude-(?:opus|sonnet|haiku)-4(?:[-.][0-6])?(?:-\d{8}|-v\d|@|:|$)"
        ),
        (CLAUDE,),
    ),
    # Any other Claude: the larger images of Claude Opus 4.7 and later.
    (re.compile(r"claude"), (CLAUDE_HIGH_RES,)),
)


def rules_for(model: str, upstream_kind: str = "openai") -> tuple[ImageRule, ...]:
    """The image rules of ``model`` by its family (:data:`FAMILIES`); a model none knows gets
    every rule (only Anthropic's on an ``anthropic`` upstream, which serves only Claude)."""
    name = model.lower()
    for pattern, rules in FAMILIES:
        if pattern.search(name):
            return rules
    return ANTHROPIC_RULES if upstream_kind == "anthropic" else ALL_RULES


def route_rules(
    model: str,
    upstream_kind: str,
    rule: RuleName = "auto",
    costs: Mapping[str, float] | None = None,
) -> tuple[ImageRule, ...]:
    """A route's image rules: its family's (``auto``), or the rule it names with the numbers
    it gives (``costs``: base/tile, multiplier/max_patches, long_edge/max_tokens); a number it
    leaves out is its family's when the family has that rule, else the dearest known."""
    family = rules_for(model, upstream_kind)
    if rule == "auto":
        return family
    given = dict(costs or {})
    if rule == "tile":
        tile = _dearest(TileRule, family) or GPT_4O_MINI
        assert isinstance(tile, TileRule)
        base, per_tile = given.get("base_tokens", tile.base), given.get("tile_tokens", tile.tile)
        return (TileRule(int(base), int(per_tile)),)
    if rule == "patch":
        patch = _dearest(PatchRule, family) or GPT_41_NANO
        assert isinstance(patch, PatchRule)
        multiplier = given.get("multiplier", patch.multiplier)
        return (PatchRule(float(multiplier), int(given.get("max_patches", patch.max_patches))),)
    area = _dearest(AreaRule, family) or CLAUDE_HIGH_RES
    assert isinstance(area, AreaRule)
    long_edge = int(given.get("long_edge", area.long_edge))
    return (AreaRule(long_edge, int(given.get("max_tokens", area.max_tokens))),)


def _dearest(kind: type, rules: tuple[ImageRule, ...]) -> ImageRule | None:
    """Of ``rules``, the one of ``kind`` whose largest image costs most."""
    of_kind = [r for r in rules if isinstance(r, kind)]
    return max(of_kind, key=lambda r: r.largest()) if of_kind else None


def bill(rules: tuple[ImageRule, ...], size: Size | None, detail: str | None) -> int:
    """One image by the dearest of ``rules`` for its size (None: unknown, each rule's
    largest)."""
    return max(rule.tokens(size, detail) for rule in rules)


def largest(rules: tuple[ImageRule, ...]) -> int:
    """The most one image of any size can cost by ``rules``."""
    return max(rule.largest() for rule in rules)


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image of a request as the parse counted it: its size when its bytes are in the
    request and readable, its ``detail``, and the tokens the parse counted for it."""

    size: Size | None
    detail: str | None
    counted: int


def images(body: Mapping[str, Any]) -> Iterator[ImageInput | Document]:
    """Each ``image_url`` part of an OpenAI-shaped ``body``'s messages (every wire format is
    translated to that shape: Responses' ``input_image``, Anthropic's image blocks), as
    :mod:`hardcap_core.wire.openai_input` counted it, and each PDF of its ``file`` parts
    (Anthropic's document blocks, Responses' ``input_file``), whose pages are images too."""
    documents = Allowance()  # the parse read them within the caps: read again, the same
    for i, message in enumerate(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(part, dict) or part.get("type") not in ("image_url", "file", None):
                continue
            image = part.get("image_url")
            if image is not None and part.get("type") != "file":
                yield _image(image)
            file = part.get("file")
            if file is not None and part.get("type") != "image_url":
                document = file_document(file, f"messages[{i}].content[{j}]", documents)
                if document is not None:
                    yield document


def _image(image: Any) -> ImageInput:
    url = image.get("url") if isinstance(image, dict) else image
    detail = image.get("detail") if isinstance(image, dict) else None
    detail = detail if isinstance(detail, str) else None
    if not isinstance(url, str):  # counted as the bound plus its text: no size to read
        return ImageInput(None, detail, IMAGE_BOUND_TOKENS)
    payload = data_url_payload(url)
    size = None if payload is None else image_size(base64_bytes(payload, HEADER_BYTES))
    if size is None and payload is not None:  # a header past the first bytes: read it all
        size = image_size(base64_bytes(payload))
    # What wire/openai_input.py counted: media's rule on the same size.
    return ImageInput(size, detail, image_tokens(size, detail))


def billed(rules: tuple[ImageRule, ...], found: ImageInput | Document) -> int:
    """What ``rules`` bill for one image, or for one PDF: its text bound and, for each page,
    the most one image of any size costs by them (:func:`largest`)."""
    if isinstance(found, Document):
        return found.tokens(largest(rules))
    return bill(rules, found.size, found.detail)


def image_extra_tokens(
    body: Mapping[str, Any],
    rules: tuple[ImageRule, ...],
    found: tuple[ImageInput | Document, ...] | None = None,
) -> int:
    """What ``rules`` bill for ``body``'s images and PDF page images (``found``: read from it
    already) beyond what the parse counted for them. Less than nothing where the rules bill
    less (o3's 75 + 150 a tile against GPT-4o's 85 + 170): the parse's count of each image and
    document is replaced by the rule's, the same walk over the same parts (:func:`images`), so
    the rest of the bound is kept."""
    found = tuple(images(body)) if found is None else found
    return sum(billed(rules, i) - i.counted for i in found)
