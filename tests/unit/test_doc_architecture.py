"""docs/architecture.md's package table names what the package holds: every module and script,
and nothing that is gone.

The table is the newcomer's map. A module missing from it (two Lua scripts once were) is code
nobody is told about; a module it names that was deleted sends the reader looking for it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hardcap_core"
MAP = ROOT / "docs" / "architecture.md"
FOLDERS = sorted(p for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_"))


def rows() -> dict[str, str]:
    """The package table: its first cell (``config/``) to the rest of the row."""
    found = {}
    for line in MAP.read_text().splitlines():
        if match := re.match(r"\| `([^`]+)`[^|]*\| (.*)", line):
            found[match.group(1)] = match.group(2)
    return found


def row_of(folder: Path) -> str:
    table = rows()
    return table.get(f"{folder.name}/") or table.get(f"hardcap_core/{folder.name}/", "")


def named(row: str, suffix: str) -> set[str]:
    """The module or script names a row gives, backticked, with or without their suffix."""
    return {m.removesuffix(suffix) for m in re.findall(rf"`(\w+(?:{re.escape(suffix)})?)`", row)}


def modules(folder: Path) -> tuple[str, set[str]]:
    suffix = ".lua" if folder.name == "lua" else ".py"
    found = {p.stem for p in folder.glob(f"*{suffix}") if p.name != "__init__.py"}
    return suffix, found


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_every_module_and_script_is_on_the_map(folder: Path) -> None:
    row = row_of(folder)
    assert row, f"docs/architecture.md has no row for {folder.name}/"
    suffix, found = modules(folder)
    assert found - named(row, suffix) == set()


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_the_map_names_no_module_that_is_gone(folder: Path) -> None:
    suffix, found = modules(folder)
    # The scripts' row names them bare (`admit`); the others name modules with `.py`.
    bare = r"`([a-z_]+)`" if suffix == ".lua" else rf"`(\w+){re.escape(suffix)}`"
    assert set(re.findall(bare, row_of(folder))) - found == set()


def test_the_top_of_the_package_is_on_the_map() -> None:
    row = rows()["hardcap_core/"]
    top = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    assert top - named(row, ".py") == set()
    assert {m for m in re.findall(r"`(\w+)\.py`", row)} - top == set()
