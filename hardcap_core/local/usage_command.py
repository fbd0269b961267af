"""``hardcap usage``: spend per tenant, key (and user) and model over a window, or per tenant
and user (``--by user``), read from the usage table in DynamoDB (what the rollup wrote), as a
table, ``--json``, or FOCUS 1.2 CSV rows (``--format focus``: hardcap_core/rollup/focus.py).

The table is ``--table`` or ``HARDCAP_USAGE_TABLE``; where it lives comes from the usual AWS
environment, so the same command reads the table of a deployed stack (with the profile and
region of that account) or the embedded one of ``hardcap serve`` (``AWS_ENDPOINT_URL_DYNAMODB``,
which ``hardcap serve`` prints). Spend that is still in the cache, not rolled up yet, is not in
it; ``GET /v1/hardcap/usage`` answers from the cache.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING

from hardcap_core import env

if TYPE_CHECKING:
    from hardcap_core.rollup.table import UsageRow

DEFAULT_SINCE = "24h"
FORMATS = ("table", "json", "focus")
# As hardcap_core.rollup.report.BY, which the command imports only when it runs.
BY_CHOICES = ("key", "user", "lease")


def add_usage_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``hardcap usage``."""
    parser.add_argument("-c", "--config", help="YAML config: --tenant must name one of its tenants")
    parser.add_argument(
        "--tenant",
        action="append",
        metavar="TENANT",
        help="only this tenant (repeat for more; default: every tenant with usage)",
    )
    parser.add_argument(
        "--since",
        default=DEFAULT_SINCE,
        metavar="WHEN",
        help=f"window start: 1h, 24h, 7d (ago) or an ISO 8601 time, UTC (default {DEFAULT_SINCE})",
    )
    parser.add_argument(
        "--until", default="now", metavar="WHEN", help="window end, as --since (default now)"
    )
    parser.add_argument(
        "--by",
        choices=BY_CHOICES,
        default="key",
        help="a line per tenant, key, user and model (key, the default; the user column shows "
        "when a request had one), per tenant and user, dearest first (user), or per tenant and "
        "lease, dearest first (lease: what each lease's requests spent)",
    )
    parser.add_argument("--table", help="the DynamoDB table (default: $HARDCAP_USAGE_TABLE)")
    parser.add_argument("--json", action="store_true", help="a JSON list of rows instead")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table (the default), json (as --json), or focus: FOCUS 1.2 rows as CSV, one per "
        "UTC day, tenant, key, user, route, model and upstream (--by does not apply)",
    )


def usage_command(ns: argparse.Namespace) -> int:
    """Print the usage of the window; 2 for a usage error, 1 when the table cannot be read."""
    from hardcap_core.rollup import report

    now_ms = int(time.time() * 1000)
    try:
        start_ms = _when("--since", ns.since, now_ms)
        end_ms = _when("--until", ns.until, now_ms)
        if start_ms >= end_ms:
            raise _UsageError(f"--since {ns.since} is not before --until {ns.until}")
        name = ns.table or os.environ.get(env.USAGE_TABLE)
        if not name:
            raise _UsageError(f"no usage table: pass --table or set {env.USAGE_TABLE}")
        tenants = _tenants(ns.tenant, ns.config)
    except _UsageError as exc:
        print(f"hardcap usage: error: {exc}", file=sys.stderr)
        return 2
    if ns.format == "focus":
        return _focus(name, tenants, start_ms, end_ms)
    rows = _read(name, tenants, start_ms, end_ms)
    if rows is None:
        return 1
    if ns.json or ns.format == "json":
        print(json.dumps(report.to_json(rows, ns.by), indent=2))
    else:
        print(report.format_table(rows, start_ms, end_ms, ns.by))
    return 0


def _focus(name: str, tenants: list[str] | None, start_ms: int, end_ms: int) -> int:
    """FOCUS rows of the window, read a UTC day at a time (a charge period per day)."""
    from hardcap_core.rollup import focus

    periods = []
    for lo, hi in focus.days(start_ms, end_ms):
        rows = _read(name, tenants, lo, hi)
        if rows is None:
            return 1
        periods.append((lo, hi, rows))
    focus.write_csv(sys.stdout, focus.rows(periods))
    return 0


class _UsageError(Exception):
    """A mistake in the command line: exit status 2, as argparse's own."""


def _when(flag: str, text: str, now_ms: int) -> int:
    from hardcap_core.rollup.report import parse_time

    try:
        return parse_time(text, now_ms)
    except ValueError as exc:
        raise _UsageError(f"{flag}: {exc}") from None


def _tenants(names: list[str] | None, config_path: str | None) -> list[str] | None:
    """The tenants asked for, checked against the config when there is one."""
    if names and config_path:
        from hardcap_core.config import load_config

        known = set(load_config(config_path).tenant_scopes)
        unknown = sorted(set(names) - known)
        if unknown:
            raise _UsageError(
                f"--tenant {', '.join(unknown)}: not in {config_path} "
                f"(its tenants: {', '.join(sorted(known))})"
            )
    return names or None


def _read(
    name: str, tenants: list[str] | None, start_ms: int, end_ms: int
) -> list[UsageRow] | None:
    from botocore.exceptions import BotoCoreError

    from hardcap_core.errors import DurableStoreUnavailable
    from hardcap_core.local.aws import dynamodb_client
    from hardcap_core.rollup.table import UsageTable

    try:
        # BotoCoreError: no region, say, when the client is built; the table translates the
        # errors of its calls.
        return UsageTable(dynamodb_client(), name).usage(tenants, start_ms, end_ms)
    except (BotoCoreError, DurableStoreUnavailable) as exc:
        print(f"hardcap usage: cannot read table {name}: {exc}", file=sys.stderr)
        return None
