"""``hardcap demo``: the whole stack on one machine, no AWS account, one command.

An embedded Valkey, the mock upstream and the gateway start in this process; then a streamed
completion goes through the gateway with tenant alpha's demo key, and the tenant's usage is
printed from ``/v1/hardcap/usage``. Without ``--once`` it keeps serving for curl or an SDK,
until Ctrl-C or SIGTERM; either stops the servers and the embedded Valkey.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import yaml

from hardcap_core import env
from hardcap_core.local.servers import ThreadServer

if TYPE_CHECKING:
    from hardcap_core.config.model import Config

DEMO_KEY = "sk-alpha-demo"  # tenant alpha's demo key in hardcap_core/local/demo.yaml


def run_demo(config_path: str, port: int, *, once: bool, mock_port: int | None = None) -> int:
    """Start Valkey, the mock upstream and the gateway; show one exchange; serve until stopped.

    ``mock_port`` moves the mock upstream (the config's ``mock`` upstream) off its configured
    port. Returns the exit status: 0 after ``once``, Ctrl-C or SIGTERM.
    """
    from hardcap_core.config import load_config
    from hardcap_core.gateway.app import create_app
    from hardcap_core.local.mock_upstream import MockSettings, create_mock_app
    from hardcap_core.local.valkey import LocalValkey
    from hardcap_core.logs import logger

    logger.setLevel("WARNING")  # the demo shows the exchange, not the request log
    load_config(config_path)  # a config error shows before anything starts
    valkey = mock = gateway = None
    try:
        valkey = LocalValkey().start()
        os.environ[env.REDIS_URL] = valkey.url
        # Loaded once the variable is set: it overrides the config's redis_url.
        config = _config(config_path, mock_port)
        mock_url = httpx.URL(config.upstreams["mock"].base_url)
        mock = ThreadServer(create_mock_app(MockSettings(pace_ms=15, seed=7)), mock_url.port or 80)
        mock.start()
        gateway = ThreadServer(create_app(config), port).start()
        return _show(config_path, valkey.url, mock.url, f"{gateway.url}/v1", once=once)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (hardcap_core.local.servers.Terminated)
        return 0
    finally:
        # Gateway first: requests in flight still reach the mock and the budget server.
        for server in (gateway, mock, valkey):
            if server is not None:
                server.stop()


def _config(path: str, mock_port: int | None) -> Config:
    """The config at ``path``, its ``mock`` upstream moved to ``mock_port`` (if given)."""
    from hardcap_core.config import load_config, parse_config

    if mock_port is None:
        return load_config(path)
    # The file itself was validated by load_config already (duplicate keys included).
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    for upstream in data["upstreams"]:
        if upstream["name"] == "mock":
            upstream["base_url"] = str(httpx.URL(upstream["base_url"]).copy_with(port=mock_port))
    return parse_config(data, source=path)


def _show(config_path: str, valkey_url: str, mock_url: str, base: str, *, once: bool) -> int:
    """Print where everything runs, one streamed completion and the usage; then wait."""
    say = functools.partial(print, flush=True)  # a pipe (a process manager, tee) sees it now
    say(f"Config                          {Path(config_path).resolve()}")
    say(f"Valkey (embedded, real server)  {valkey_url}")
    say(f"Mock upstream                   {mock_url}/v1")
    say(f"  its ground truth              {mock_url}/mock/ground-truth")
    say(f"Hardcap gateway                 {base}")
    with httpx.Client(base_url=base, headers={"authorization": f"Bearer {DEMO_KEY}"}) as http:
        say("\n$ POST /v1/chat/completions  (model demo, stream, max_tokens 120)\n")
        _stream(http)
        say("\n$ GET /v1/hardcap/usage\n")
        usage = http.get("/hardcap/usage")
        say(_pretty(usage.json()))
        shown = {k: v for k, v in usage.headers.items() if k.startswith(("x-token", "x-rate"))}
        say("\nbudget headers: " + _pretty(shown))
    if once:
        return 0
    say(
        f"\nServing until Ctrl-C. Try:\n  curl -N {base}/chat/completions "
        f'-H \'authorization: Bearer {DEMO_KEY}\' -d \'{{"model":"demo","stream":true,'
        f'"messages":[{{"role":"user","content":"hi"}}]}}\'\n'
        f"  curl {base}/hardcap/usage -H 'authorization: Bearer {DEMO_KEY}'"
    )
    while True:
        time.sleep(3600)


def _stream(http: httpx.Client) -> None:
    body = {
        "model": "demo",
        "stream": True,
        "max_tokens": 120,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Why do LLM gateways need hard budgets?"}],
    }
    with http.stream("POST", "/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or ():
                sys.stdout.write(choice.get("delta", {}).get("content") or "")
                if choice.get("finish_reason"):
                    sys.stdout.write(f"\n[finish_reason: {choice['finish_reason']}]")
            if chunk.get("usage"):
                sys.stdout.write(f"\n[usage: {json.dumps(chunk['usage'])}]")
            sys.stdout.flush()
        print("\n[DONE]")


def _pretty(data: object) -> str:
    return json.dumps(data, indent=2)
