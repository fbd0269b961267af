"""The Lua side of the script contract held in one place: every file in ``hardcap_core/lua`` is
in scripts.py's one list (registered) or a prelude (prepended), and lifetimes and limits are
numbers only in consts.lua, which every registered script carries."""

from __future__ import annotations

import re

import pytest

from hardcap_core.ledger.scripts import LEDGER_SCRIPTS, PRELUDES, SCRIPTS, lua_dir, source

# A number of five digits or more: a lifetime in ms (a minute and up), a cap. (1000 is ms per
# second, which converts TIME's reply and tpm seconds everywhere.)
LITERAL = re.compile(r"(?<![\w.])\d{5,}(?![\w.])")


def code_of(text: str) -> str:
    """A Lua text without its comments."""
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def test_every_script_file_is_registered_or_prepended_once() -> None:
    files = sorted(p.stem for p in lua_dir().glob("*.lua"))
    assert sorted((*SCRIPTS, *PRELUDES)) == files
    assert len(set(SCRIPTS)) == len(SCRIPTS)


@pytest.mark.parametrize("name", [*SCRIPTS, "lib"])
def test_lifetimes_and_limits_are_named_only_in_consts_lua(name: str) -> None:
    """Regression: TTL literals (86400000, 3600000, 120000, 60000, ...) were spread over five
    scripts, so changing one lifetime meant finding each copy."""
    code = code_of((lua_dir() / f"{name}.lua").read_text(encoding="utf-8"))
    assert LITERAL.findall(code) == []


def test_every_script_carries_the_constants_and_the_ledger_ones_lib() -> None:
    consts = (lua_dir() / "consts.lua").read_text(encoding="utf-8")
    lib = (lua_dir() / "lib.lua").read_text(encoding="utf-8")
    for name in SCRIPTS:
        text = source(name)
        assert text.startswith(consts)
        assert (lib in text) == (name in LEDGER_SCRIPTS)
    with pytest.raises(KeyError):
        source("lib")  # a prelude is never registered alone
