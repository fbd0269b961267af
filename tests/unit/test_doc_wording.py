"""The README and docs/ speak to a user, who cannot read the project's own bookkeeping.

"Goal (issue 13)", "since issue 19", "this stop's work", "the lead's call": each names an entry in a
tracker or a role the reader has never seen. Test names and commit messages may keep them; the
user-facing text says what the thing is instead. A number of another project's tracker is fine
when it says whose it is (``PR #871``, ``aws-lambda-web-adapter#793``), and a quotation is
quoted as written.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

BOOKKEEPING = re.compile(
    r"\bissues? #?\d+"  # issue 13, issues 13 and 14, issue #13
    r"|\((?:see )?issue\b"  # (issue ...)
    r"|\b(?:the|this|that) issue(?:'s)?\b(?! in)"  # the issue asks ...; not "a known issue in"
    r"|\b(?:this|that|the previous|the next) stop(?:'s)?\b|\bstop \d+\b"  # a work stop
    r"|\bthe lead(?:'s)?\b(?!-)"  # a role in the team, not "the lead-in"
    r"|(?<![\w/.-])(?<!PR )#\d+\b",  # a bare #13: whose?
    re.IGNORECASE,
)
URL = re.compile(r"https?://[^\s)>\]]+")
# A quotation: within one paragraph, and short (a stray quote mark must not hide a page).
QUOTED = re.compile(r"\"(?:[^\"\n]|\n(?![ \t]*\n)){0,400}\"")


def blank(match: re.Match[str]) -> str:
    """The match's text as spaces, its line breaks kept, so line numbers stay right."""
    return re.sub(r"[^\n]", " ", match.group(0))


def bookkeeping(text: str) -> list[tuple[int, str]]:
    """The tracker and team references in ``text`` (with their line), outside URLs and
    quotations (a quotation may run over lines)."""
    seen = QUOTED.sub(blank, URL.sub(blank, text))
    return [(seen.count("\n", 0, m.start()) + 1, m.group(0)) for m in BOOKKEEPING.finditer(seen)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_user_facing_docs_name_no_issue_or_stop(doc: Path) -> None:
    assert bookkeeping(doc.read_text()) == []


def test_the_check_sees_what_a_reader_would_trip_on() -> None:
    def hits(text: str) -> list[str]:
        return [hit for _, hit in bookkeeping(text)]

    assert hits("| Goal (issue 13) | Target |") == ["(issue"]
    assert hits("the default since issue 14;\nthis stop's work") == ["issue 14", "this stop's"]
    assert bookkeeping("as in #12,\nthe lead's call") == [(1, "#12"), (2, "the lead's")]
    assert hits("The issue asks 200 streams/s.") == ["The issue"]
    assert (
        hits(
            "PR #871, aws-lambda-web-adapter#793, https://github.com/o/r/issues/490, "
            '"later\nreverted in #793", the tenant\'s issuer, a known issue in a dependency, '
            "the lead-in"
        )
        == []
    )
