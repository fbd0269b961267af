"""An embedded DynamoDB for local runs and tests: moto's server in a thread of this process.

``hardcap serve`` and ``hardcap demo`` start one when no usage table is configured, so the
rollup writes somewhere durable-looking and ``hardcap usage`` reads it back, with no AWS
account. It listens on 127.0.0.1 on a free port, keeps everything in memory, and is gone when
the process exits. Not shipped to Lambda (the artifact leaves ``hardcap_core/local/`` out).

:meth:`LocalAws.start` sets this process's environment (children inherit it) so that any boto3
DynamoDB client built afterwards reaches the server and the code that reads
``HARDCAP_USAGE_TABLE`` finds the table; :meth:`LocalAws.stop` puts the environment back.

moto's server needs Flask (``pip install 'hardcap[local]'`` brings it). Its backends are
module-level state of this process: two servers in one process share their tables, so each
gets a table name of its own when they must not (tests pass ``table``).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from hardcap_core import env

# Where a boto3 DynamoDB client sends its calls (boto3 >= 1.28 reads it; it wins over the
# generic AWS_ENDPOINT_URL). Also read by `hardcap usage` and by the children of this process.
ENDPOINT_VAR = "AWS_ENDPOINT_URL_DYNAMODB"
REGION_VAR = "AWS_DEFAULT_REGION"
DEFAULT_REGION = "us-east-1"
DEFAULT_TABLE = "hardcap-usage"
DEFAULT_CONFIG_TABLE = "hardcap-config"  # the live config (tenants, keys, budgets)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# moto signs nothing and checks nothing, but botocore refuses to send a call without some
# credentials; these are only set when the environment has none.
DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}


@dataclass
class LocalAws:
    """moto's server on 127.0.0.1 with the usage and config tables created; ``url`` is its
    endpoint."""

    table: str = DEFAULT_TABLE
    config_table: str = DEFAULT_CONFIG_TABLE
    port: int = 0  # 0: a free port, chosen by the OS when the server binds
    _server: Any = field(default=None, repr=False)
    _saved_env: dict[str, str | None] = field(default_factory=dict, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LocalAws:
        """Start the server, point this process's environment at it, create the table."""
        # moto's request handler logs every call at INFO through werkzeug's logger, which
        # prints to stderr unless told otherwise: a line per rollup write drowns the gateway's.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        server.start()
        self._server = server
        # Bound already (start waits for it), so the port the OS chose is known and no other
        # process can take it between choosing and binding.
        self.port = int(server.get_host_and_port()[1])
        try:
            self._set_env()
            from hardcap_core.control.store import ConfigStore
            from hardcap_core.rollup.table import create_table

            create_table(self.client(), self.table)
            ConfigStore(self.config_table, self.client()).create_table()
        except BaseException:
            self.stop()
            raise
        return self

    def usage_command(self) -> str:
        """The shell line that runs ``hardcap usage`` against this server, from anywhere."""
        return f"{ENDPOINT_VAR}={self.url} {env.USAGE_TABLE}={self.table} hardcap usage"

    def client(self) -> Any:
        """A boto3 DynamoDB client for this server."""
        import boto3

        return boto3.client("dynamodb", endpoint_url=self.url, region_name=self.region)

    @property
    def region(self) -> str:
        return os.environ.get(REGION_VAR) or os.environ.get("AWS_REGION") or DEFAULT_REGION

    def _set_env(self) -> None:
        wanted = {
            ENDPOINT_VAR: self.url,
            env.USAGE_TABLE: self.table,
            env.CONFIG_TABLE: self.config_table,
        }
        if not (os.environ.get(REGION_VAR) or os.environ.get("AWS_REGION")):
            wanted[REGION_VAR] = DEFAULT_REGION
        if not _has_credentials():
            wanted.update(DUMMY_CREDENTIALS)
        for name, value in wanted.items():
            self._saved_env.setdefault(name, os.environ.get(name))
            os.environ[name] = value

    def stop(self) -> None:
        """Stop the server (its data is gone) and restore the environment as start found it."""
        if self._server is not None:
            self._drop_table()  # while the environment still has the credentials it needs
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env.clear()
        if self._server is not None:
            self._server.stop()
            self._server = None

    def _drop_table(self) -> None:
        # moto keeps its tables in module state, beyond the server's life: without this a
        # server started again in this process (a test, a second demo) would find the table.
        from botocore.exceptions import ClientError

        for table in (self.table, self.config_table):
            try:
                self.client().delete_table(TableName=table)
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "ResourceNotFoundException":
                    raise

    def __enter__(self) -> LocalAws:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def dynamodb_client() -> Any:
    """A boto3 DynamoDB client from the usual AWS environment (profile, region, credentials,
    ``AWS_ENDPOINT_URL_DYNAMODB``), so ``hardcap usage`` reads a real table as well as a local
    one. Against an endpoint on this machine (a moto server) a region and credentials are
    filled in when the environment has none: moto checks neither, botocore needs both."""
    import boto3

    endpoint = os.environ.get(ENDPOINT_VAR) or os.environ.get("AWS_ENDPOINT_URL") or ""
    if urlsplit(endpoint).hostname not in LOOPBACK:
        return boto3.client("dynamodb")
    session = boto3.Session()
    options: dict[str, Any] = {"region_name": session.region_name or DEFAULT_REGION}
    # The environment only: asking the whole credential chain would wait on the instance
    # metadata service of a laptop that has none.
    if not _has_credentials():
        options["aws_access_key_id"] = DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"]
        options["aws_secret_access_key"] = DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
    return session.client("dynamodb", **options)


def _has_credentials() -> bool:
    return bool(os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE"))


class OneCallAtATime:
    """A DynamoDB client whose calls moto runs one at a time, as DynamoDB applies each request
    atomically: moto rolls a failed transaction back by restoring a copy of the table taken
    before it, which erases a write another thread made meanwhile."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return method(*args, **kwargs)

        return call
