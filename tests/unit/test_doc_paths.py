"""Every repository path the docs and the comments name exists, and every link lands.

A path in prose is a promise to the next reader ("the rule is in gateway/money.py"); when a file
moves and the sentence stays, the reader goes looking for something that is not there. This test
reads the README, docs/*.md, and the comments and docstrings of the code (Python, Lua, shell,
YAML, the Makefiles), and checks each path they name.

What counts as a path (the grammar): a token of ``/``-separated names whose first name is a
top-level folder of the repository (``hardcap_core``, ``tests``, ``bench``, ...) or a subpackage
of ``hardcap_core`` (``gateway/meter.py`` and ``lua/admit.lua`` are read relative to
``hardcap_core/``), backticked or bare, with or without a file extension. ``<kind>``, ``NAME``-
style placeholders and ``*`` match any one name, ``{a,b}`` either, ``…`` and a trailing ``/``
name a folder. A path that starts with ``/``, ``./`` or sits inside a URL is not the
repository's. Paths no checkout holds (a file you write, another project's) are in ``ALLOWED``,
each with its reason. Markdown links (``[text](target#anchor)``) in the README and docs/ must
reach a file, and their anchor a heading of it.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hardcap_core"
TOP = {"hardcap_core", "functions", "infra", "tests", "bench", "docs", "events", "examples", ".ci"}
SUBPACKAGES = {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_")}

# Paths a doc may name though no checkout holds them, each with the reason.
ALLOWED = {
    "infra/config.yaml": "your deploy config: you copy it from examples/config.yaml (deploy.md)",
    "docs/guide/src": "aws-lambda-web-adapter's documentation, quoted in deploy.md, coldstart.md",
    "tests/lib/chat": "openai-python's tests, where tests/fixtures/providers' recordings come from",
    "bench/results/live-providers.json": "what a run against real providers writes: none is "
    "committed (no provider keys where the benchmarks run)",
}
# A name ending in one of these is a file; ``app.handler`` names ``handler`` in ``app.py``.
FILE_EXTENSIONS = {"py", "md", "lua", "json", "yaml", "yml", "toml", "sh", "txt", "png", "svg"}

_NAME = r"[\w.*<>{},…-]+"
PATH_TOKEN = re.compile(
    rf"(?<![\w./:~$@%=#-])((?:\.ci|[A-Za-z_][\w-]*)(?:/{_NAME})+/?)",
)
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
COMMENTED = {".lua": "--", ".sh": "#", ".yaml": "#", ".yml": "#", ".toml": "#", ".in": "#"}
SCANNED_DIRS = ("hardcap_core", "functions", "infra", "tests", "bench", "examples", ".ci")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def code_files() -> Iterator[Path]:
    """Files whose comments are scanned: the code folders, the Makefiles, the CI script."""
    yield ROOT / "Makefile"
    yield ROOT / ".ci" / "run"
    for top in SCANNED_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            skipped = {".aws-sam", "__pycache__", "node_modules"}  # built or installed, not ours
            if skipped.intersection(path.parts) or not path.is_file():
                continue
            if path.parent == ROOT / "bench" / "results":
                continue  # a result is a record of its run: it names paths as they were then
            if path.suffix in {".py", ".md", *COMMENTED} or path.name == "Makefile":
                yield path


def python_prose(source: str) -> Iterator[tuple[int, str]]:
    """Comments, and strings that stand alone as statements (docstrings), with their line."""
    statement_start = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    previous = tokenize.NEWLINE  # the last token that is not a comment or a blank line
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        comment = tok.type == tokenize.COMMENT
        if comment or (tok.type == tokenize.STRING and previous in statement_start):
            yield tok.start[0], tok.string
        if not comment and tok.type != tokenize.NL:
            previous = tok.type


def line_comments(source: str, marker: str) -> Iterator[tuple[int, str]]:
    """The text after ``marker`` on each line that has one after a space or at its start."""
    pattern = re.compile(rf"(?:^|\s){re.escape(marker)}(.*)$")
    for number, line in enumerate(source.splitlines(), 1):
        if match := pattern.search(line):
            yield number, match.group(1)


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """The human-written text of a file: all of a Markdown file, the comments of code."""
    source = path.read_text()
    if path.suffix == ".md":
        yield from enumerate(source.splitlines(), 1)
    elif path.suffix == ".py":
        yield from python_prose(source)
    elif path.suffix in COMMENTED:
        yield from line_comments(source, COMMENTED[path.suffix])
    else:  # Makefile, .ci/run
        yield from line_comments(source, "#")


def expand(token: str) -> list[str]:
    """``{a,b}`` alternatives, each a glob pattern (placeholders become ``*``)."""
    if match := re.search(r"\{([^{}]*)\}", token):
        head, tail = token[: match.start()], token[match.end() :]
        return [p for alt in match.group(1).split(",") for p in expand(head + alt + tail)]
    token = re.sub(r"<[^<>/]*>", "*", token)
    token = re.sub(r"(?<![\w])[A-Z][A-Z_]+(?![\w])", "*", token)  # NAME, KIND
    return [token]


def exists(pattern: str) -> bool:
    """Whether a file or folder of the checkout matches ``pattern`` (relative to the root)."""
    if allowed_by(pattern):
        return True
    return any(any(True for _ in ROOT.glob(p)) for p in spellings(pattern))


def allowed_by(pattern: str) -> str | None:
    return next((a for a in ALLOWED if pattern == a or pattern.startswith(f"{a}/")), None)


def spellings(pattern: str) -> list[str]:
    """A file, or a module as a reader names it: ``gateway/loop_lag``, ``admin/app.handler``."""
    found = [pattern, f"{pattern}.py"]
    stem, dot, suffix = pattern.rpartition(".")
    if dot and "/" not in suffix and suffix not in FILE_EXTENSIONS:
        found.append(f"{stem}.py")
    return found


def clean(token: str) -> str:
    """The path without the sentence around it: an ellipsis, closing punctuation, a last /."""
    token = token.replace("…", "").rstrip(".,;:)'\"")
    return token.rstrip("/").removesuffix("/.") or token


def candidates(token: str) -> list[str]:
    """Where a path is read from: the root for a top folder, the package for a subpackage."""
    first = token.split("/", 1)[0]
    found = []
    if first in TOP:
        found.append(token)
    if first in SUBPACKAGES:
        found.append(f"hardcap_core/{token}")
    return found


def named_paths(text: str) -> Iterator[str]:
    """The repository paths ``text`` names, as written (URLs are another site's paths)."""
    text = re.sub(r"https?://\S+", " ", text)
    for match in PATH_TOKEN.finditer(text):
        token = clean(match.group(1))
        if "/" in token and candidates(token):
            yield token


def dangling(token: str) -> bool:
    """Whether no reading of ``token`` finds every path it names (each ``{a,b}`` choice)."""
    return not any(all(exists(p) for p in expand(c)) for c in candidates(token))


def references() -> list[tuple[str, str]]:
    """Each path named, with where (``file:line``), in every file read."""
    return [
        (f"{path.relative_to(ROOT)}:{number}", token)
        for path in [*markdown_files(), *code_files()]
        if path != Path(__file__)
        for number, text in prose(path)
        for token in named_paths(text)
    ]


def test_every_path_named_in_docs_and_comments_exists() -> None:
    missing = sorted({(where, token) for where, token in references() if dangling(token)})
    assert missing == []


def test_every_allowed_path_is_still_named_somewhere() -> None:
    """An allowance nothing uses would let a future dangling path through unseen."""
    used = {
        allowed_by(p) for _, token in references() for c in candidates(token) for p in expand(c)
    }
    assert set(ALLOWED) - used == set()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors a Markdown file offers: its headings (a repeated one numbered), ``<a id>``."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fence = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (match := re.match(r"#{1,6} (.*)", line)):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found.update(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", line))
    return found


def links() -> Iterator[tuple[Path, str]]:
    for path in markdown_files():
        for target in MD_LINK.findall(path.read_text()):
            if not re.match(r"[a-z]+:", target):
                yield path, target


@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: p.name)
def test_every_markdown_link_reaches_a_file_and_its_heading(doc: Path) -> None:
    broken = []
    for source, target in links():
        if source != doc:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    assert broken == []


def test_the_grammar_reads_paths_as_a_reader_would() -> None:
    text = (
        "see `gateway/meter.py`, hardcap_core/lua/admit.lua, events/<name>.json, "
        "providers/{anthropic,bedrock}.py and https://example.com/bench/x.py; "
        "the cache/ttl ratio"
    )
    assert list(named_paths(text)) == [
        "gateway/meter.py",
        "hardcap_core/lua/admit.lua",
        "events/<name>.json",
        "providers/{anthropic,bedrock}.py",
    ]
    assert not dangling("lua/admit.lua")
    assert not dangling("events/<name>.json")
    assert dangling("gateway/no_such_module.py")
    assert dangling("providers/{anthropic,nowhere}.py")


def test_the_prose_of_code_is_its_comments_and_docstrings() -> None:
    source = (
        '"""Module doc."""\nx = "a string value"  # a comment\n\n\n'
        'def f() -> None:\n    """Doc."""\n'
    )
    assert list(python_prose(source)) == [
        (1, '"""Module doc."""'),
        (2, "# a comment"),
        (6, '"""Doc."""'),
    ]
    assert list(line_comments("run: x  # see .ci/run\n-- not lua here", "#")) == [
        (1, " see .ci/run")
    ]
