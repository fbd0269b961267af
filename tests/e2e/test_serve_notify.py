"""Budget threshold notifications on a laptop: `hardcap serve` (its own Valkey and DynamoDB)
prints each event as one JSON line and POSTs it to `HARDCAP_NOTIFY_URL` — here a test HTTP
server — once, however many rollups run after it."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from hardcap_core import env
from hardcap_core.local.aws import ENDPOINT_VAR
from hardcap_core.local.stack import start_gateway
from tests.e2e.test_local_rollup import stream_one
from tests.stack import Mock, config_data

LIMIT = 5_000  # alpha's tokens a day: one completion is a few percent of it


class Receiver:
    """An HTTP server on 127.0.0.1 that keeps the JSON body of every POST."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[str] = []
        bodies, headers = self.bodies, self.headers

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                bodies.append(json.loads(body))
                headers.append(self.headers.get("content-type", ""))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def nothing_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    """`hardcap serve` starts its own Valkey and DynamoDB."""
    for name in ("HARDCAP_REDIS_URL", env.USAGE_TABLE, ENDPOINT_VAR, "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)


def test_serve_prints_and_posts_each_threshold_once(
    mock: Mock, tmp_path: Path, receiver: Receiver, nothing_configured: None
) -> None:
    mock.reset()
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump(config_data(mock.url, None, **{
        "orgs.0.budgets": [],
        "tenants.0.budgets": [
            {"dimension": "total_tokens", "limit": LIMIT, "window": "day", "notify_at": [1, 90]}
        ],
    })))  # fmt: skip
    gateway = start_gateway(
        config, tmp_path, rollup=True, options=("--rollup-interval", "0.3"),
        env={"HARDCAP_NOTIFY_URL": receiver.url},
    )  # fmt: skip
    try:
        usage = stream_one(gateway.url, uuid.uuid4().hex)
        deadline = time.monotonic() + 60
        while not receiver.bodies and time.monotonic() < deadline:
            time.sleep(0.1)
        assert receiver.bodies, gateway.log.read_text()
        time.sleep(1.5)  # several more rollups: none posts it again
        (event,) = receiver.bodies
        assert receiver.headers == ["application/json"]
        assert (event["source"], event["detail-type"]) == ("hardcap", "Budget threshold crossed")
        detail = event["detail"]
        spent = usage.prompt_tokens + usage.completion_tokens
        assert (detail["tenant"], detail["level"], detail["id"]) == ("alpha", "tenant", "alpha")
        assert (detail["dimension"], detail["window"], detail["threshold"]) == (
            "total_tokens", "d", 1
        )  # fmt: skip
        assert (detail["used"], detail["limit"]) == (spent, LIMIT)
        # The same event, one line on stdout.
        printed = [json.loads(line) for line in gateway.log.read_text().splitlines()
                   if line.startswith('{"source":"hardcap"')]  # fmt: skip
        assert printed == [event]
    finally:
        status = gateway.stop()
    assert status == 0, gateway.log.read_text()
