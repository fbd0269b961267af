"""The Lua scripts in ``hardcap_core/lua/``, read once and registered on a client.

They ship inside the package, so a checkout, a wheel and the Lambda artifact find them the same
way. This module is the one list of them: every script is found and registered here
(:data:`SCRIPTS`), so a script cannot be left out of the wheel's test or registered twice.

Every script gets ``consts.lua`` prepended (the lifetimes, limits and record versions, named
once), and the ledger scripts ``lib.lua`` after it, so each registered script is self-contained
on the server. redis-py's script objects call EVALSHA and reload the script on NOSCRIPT, so a
``SCRIPT FLUSH`` or a failover to a fresh node costs one extra round trip. A script's SHA
changes with any byte of it: during a deploy the previous release's scripts and these are
registered side by side, and both read what either writes (``consts.lua``: record versions).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from hardcap_core.ledger.pipe import PipedScript, Pipes

LEDGER_SCRIPTS = (
    "admit", "extend", "settle", "usage", "hydrate", "leave", "lease_open", "lease_close"
)  # fmt: skip
STANDALONE_SCRIPTS = ("estimator_record", "estimator_vote", "unlock", "breaker", "config_version")
# A limit that spans tenants (ledger/allowances.py): its slot's grants, and each hierarchy's
# allowance in the hierarchy's own slot. They do not take the ledger's keys, so no lib.lua.
ALLOWANCE_SCRIPTS = ("allowance_grant", "allowance_credit", "allowance_release")
SCRIPTS = LEDGER_SCRIPTS + STANDALONE_SCRIPTS + ALLOWANCE_SCRIPTS  # every script, once
# Prepended, not registered: consts.lua to every script, lib.lua to the ledger scripts.
PRELUDES = ("consts", "lib")


def lua_dir() -> Path:
    """Where the scripts are: ``hardcap_core/lua``, beside this package's modules (a checkout,
    an installed wheel and the Lambda artifact alike)."""
    return Path(__file__).resolve().parent.parent / "lua"


@cache
def source(name: str) -> str:
    """The full text sent to the server for script ``name`` (one of :data:`SCRIPTS`)."""
    if name not in SCRIPTS:
        raise KeyError(f"no script {name!r} in hardcap_core/lua (scripts.py: SCRIPTS)")
    parts = ["consts", "lib", name] if name in LEDGER_SCRIPTS else ["consts", name]
    d = lua_dir()
    return "\n".join((d / f"{part}.lua").read_text(encoding="utf-8") for part in parts)


class Script(Protocol):
    """A registered script (redis-py's ``AsyncScript``): EVALSHA, reloaded on NOSCRIPT."""

    def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> Awaitable[Any]: ...


@dataclass(frozen=True, slots=True)
class Scripts:
    """Registered script objects for one client (standalone or cluster). Each reply's layout
    is in its script's header and parsed in :mod:`hardcap_core.ledger.replies`."""

    admit: Script
    extend: Script
    settle: Script
    usage: Script
    hydrate: Script
    leave: Script
    lease_open: Script
    lease_close: Script
    estimator_record: Script
    estimator_vote: Script
    unlock: Script
    breaker: Script
    config_version: Script
    allowance_grant: Script
    allowance_credit: Script
    allowance_release: Script

    @classmethod
    def register(cls, client: Any) -> Scripts:
        """The scripts on ``client``: over its pipes when it has them (a client made by
        :func:`.connection.connect`, :mod:`.pipe`), else redis-py's script objects."""
        pipes = getattr(client, "pipes", None)
        out: dict[str, Any] = {}
        for name in SCRIPTS:
            slow = client.register_script(source(name))
            out[name] = PipedScript(slow, pipes) if isinstance(pipes, Pipes) else slow
        return cls(**out)
