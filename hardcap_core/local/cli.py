"""The ``hardcap`` command: serve, mock, demo, usage, admin, config, keys new.

``hardcap serve -c config.yaml`` runs the gateway under uvicorn (the local stand-in for the
Lambda function URL); with no Redis URL configured it starts an embedded, real Valkey, and with
no usage table configured an embedded DynamoDB (moto), and it runs the rollup on a timer (the
local stand-in for the scheduled rollup function).
``hardcap demo`` brings up Valkey, DynamoDB, the mock upstream and the gateway together and
shows a streamed completion, the tenant's usage, and its spend rolled up into DynamoDB.
``hardcap usage`` prints spend per tenant, key and model from the usage table.
``hardcap admin`` changes tenants, keys and budgets through the admin API (the admin function's
URL, signed with SigV4, or ``hardcap serve --admin-token``'s ``/admin/v1``); ``hardcap config
plan|apply|export`` keeps the file's orgs and tenants and the live ones in step.

``serve``, ``mock`` and ``demo`` stop on SIGTERM as on Ctrl-C: the servers shut down, an embedded
Valkey is stopped, and the process exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hardcap_core import env
from hardcap_core.config.settings import ROLLUP_INTERVAL_SECONDS, check_otlp_endpoint
from hardcap_core.local.admin_command import ADMIN_TOKEN
from hardcap_core.local.notify_local import NOTIFY_URL_ENV
from hardcap_core.local.servers import UVICORN_OPTIONS, Terminated, stop_on_sigterm
from hardcap_core.local.usage_command import add_usage_arguments, usage_command

if TYPE_CHECKING:
    from hardcap_core.config.model import Config
    from hardcap_core.local.aws import LocalAws
    from hardcap_core.local.rollup_timer import RollupTimer
    from hardcap_core.local.valkey import LocalValkey

# Shipped inside the package, so `hardcap demo` works from an installed wheel.
DEFAULT_CONFIG = Path(__file__).resolve().parent / "demo.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hardcap`` command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="hardcap", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway (uvicorn)")
    serve.add_argument("-c", "--config", required=True, help="YAML config file")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument(
        "--no-rollup",
        dest="rollup",
        action="store_false",
        help="no rollup timer and no embedded DynamoDB: usage stays in the cache",
    )
    serve.add_argument(
        "--notify-url",
        type=_http_url,
        default=os.environ.get(NOTIFY_URL_ENV) or None,
        help=f"POST each budget threshold notification here too (or ${NOTIFY_URL_ENV}); "
        "every one is printed on stdout",
    )
    serve.add_argument(
        "--rollup-interval",
        type=_positive_seconds,
        default=ROLLUP_INTERVAL_SECONDS,
        metavar="SECONDS",
        help="seconds from the start of one rollup pass to the next (default "
        f"{ROLLUP_INTERVAL_SECONDS:g})",
    )
    serve.add_argument(
        "--otlp",
        type=_otlp_url,
        metavar="URL",
        help=f"export a trace of every chat request over OTLP/HTTP to this collector (its base "
        f"URL, e.g. http://127.0.0.1:4318, or its /v1/traces URL; or ${env.OTLP_ENDPOINT})",
    )
    serve.add_argument(
        "--admin-token",
        default=os.environ.get(ADMIN_TOKEN),
        type=_admin_token,
        help=f"serve the admin API at /admin/v1 with this bearer token (or ${ADMIN_TOKEN})",
    )

    from hardcap_core.local.mock_upstream import add_mock_arguments

    mock = sub.add_parser("mock", help="run the mock upstream (ground truth at /mock/ground-truth)")
    add_mock_arguments(mock)

    demo = sub.add_parser("demo", help="Valkey + mock + gateway, a streamed completion and usage")
    demo.add_argument("-c", "--config", default=str(DEFAULT_CONFIG))
    demo.add_argument("--port", type=int, default=8080)
    demo.add_argument(
        "--mock-port", type=int, help="the mock upstream's port (default: the config's, 9001)"
    )
    demo.add_argument("--once", action="store_true", help="exit after showing the demo")

    usage = sub.add_parser("usage", help="spend per tenant, key and model, from DynamoDB")
    add_usage_arguments(usage)

    from hardcap_core.local.admin_command import add_admin_arguments
    from hardcap_core.local.config_command import add_config_arguments

    admin = sub.add_parser("admin", help="tenants, keys, budgets, usage, audit (the admin API)")
    add_admin_arguments(admin)
    config = sub.add_parser("config", help="plan / apply / export the live orgs and tenants")
    add_config_arguments(config)

    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    new = keys_sub.add_parser("new", help="make a key; prints it once and the line to paste")
    new.add_argument("--tenant")
    new.add_argument("--id", dest="key_id")

    ns = parser.parse_args(argv)
    if ns.command in ("serve", "mock", "demo"):
        stop_on_sigterm()
    try:
        return _run(ns)
    except Terminated:
        # SIGTERM outside uvicorn's run (say, while Valkey started): the finally blocks on the
        # way here stopped whatever had been started.
        return 0


def _run(ns: argparse.Namespace) -> int:
    if ns.command == "serve":
        return serve_command(
            ns.config, ns.host, ns.port, rollup=ns.rollup, rollup_interval_s=ns.rollup_interval,
            admin_token=ns.admin_token, notify_url=ns.notify_url, otlp=ns.otlp,
        )  # fmt: skip
    if ns.command == "admin":
        from hardcap_core.local.admin_command import admin_command

        return admin_command(ns)
    if ns.command == "config":
        from hardcap_core.local.config_command import config_command

        return config_command(ns)
    if ns.command == "usage":
        return usage_command(ns)
    if ns.command == "mock":
        from hardcap_core.local.mock_upstream import run_mock, settings_from_args

        run_mock(ns.host, ns.port, settings_from_args(ns))
        return 0
    if ns.command == "demo":
        from hardcap_core.local.demo import run_demo

        return run_demo(ns.config, ns.port, once=ns.once, mock_port=ns.mock_port)
    from hardcap_core.auth import keys_new_command

    print(keys_new_command(ns.tenant, ns.key_id))
    return 0


def embedded_valkey_if_needed(config_path: str) -> LocalValkey | None:
    """Start a private Valkey when neither the environment nor the config names a server."""
    from hardcap_core.config import load_config

    if os.environ.get(env.REDIS_URL) or load_config(config_path).gateway.redis_url:
        return None
    from hardcap_core.local.valkey import LocalValkey

    server = LocalValkey().start()
    # As its user on a deployed cache: no FLUSHALL, FLUSHDB, KEYS, CONFIG or DEBUG.
    os.environ[env.REDIS_URL] = server.gateway_url
    # Flushed: under a process manager stdout is a pipe or a file, and this line says which
    # server to look at while the gateway runs.
    print(
        f"hardcap: no redis_url configured; started an embedded Valkey at {server.url}", flush=True
    )
    return server


def embedded_aws_if_needed() -> LocalAws | None:
    """Start a private DynamoDB (moto) when the environment names no usage table and no
    DynamoDB endpoint; with one set, the user's own store is used (or none)."""
    from hardcap_core.local.aws import ENDPOINT_VAR, LocalAws

    if any(os.environ.get(name) for name in (env.USAGE_TABLE, ENDPOINT_VAR, "AWS_ENDPOINT_URL")):
        return None
    aws = LocalAws().start()
    print(
        f"hardcap: no usage table configured; started an embedded DynamoDB (moto) at {aws.url}"
        f"\nhardcap: see spend with: {aws.usage_command()}",
        flush=True,
    )
    return aws


def rollup_timer_if_possible(
    config: Config, interval_s: float, config_path: str | None = None,
    notify_url: str | None = None,
) -> RollupTimer | None:  # fmt: skip
    """The rollup on a timer against the usage table the environment names, if it names one
    (with the live config joined to the file at ``config_path``, if a config table is named:
    the tenants the admin API made are rolled up too); it prints each budget threshold
    notification, and POSTs it to ``notify_url`` if given."""
    from hardcap_core.local.aws import dynamodb_client
    from hardcap_core.local.notify_local import LocalNotifier
    from hardcap_core.local.rollup_timer import RollupTimer
    from hardcap_core.rollup.table import UsageTable

    name = os.environ.get(env.USAGE_TABLE)
    if not name:
        print(f"hardcap: no {env.USAGE_TABLE}: no rollup; usage stays in the cache", flush=True)
        return None
    from hardcap_core.control.live import live_from_env

    live = None if config_path is None else live_from_env(config_path)  # its own: another loop
    table = UsageTable(dynamodb_client(), name)
    notifier = LocalNotifier(notify_url)
    timer = RollupTimer(config, table, interval_s=interval_s, live=live, notifier=notifier)
    print(f"hardcap: rolling usage up into table {name} every {interval_s:g} s", flush=True)
    return timer.start()


def serve_command(
    config_path: str,
    host: str,
    port: int,
    *,
    rollup: bool = True,
    rollup_interval_s: float = ROLLUP_INTERVAL_SECONDS,
    admin_token: str | None = None,
    notify_url: str | None = None,
    otlp: str | None = None,
) -> int:
    """``hardcap serve``: the gateway under uvicorn until Ctrl-C or SIGTERM, with the rollup
    on a timer unless ``rollup`` is false (printing threshold notifications, and posting them
    to ``notify_url``), the admin API when ``admin_token`` is given, and its traces exported
    to ``otlp`` when given."""
    import uvicorn

    from hardcap_core.config import load_config
    from hardcap_core.control.live import live_from_env
    from hardcap_core.gateway.app import create_app

    server = aws = timer = None
    if otlp:  # the argument over the environment and the file, as every setting
        os.environ[env.OTLP_ENDPOINT] = otlp
    try:
        server = embedded_valkey_if_needed(config_path)
        # Before the app: the gateway reads the usage table's name from the environment.
        aws = embedded_aws_if_needed() if rollup or admin_token else None
        if admin_token:
            from hardcap_core.local.admin_serve import local_config_table

            # Before the app too: the gateway serves the live config of the table named here.
            admin_table = local_config_table(embedded=aws is not None)
        config = load_config(config_path)
        app = create_app(config, live=live_from_env(config_path))
        if admin_token:
            from hardcap_core.local.admin_serve import serve_admin

            if serve_admin(app, config_path, admin_table, admin_token):
                print(f"hardcap: admin API at http://{host}:{port}/admin/v1 (config table "
                      f"{admin_table})", flush=True)  # fmt: skip
        timer = (
            rollup_timer_if_possible(config, rollup_interval_s, config_path, notify_url)
            if rollup
            else None
        )
        if config.gateway.otlp_endpoint:
            print(f"hardcap: traces to {config.gateway.otlp_endpoint} (OTLP/HTTP)", flush=True)
        print(f"hardcap: serving {config_path} on http://{host}:{port}/v1", flush=True)
        # Returns after a graceful shutdown on Ctrl-C or SIGTERM: uvicorn raises the signal
        # again once it is done, and both handlers raise a KeyboardInterrupt, which it catches.
        uvicorn.run(app, **UVICORN_OPTIONS, host=host, port=port)
    finally:
        # The timer's last rollup needs the cache and the table; the gateway is done by now.
        for started in (timer, aws, server):
            if started is not None:
                started.stop()
    return 0


def _otlp_url(text: str) -> str:
    try:
        return check_otlp_endpoint(text.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _admin_token(text: str) -> str:
    if len(text) < 16:
        raise argparse.ArgumentTypeError("an admin token of at least 16 characters")
    return text


def _http_url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL")
    return text


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


if __name__ == "__main__":
    sys.exit(main())
