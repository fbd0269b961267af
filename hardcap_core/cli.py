"""The ``hardcap`` command: serve, mock, demo, keys new.

``hardcap serve -c config.yaml`` runs the gateway under uvicorn (the local stand-in for the
Lambda function URL); with no Redis URL configured it starts an embedded, real Valkey.
``hardcap demo`` brings up Valkey, the mock upstream and the gateway together and shows a
streamed completion and the tenant's usage.

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
from hardcap_core.local.servers import UVICORN_OPTIONS, Terminated, stop_on_sigterm

if TYPE_CHECKING:
    from hardcap_core.local.valkey import LocalValkey

# Shipped inside the package, so `hardcap demo` works from an installed wheel.
DEFAULT_CONFIG = Path(__file__).resolve().parent / "local" / "demo.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hardcap`` command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="hardcap", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway (uvicorn)")
    serve.add_argument("-c", "--config", required=True, help="YAML config file")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)

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
        return serve_command(ns.config, ns.host, ns.port)
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
    os.environ[env.REDIS_URL] = server.url
    # Flushed: under a process manager stdout is a pipe or a file, and this line says which
    # server to look at while the gateway runs.
    print(
        f"hardcap: no redis_url configured; started an embedded Valkey at {server.url}", flush=True
    )
    return server


def serve_command(config_path: str, host: str, port: int) -> int:
    """``hardcap serve``: the gateway under uvicorn until Ctrl-C or SIGTERM."""
    import uvicorn

    from hardcap_core.config import load_config
    from hardcap_core.gateway.app import create_app

    server = None
    try:
        server = embedded_valkey_if_needed(config_path)
        app = create_app(load_config(config_path))
        print(f"hardcap: serving {config_path} on http://{host}:{port}/v1", flush=True)
        # Returns after a graceful shutdown on Ctrl-C or SIGTERM: uvicorn raises the signal
        # again once it is done, and both handlers raise a KeyboardInterrupt, which it catches.
        uvicorn.run(app, **UVICORN_OPTIONS, host=host, port=port)
    finally:
        if server:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
