"""The Lua scripts in ``hardcap_core/lua/``, read once and registered on a client.

They ship inside the package, so a checkout, a wheel and the Lambda artifact find them the same
way. The ledger scripts get ``lib.lua`` prepended so each registered script
is self-contained on the server. redis-py's script objects call EVALSHA and reload the script
on NOSCRIPT, so a ``SCRIPT FLUSH`` or a failover to a fresh node costs one extra round trip.
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


def lua_dir() -> Path:
    """Where the scripts are: ``hardcap_core/lua``, beside this package's modules (a checkout,
    an installed wheel and the Lambda artifact alike)."""
    return Path(__file__).resolve().parent.parent / "lua"


@cache
def source(name: str) -> str:
    """The full text sent to the server for script ``name``."""
    d = lua_dir()
    body = (d / f"{name}.lua").read_text(encoding="utf-8")
    if name in LEDGER_SCRIPTS:
        return (d / "lib.lua").read_text(encoding="utf-8") + "\n" + body
    return body


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

    @classmethod
    def register(cls, client: Any) -> Scripts:
        """The scripts on ``client``: over its pipes when it has them (a client made by
        :func:`.connection.connect`, :mod:`.pipe`), else redis-py's script objects."""
        pipes = getattr(client, "pipes", None)
        out: dict[str, Any] = {}
        for name in LEDGER_SCRIPTS + STANDALONE_SCRIPTS:
            slow = client.register_script(source(name))
            out[name] = PipedScript(slow, pipes) if isinstance(pipes, Pipes) else slow
        return cls(**out)
