"""``hardcap admin``: tenants, orgs, keys, budgets, rate limits, temporary budgets, usage and the
audit log, through the admin API (hardcap_core/control/admin_api.py).

Every change goes through the API, which validates the whole live config before writing and
records who made it; this module only turns a command line into a call and the reply into a
table (``--json``: the reply as it is, for scripts). Exit status: 0 done, 1 the API refused or
could not be reached (its message on stderr), 2 a mistake in the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from hardcap_core.local import admin_render as render

if TYPE_CHECKING:
    from hardcap_core.local.admin_client import AdminClient

# Where the admin API is, and the token of a local one (`hardcap serve --admin-token`).
ADMIN_URL = "HARDCAP_ADMIN_URL"
ADMIN_TOKEN = "HARDCAP_ADMIN_TOKEN"

Call = tuple[str, str, dict[str, Any] | None, dict[str, Any] | None]  # method, path, body, query
Render = render.Render


def add_connection_arguments(parser: argparse.ArgumentParser, *, verb: bool = False) -> None:
    """Where the admin API is and how to authenticate: shared by ``admin`` and ``config``.

    Taken before the verb (``hardcap admin --url U keys create``, as the README writes it) and
    after it (``hardcap admin keys create --url U``): a ``verb``'s copy sets nothing it was not
    given, so it never overwrites what came before the verb."""
    unset: dict[str, Any] = {"default": argparse.SUPPRESS} if verb else {}
    parser.add_argument("--url", help=f"the admin API (default ${ADMIN_URL})", **unset)
    parser.add_argument(
        "--token",
        help=f"a local gateway's admin token (default ${ADMIN_TOKEN}; else SigV4)",
        **unset,
    )
    parser.add_argument("--operator", help="who the local audit names (default: $USER)", **unset)
    parser.add_argument("--json", action="store_true", help="print the API's JSON reply", **unset)


def add_admin_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommands of ``hardcap admin``."""
    add_connection_arguments(parser)
    common = argparse.ArgumentParser(add_help=False)
    add_connection_arguments(common, verb=True)
    groups = parser.add_subparsers(dest="admin_group", required=True)

    def verb(group: Any, name: str, help_text: str) -> argparse.ArgumentParser:
        made: argparse.ArgumentParser = group.add_parser(name, help=help_text, parents=[common])
        return made

    tenants = groups.add_parser("tenants", help="tenants").add_subparsers(
        dest="verb", required=True
    )
    verb(tenants, "list", "every tenant")
    verb(tenants, "show", "a tenant, its keys and its budgets now").add_argument("id")
    for name, help_text in (("create", "a new tenant"), ("update", "change a tenant's fields")):
        p = verb(tenants, name, help_text)
        p.add_argument("id")
        _level_options(p, tenant=True, update=name == "update")
    for name in ("disable", "enable"):
        verb(tenants, name, f"{name} a tenant (its keys are refused while disabled)").add_argument(
            "id"
        )

    orgs = groups.add_parser("orgs", help="orgs").add_subparsers(dest="verb", required=True)
    verb(orgs, "list", "every org")
    for name, help_text in (("create", "a new org"), ("update", "change an org's fields")):
        p = verb(orgs, name, help_text)
        p.add_argument("id")
        _level_options(p, tenant=False, update=name == "update")
    for name in ("disable", "enable"):
        verb(orgs, name, f"{name} an org and every tenant under it").add_argument("id")

    keys = groups.add_parser("keys", help="API keys").add_subparsers(dest="verb", required=True)
    verb(keys, "list", "keys, with when each was last used").add_argument("--tenant")
    p = verb(keys, "create", "a new key: its plaintext is shown once")
    p.add_argument("--tenant", required=True)
    p.add_argument("--id", help="its id (default: <tenant>-<random>)")
    p.add_argument("--priority", type=int, help="queue priority 0-9")
    _rule_options(p)
    p = verb(keys, "rotate", "a new key; the old one works for the overlap, then stops")
    p.add_argument("id")
    p.add_argument("--overlap", default="24h", help="how long the old key still works (24h)")
    p.add_argument("--new-id", help="the new key's id")
    verb(keys, "revoke", "refuse a key from the next request on").add_argument("id")

    budgets = groups.add_parser("budgets", help="budgets").add_subparsers(
        dest="verb", required=True
    )
    p = verb(budgets, "set", "a budget at a level; with --until/--for a temporary one")
    _target(p)
    p.add_argument("--dimension", required=True, help="input_tokens, output_tokens, ...")
    p.add_argument("--window", required=True, help="minute, hour, day, month, 7d, ...")
    p.add_argument("--limit", required=True, help="tokens, or USD for cost_usd")
    until = p.add_mutually_exclusive_group()
    until.add_argument("--until", help="temporary until this time (ISO 8601, UTC)")
    until.add_argument("--for", dest="for_", metavar="DURATION", help="temporary: 36h, 7d")
    p.add_argument("--reason", help="why (goes into the audit with a temporary budget)")
    p = verb(budgets, "remove", "remove a level's budget of a dimension and window")
    _target(p)
    p.add_argument("--dimension", required=True)
    p.add_argument("--window", required=True)

    rates = groups.add_parser("rate-limits", help="rate limits").add_subparsers(
        dest="verb", required=True
    )
    p = verb(rates, "set", "requests and tokens per minute at a level ('none' removes)")
    _target(p)
    p.add_argument("--rpm", help="requests per minute, or none")
    p.add_argument("--tpm", help="tokens per minute, or none")

    overrides = groups.add_parser("overrides", help="temporary budgets").add_subparsers(
        dest="verb", required=True
    )
    verb(overrides, "list", "temporary budgets in force").add_argument(
        "--all", action="store_true", help="ended ones too"
    )
    verb(overrides, "cancel", "end a temporary budget now").add_argument("id")

    p = verb(groups, "usage", "spend per tenant, key and model (as hardcap usage)")
    p.add_argument("--tenant", action="append")
    p.add_argument("--since", default="24h")
    p.add_argument("--until", default="now")
    p = verb(groups, "audit", "who changed what, newest first")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--since", help="only changes after this time (ISO 8601, UTC)")


def admin_command(ns: argparse.Namespace, client: AdminClient | None = None) -> int:
    """Run one ``hardcap admin`` command; ``client`` for tests (else from the options)."""
    try:
        call, render = _call(ns)
    except ValueError as e:
        print(f"hardcap admin: error: {e}", file=sys.stderr)
        return 2
    return run_call(ns, call, render, client, "hardcap admin")


def run_call(
    ns: argparse.Namespace, call: Call, render: Render, client: AdminClient | None, prog: str
) -> int:
    """Send ``call`` and print its reply (rendered, or as JSON with ``--json``)."""
    # Imported here: `hardcap --help` runs without the local extra (httpx).
    from hardcap_core.local.admin_client import AdminError

    own = client is None
    try:
        if client is None:
            client = client_from_args(ns.url, ns.token, ns.operator)
        reply = client.call(*call)
    except AdminError as e:
        print(f"{prog}: error {e}", file=sys.stderr)
        return 1
    finally:
        if own and client is not None:
            client.close()
    print(json.dumps(reply, indent=2) if ns.json else render(reply))
    return 0


def client_from_args(url: str | None, token: str | None, operator: str | None) -> AdminClient:
    """The client the command line asks for: ``--url`` / ``HARDCAP_ADMIN_URL``, ``--token`` /
    ``HARDCAP_ADMIN_TOKEN`` (SigV4 without one)."""
    from hardcap_core.local.admin_client import AdminClient, AdminError

    where = url or os.environ.get(ADMIN_URL)
    if not where:
        raise AdminError(0, f"no admin API: pass --url or set {ADMIN_URL}")
    return AdminClient(where, token=token or os.environ.get(ADMIN_TOKEN), operator=operator)


# -- command lines into calls -------------------------------------------------------------------


def _call(ns: argparse.Namespace) -> tuple[Call, Render]:
    group, verb = ns.admin_group, str(getattr(ns, "verb", ""))
    if group in ("tenants", "orgs"):
        return _level_call(ns, group, verb)
    if group == "keys":
        if verb == "list":
            query = {"tenant": ns.tenant} if ns.tenant else None
            return ("GET", "/keys", None, query), render.keys
        if verb == "create":
            body: dict[str, Any] = {"tenant": ns.tenant, **_rules(ns)}
            if ns.id:
                body["id"] = ns.id
            if ns.priority is not None:
                body["queue_priority"] = ns.priority
            return ("POST", "/keys", body, None), render.new_key
        if verb == "rotate":
            body = {"overlap": ns.overlap, **({"id": ns.new_id} if ns.new_id else {})}
            return ("POST", f"/keys/{ns.id}/rotate", body, None), render.new_key
        return ("POST", f"/keys/{ns.id}/revoke", None, None), render.revoked
    if group == "budgets":
        body = {"level": ns.level, "id": ns.id, "dimension": ns.dimension, "window": ns.window}
        if verb == "remove":
            return ("POST", "/budgets/remove", body, None), render.rules_set
        body["limit"] = _number(ns.limit, "--limit")
        if ns.until:
            body["until"] = ns.until
        if ns.for_:
            body["for"] = ns.for_
        if ns.reason:
            body["reason"] = ns.reason
        return ("PUT", "/budgets", body, None), render.budget_set
    if group == "rate-limits":
        body = {"level": ns.level, "id": ns.id}
        for flag, name, text in (("--rpm", "requests_per_minute", ns.rpm),
                                 ("--tpm", "tokens_per_minute", ns.tpm)):  # fmt: skip
            if text is not None:
                body[name] = None if text.lower() == "none" else _whole(text, flag)
        return ("PUT", "/rate-limits", body, None), render.rules_set
    if group == "overrides":
        if verb == "list":
            return ("GET", "/overrides", None, {"all": "1"} if ns.all else None), render.overrides
        return ("DELETE", f"/overrides/{ns.id}", None, None), render.cancelled
    if group == "usage":
        query = {"since": ns.since, "until": ns.until, "tenant": ns.tenant or []}
        return ("GET", "/usage", None, query), render.usage
    query = {"limit": ns.limit}
    if ns.since:
        query["since"] = _epoch(ns.since)
    return ("GET", "/audit", None, query), render.audit


def _level_call(ns: argparse.Namespace, group: str, verb: str) -> tuple[Call, Render]:
    kind = group[:-1]
    if verb == "list":
        return (
            "GET",
            f"/{group}",
            None,
            None,
        ), render.tenants if group == "tenants" else render.orgs
    if verb == "show":
        return ("GET", f"/{group}/{ns.id}", None, None), render.tenant
    if verb in ("disable", "enable"):
        return ("POST", f"/{group}/{ns.id}/{verb}", None, None), render.saved(kind)
    fields = _fields(ns, tenant=group == "tenants")
    if verb == "create":
        return ("POST", f"/{group}", {"id": ns.id, **fields}, None), render.saved(kind)
    for name in ns.unset or []:
        fields[name] = None
    return ("PATCH", f"/{group}/{ns.id}", fields, None), render.saved(kind)


def _level_options(p: argparse.ArgumentParser, *, tenant: bool, update: bool) -> None:
    if tenant:
        p.add_argument("--org")
        p.add_argument("--routes", help="the routes it may use, comma-separated ('all': any)")
        p.add_argument("--fail-mode", choices=("closed", "open"))
        p.add_argument("--queue-wait", type=float, metavar="SECONDS")
    _rule_options(p)
    p.add_argument(
        "--set", action="append", metavar="FIELD=JSON", help="any other field, e.g. "
        'users={"budgets":[...]} or end_users="optional"'
    )  # fmt: skip
    if update:
        p.add_argument("--unset", action="append", metavar="FIELD", help="back to its default")


def _rule_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--budget", action="append", metavar="DIMENSION:LIMIT:WINDOW",
        help="e.g. cost_usd:100:month (repeat; replaces the level's budgets)",
    )  # fmt: skip
    p.add_argument("--rpm", type=int, help="requests per minute")
    p.add_argument("--tpm", type=int, help="tokens per minute")


def _target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--level", required=True, choices=("org", "tenant", "key", "users"),
                   help="users: the tenant's per-user template (--id is the tenant)")  # fmt: skip
    p.add_argument("--id", required=True, help="the org, tenant or key id")


def _fields(ns: argparse.Namespace, *, tenant: bool) -> dict[str, Any]:
    fields = _rules(ns)
    if tenant:
        if ns.org is not None:
            fields["org"] = ns.org
        if ns.routes is not None:
            routes = [r.strip() for r in ns.routes.split(",") if r.strip()]
            fields["routes"] = None if routes == ["all"] else routes
        if ns.fail_mode is not None:
            fields["fail_mode"] = ns.fail_mode
        if ns.queue_wait is not None:
            fields["queue_wait_seconds"] = ns.queue_wait
    for item in ns.set or []:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--set {item!r}: FIELD=JSON")
        try:
            fields[name] = json.loads(text)
        except ValueError:
            fields[name] = text  # a bare word: a string
    return fields


def _rules(ns: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if ns.budget:
        out["budgets"] = [_budget(text) for text in ns.budget]
    rates = {k: v for k, v in (("requests_per_minute", ns.rpm), ("tokens_per_minute", ns.tpm))
             if v is not None}  # fmt: skip
    if rates:
        out["rate_limits"] = rates
    return out


def _budget(text: str) -> dict[str, Any]:
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"--budget {text!r}: DIMENSION:LIMIT:WINDOW, like cost_usd:100:month")
    return {"dimension": parts[0], "limit": _number(parts[1], "--budget"), "window": parts[2]}


def _number(text: str, flag: str) -> int | float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag} {text!r} is not a number") from None
    return int(value) if value.is_integer() else value


def _whole(text: str, flag: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{flag} {text!r} is not a whole number (or none)") from None


def _epoch(text: str) -> float:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--since {text!r} is not an ISO 8601 time") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
