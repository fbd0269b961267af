"""``hardcap config plan|apply|export``: the YAML file as the GitOps source of the live orgs and
tenants.

``plan -c config.yaml`` shows what ``apply`` would change in the live state (a terraform-plan
like text), ``apply`` makes the live orgs, tenants and keys what the file says (again: no
changes), ``export`` writes the live state back as YAML. Only the file's ``orgs`` and
``tenants`` are sent: routes, upstreams, prices and the gateway's settings are the deployed
file's, and the admin API diffs and validates against those (one path for every write).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hardcap_core.errors import ConfigError
from hardcap_core.local.admin_command import Call, Render, add_connection_arguments, run_call

if TYPE_CHECKING:
    from hardcap_core.local.admin_client import AdminClient


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommands of ``hardcap config``."""
    add_connection_arguments(parser)
    common = argparse.ArgumentParser(add_help=False)
    add_connection_arguments(common, verb=True)
    verbs = parser.add_subparsers(dest="config_verb", required=True)
    for name, help_text in (
        ("plan", "what apply would change in the live orgs, tenants and keys"),
        ("apply", "make the live orgs, tenants and keys what the file says"),
    ):
        p = verbs.add_parser(name, help=help_text, parents=[common])
        p.add_argument("-c", "--config", required=True, help="YAML config file")
    p = verbs.add_parser("export", help="the live orgs and tenants as YAML", parents=[common])
    p.add_argument("-o", "--output", help="write to this file (default: stdout)")


def config_command(ns: argparse.Namespace, client: AdminClient | None = None) -> int:
    """Run one ``hardcap config`` command; ``client`` for tests (else from the options)."""
    prog = f"hardcap config {ns.config_verb}"
    if ns.config_verb == "export":
        return run_call(ns, ("GET", "/config/export", None, None), _exported(ns.output), client,
                        prog)  # fmt: skip
    try:
        body = _live_sections(ns.config)
    except ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    call: Call = ("POST", f"/config/{ns.config_verb}", body, None)
    return run_call(ns, call, _planned if ns.config_verb == "plan" else _applied, client, prog)


def _live_sections(path: str) -> dict[str, Any]:
    from hardcap_core.config.loader import read_data

    data = read_data(path)
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config {path}: the top level must be a mapping")
    return {"orgs": data.get("orgs") or [], "tenants": data.get("tenants") or []}


def _planned(reply: dict[str, Any]) -> str:
    text: str = reply["text"]
    count = len(reply["changes"])
    if count:
        text += f"\n\n{count} change{'s' if count != 1 else ''}; `hardcap config apply` makes them."
    return text


def _applied(reply: dict[str, Any]) -> str:
    text: str = reply["text"]
    if reply["changes"]:
        text += f"\n\nApplied: the live config is at version {reply['version']}."
    return text


def _exported(output: str | None) -> Render:
    def render(reply: dict[str, Any]) -> str:
        if output is None:
            return str(reply["yaml"]).rstrip("\n")
        Path(output).write_text(reply["yaml"])
        return f"wrote {output} (config version {reply['version']})"

    return render
