"""A price the README quotes outside the generated tables is one docs/ states, with its source.

The README is the front door: it repeats a few figures from the pages that work them out
(docs/deploy.md's idle cost, held against the template by a test; docs/cost.md's, generated from
a benchmark's result). When those pages change, a copied figure that is no longer on any of them
is one the reader cannot trace. Tables between ``<!-- bench:NAME -->`` markers are generated from
their result files and checked by the benchmark report's own tests.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = re.compile(r"<!-- bench:([\w-]+) -->.*?<!-- /bench:\1 -->", re.DOTALL)
DOLLARS = re.compile(r"\$\d[\d,]*(?:\.\d+)?")


def quoted_prices(readme: str) -> set[str]:
    """The dollar figures of the README's own prose (generated tables left out)."""
    return set(DOLLARS.findall(GENERATED.sub("", readme)))


def test_every_price_in_the_readme_is_stated_in_docs() -> None:
    docs = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    sourced = set(DOLLARS.findall(docs))
    assert quoted_prices((ROOT / "README.md").read_text()) - sourced == set()


def test_generated_tables_are_left_to_their_own_checks() -> None:
    readme = "idle $6.53\n<!-- bench:cost -->\n| $0.28 |\n<!-- /bench:cost -->\nthen $7.59"
    assert quoted_prices(readme) == {"$6.53", "$7.59"}
