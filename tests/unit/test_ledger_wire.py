"""The Python side of the script contract (hardcap_core/ledger/contract.py) against what the
other side and the previous release hold: the bytes each script is sent, lib.lua's key order,
and each reply layout against its script's header."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from hardcap_core.ledger.contract import ARGS, LEDGER_KEYS, REPLIES, ExtendArgs, encode
from hardcap_core.ledger.keys import Keyspace
from hardcap_core.ledger.scripts import LEDGER_SCRIPTS, SCRIPTS, lua_dir
from tests.conftest import scope
from tests.unit.ledger_wire_cases import captured

# Captured once from commit 44c25af (the previous release's hand-built f-strings) by running
# `python -m tests.unit.ledger_wire_cases` there; a deploy runs that release and this one on
# one cache, so every byte must stay as it was.
PREVIOUS = Path(__file__).with_name("ledger_wire_44c25af.json")


@pytest.fixture(scope="module")
def calls() -> dict[str, list[list[Any]]]:
    return captured()


def expected() -> dict[str, list[list[Any]]]:
    data: dict[str, list[list[Any]]] = json.loads(PREVIOUS.read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize("case", sorted(expected()))
def test_every_script_is_sent_the_bytes_the_previous_release_sent(
    calls: dict[str, list[list[Any]]], case: str
) -> None:
    """Plain, exact count, queue ticket, user level, lease, upstream and route limits, more
    windows and a restore, and the standalone scripts: same scripts, keys and argv, in order
    (argv types included: an int stays an int)."""
    got = json.loads(json.dumps(calls[case]))
    want = expected()[case]
    assert [c[0] for c in got] == [c[0] for c in want]
    for (script, keys, argv), (_, want_keys, want_argv) in zip(got, want, strict=True):
        assert keys == want_keys, script
        assert argv == want_argv, script


def lua_key_order() -> list[str]:
    text = (lua_dir() / "lib.lua").read_text(encoding="utf-8")
    found = [(int(n), name) for name, n in re.findall(r"^local (K_\w+)\s*=\s*(\d+)", text, re.M)]
    assert found, "lib.lua declares no K_* key positions"
    return [name for _, name in sorted(found)]


def test_ledger_key_order_is_lib_luas() -> None:
    """LEDGER_KEYS names lib.lua's K_* in their positions, and Keyspace.ledger() builds the keys
    in that order (each key named for its K_*)."""
    assert list(LEDGER_KEYS) == lua_key_order()
    assert sorted(int(n) for n in re.findall(
        r"^local K_\w+\s*=\s*(\d+)", (lua_dir() / "lib.lua").read_text(), re.M
    )) == list(range(1, len(LEDGER_KEYS) + 1))  # fmt: skip
    built = Keyspace("hc").ledger(scope())
    assert [k.split("}:", 1)[1] for k in built] == [n[2:].lower() for n in LEDGER_KEYS]


def header(script: str) -> str:
    """The script's opening comment, its '--' markers removed."""
    lines = []
    for line in (lua_dir() / f"{script}.lua").read_text(encoding="utf-8").splitlines():
        if not line.startswith("--"):
            if lines:
                break
            continue
        lines.append(line[2:].strip())
    return " ".join(lines)


def documented_replies(script: str) -> dict[str, list[str]]:
    """Each documented reply's brace text by status ('' where a reply has no status)."""
    text = header(script)
    out: dict[str, list[str]] = {}
    for m in re.finditer(r"\{", text):
        depth, at = 0, m.start()
        for i in range(at, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                body = text[at + 1 : i]
                break
        else:
            continue
        head = re.match(r"\s*((?:'\w+'\|?)+)\s*,?", body)
        statuses = re.findall(r"'(\w+)'", head.group(1)) if head else [""]
        rest = body[head.end() :] if head else body
        for status in statuses:
            out.setdefault(status, []).append(rest)
    return out


@pytest.mark.parametrize(
    ("script", "status"),
    [(script, status) for script, layouts in REPLIES.items() for status in layouts],
)
def test_reply_layout_is_the_scripts_documented_one(script: str, status: str) -> None:
    """The fields REPLIES names for a reply appear, in that order, in the reply its script's
    header documents: a field moved or renamed on one side fails here."""
    documented = documented_replies(script).get(status)
    assert documented, f"{script}.lua documents no {status!r} reply"

    def in_order(text: str) -> bool:
        at = 0
        for name in REPLIES[script][status]:
            found = text.find(name, at)
            if found < 0:
                return False
            at = found + len(name)
        return True

    assert any(in_order(t) for t in documented), (REPLIES[script][status], documented)


def test_every_script_has_its_arguments_declared() -> None:
    """One argument structure per script, and every ledger script takes lib.lua's keys first."""
    assert sorted(ARGS) == sorted(SCRIPTS)
    for name in LEDGER_SCRIPTS:
        first = dataclasses.fields(ARGS[name])[0]
        assert (first.name, first.metadata["lua"][0]) == ("ledger", "keys"), name


def test_optional_members_are_left_out_and_set_ones_sent_as_1() -> None:
    """What the scripts read as absent (cv, nr, L, ag) is not sent at all when unset."""
    base = {"ledger": ["k"], "used": ["u"], "reservation_id": "r", "tokens": 5, "least": 1,
            "ttl_ms": 9, "rows": "[]", "windows": "[]", "settle_memory_ms": 7}  # fmt: skip
    assert encode(ExtendArgs(**base)) == (["k", "u"], ["r", 5, 1, 9, '{"b":[],"w":[],"xm":7}'])
    _, argv = encode(ExtendArgs(**base, ask_grant=True))
    assert argv[-1] == '{"b":[],"w":[],"xm":7,"ag":1}'
