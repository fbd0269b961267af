"""Key names of the ledger. Everything of one tenant hierarchy shares the root's hash tag
(``{t:acme}``), so every script's keys live in one slot and the scripts run on a cluster."""

from __future__ import annotations

from hardcap_core.budgets import Level, LevelKind, Scope, Window


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

    def ledger(self, scope: Scope) -> list[str]:
        """The keys every ledger script takes first (``lua/lib.lua`` names them K_*): reserved,
        res, exp, rl, then expired (reservation id -> what expiry charged), expired_at (id ->
        when that record is forgotten), live (level tag -> live reservations on it), usage (the
        stream of usage records) and restored (set once the counters are in place)."""
        b = self._base(scope)
        return [
            *self.core(scope),
            f"{b}:expired",
            f"{b}:expired_at",
            f"{b}:live",
            self.usage_stream(scope.root),
            f"{b}:restored",
        ]

    def usage_stream(self, root: Level) -> str:
        """The stream of usage records of the hierarchy under ``root``."""
        return f"{self.prefix}:{{{root.tag}}}:usage"

    def rollup_lease(self, root: Level) -> str:
        """Who is rolling up ``root``'s stream now (a string with a TTL)."""
        return f"{self.prefix}:{{{root.tag}}}:rollup"

    def stream_generation(self, root: Level) -> str:
        """An id of the stream's life: a new one once the cache lost the stream and its group."""
        return f"{self.prefix}:{{{root.tag}}}:usage:gen"

    def queue(self, scope: Scope) -> list[str]:
        """The admission queue of ``scope``'s tenant (without a tenant level, of its first
        level): waiting id -> when it joined, and waiting id -> when its ticket lapses."""
        b = self._base(scope)
        who = next((lv.tag for lv in scope.levels if lv.kind is LevelKind.TENANT), None)
        who = who or scope.levels[0].tag
        return [f"{b}:q:{who}", f"{b}:qx:{who}"]

    def config_version(self, root_tag: str) -> str:
        """The newest config version published for the hierarchy whose root's tag is
        ``root_tag`` (``o:acme``, ``t:beta``): lua/config_version.lua, read by admit."""
        return f"{self.prefix}:{{{root_tag}}}:cfgv"

    def stored_response(self, scope: Scope, tenant: str, response_id: str) -> str:
        """A stored Response of ``tenant`` (ledger/stored_responses.py), in its hierarchy's slot:
        the tenant is in the name, so another tenant's request cannot even name it."""
        return f"{self._base(scope)}:resp:{tenant}:{response_id}"

    def settled(self, scope: Scope, rid: str) -> str:
        return f"{self._base(scope)}:s:{rid}"

    def used(self, scope: Scope, spec: str, window_id: str) -> str:
        return f"{self._base(scope)}:u:{spec}:{window_id}"

    def reserved_of(self, root_tag: str) -> str:
        """The reserved hash of the hierarchy whose root's tag is ``root_tag``."""
        return f"{self.prefix}:{{{root_tag}}}:reserved"

    def used_of(self, root_tag: str, spec: str, window_id: str) -> str:
        """A used key of the hierarchy whose root's tag is ``root_tag`` (as :meth:`used`)."""
        return f"{self.prefix}:{{{root_tag}}}:u:{spec}:{window_id}"

    def granted(self, shared_tag: str, spec: str, window_id: str) -> str:
        """What a limit spanning tenants (``up:<name>``, ``rt:<name>``) granted in a window,
        in its own slot (lua/allowance_grant.lua)."""
        return f"{self.prefix}:{{{shared_tag}}}:g:{spec}:{window_id}"

    def estimator(self, route: str, tenant: str | None = None) -> list[str]:
        """samples, stats of ``route``'s output-length sample: the tenant's own (in the slot of
        the tenant's tag, ``{t:<tenant>}``), or with no tenant the route's pooled one."""
        if tenant is None:
            b = f"{self.prefix}:{{est:{route}}}"
        else:
            b = f"{self.prefix}:{{t:{tenant}}}:est:{route}"
        return [f"{b}:samples", f"{b}:stats"]

    def breaker(self, upstream: str) -> str:
        """The circuit breaker of ``upstream``, in a slot of its own."""
        return f"{self.prefix}:{{brk:{upstream}}}"

    def estimator_votes(self, route: str) -> list[str]:
        """votes (tenant -> its quantile), consensus ({q, t}) of ``route``, in the route's slot."""
        b = f"{self.prefix}:{{est:{route}}}"
        return [f"{b}:votes", f"{b}:consensus"]


def window_of_spec(spec: str) -> Window:
    """The window a key-name spec (``d``, ``m``, ``f<seconds>``: :attr:`Window.spec`) stands for."""
    if spec == "d":
        return Window("day")
    if spec == "m":
        return Window("month")
    if spec.startswith("f") and spec[1:].isdigit():
        return Window("fixed", int(spec[1:]))
    raise ValueError(f"not a window spec: {spec!r}")


def tenant_of(scope: Scope) -> str | None:
    """The id of ``scope``'s tenant level, if it has one."""
    return next((lv.id for lv in scope.levels if lv.kind is LevelKind.TENANT), None)


def org_of(scope: Scope) -> str | None:
    """The id of ``scope``'s org level, if it has one."""
    return next((lv.id for lv in scope.levels if lv.kind is LevelKind.ORG), None)
