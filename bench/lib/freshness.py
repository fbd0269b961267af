"""Whether a stored result still describes the code: the commit it measured, against the last
commit that changed the code it measures, and whether its stored command can be rerun elsewhere.

A result measured at commit R is older than its code when the last commit C touching the
benchmark's ``measures`` paths is not an ancestor of R (``git merge-base --is-ancestor C R``).
A result that stored no commit is treated as older: nothing shows it saw the current code.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
# An absolute path in a stored command: a token starting with / or ~/ (also after KEY= or --x=).
_ABSOLUTE = re.compile(r"(?:^|[\s=:,])(/[\w.~-]|~/)")


@dataclass(frozen=True)
class Freshness:
    """What --list and the tables' captions say about one result."""

    commit: str | None  # the commit the result measured; None if it stored none
    code_commit: str | None  # the last commit that changed the code it measures
    stale: bool
    absolute: bool  # its stored command holds an absolute path

    def caption(self) -> str:
        """'measured at X; ...' for a table's caption."""
        if self.commit is None:
            return "no commit stored with this result: treat it as older than the code it measures"
        text = f"measured at `{self.commit[:10]}`"
        if self.stale and self.code_commit:
            text += f"; the code it measures changed since at `{self.code_commit[:10]}`"
        return text


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def stored(data: dict[str, Any]) -> tuple[str | None, str]:
    """The commit and the command a result stored (the machine block holds the commit)."""
    machine = data.get("machine") or {}
    commit = machine.get("git_commit") or data.get("git_commit") or data.get("commit")
    return (commit or None), str(data.get("command") or "")


def absolute_path(command: str) -> bool:
    """True if the stored command names a path of the machine that ran it."""
    return bool(_ABSOLUTE.search(command))


def last_change(paths: tuple[str, ...]) -> str | None:
    """The last commit touching ``paths`` (None outside a git checkout)."""
    out = _git("log", "-1", "--format=%H", "--", *paths)
    return out.stdout.strip() or None


def is_ancestor(older: str, newer: str) -> bool:
    return _git("merge-base", "--is-ancestor", older, newer).returncode == 0


def made_by(plot: Path) -> dict[str, Any]:
    """The JSON result beside ``plot`` (a PNG or SVG stores no commit) that names it as its
    output (the wrk run that recorded the flame graphs), or the result of the same name whose
    run drew it (``failover.json`` run with ``--plot`` draws ``failover.png``); {} if none."""
    twin = plot.with_suffix(".json")
    if twin.exists():
        data: dict[str, Any] = json.loads(twin.read_text())
        if "--plot" in stored(data)[1] and stored(data)[0]:
            return data
    for candidate in sorted(plot.parent.glob("*.json")):
        text = candidate.read_text()
        if plot.name in text:
            data = json.loads(text)
            if stored(data)[0]:
                return data
    return {}


def check(path: Path, measures: tuple[str, ...]) -> Freshness:
    """The freshness of the result at ``path``; a plot takes the commit of the result that
    made it (:func:`made_by`), else it stored none."""
    data: dict[str, Any] = {}
    if path.suffix == ".json" and path.exists():
        data = json.loads(path.read_text())
    elif path.exists():
        data = made_by(path)
    commit, command = stored(data)
    code = last_change(measures)
    stale = commit is None or (code is not None and not is_ancestor(code, commit))
    return Freshness(commit, code, stale, absolute_path(command))
