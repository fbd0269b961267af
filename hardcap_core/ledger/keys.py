"""Key names of the ledger. Everything of one tenant hierarchy shares the root's hash tag
(``{t:acme}``), so every script's keys live in one slot and the scripts run on a cluster."""

from __future__ import annotations

from hardcap_core.budgets import Scope


class Keyspace:
    """Key names. Everything of one hierarchy shares the root's hash tag."""

    def __init__(self, prefix: str = "hc") -> None:
        self.prefix = prefix

    def _base(self, scope: Scope) -> str:
        return f"{self.prefix}:{{{scope.root.tag}}}"

    def core(self, scope: Scope) -> list[str]:
        """reserved, res, exp, rl."""
        b = self._base(scope)
        return [f"{b}:reserved", f"{b}:res", f"{b}:exp", f"{b}:rl"]

    def settled(self, scope: Scope, rid: str) -> str:
        return f"{self._base(scope)}:s:{rid}"

    def used(self, scope: Scope, spec: str, window_id: str) -> str:
        return f"{self._base(scope)}:u:{spec}:{window_id}"

    def estimator(self, route: str) -> list[str]:
        b = f"{self.prefix}:{{est:{route}}}"
        return [f"{b}:samples", f"{b}:stats"]
