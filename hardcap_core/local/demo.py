"""``hardcap demo``: the whole stack on one machine, no AWS account, one command.

An embedded Valkey, an embedded DynamoDB (moto), the mock upstream, the gateway and the rollup
on a timer start in this process; then a streamed completion goes through the gateway with
tenant alpha's demo key, the tenant's usage is printed from ``/v1/hardcap/usage`` (the cache),
and after one rollup its spend as ``hardcap usage`` reads it from DynamoDB; then one Responses API
call and one embeddings call, each with its cost. Without ``--once``
it keeps serving for curl or an SDK, until Ctrl-C or SIGTERM; either stops the servers and the
embedded Valkey and DynamoDB.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import yaml

from hardcap_core import env
from hardcap_core.local.servers import ThreadServer
from hardcap_core.wire.base import COST_HEADER

if TYPE_CHECKING:
    from hardcap_core.local.aws import LocalAws
    from hardcap_core.local.rollup_timer import RollupTimer

DEMO_KEY = "sk-alpha-demo"  # tenant alpha's demo key in hardcap_core/local/demo.yaml
DEMO_TENANT = "alpha"


def run_demo(config_path: str, port: int, *, once: bool, mock_port: int | None = None) -> int:
    """Start Valkey, the mock upstream and the gateway; show one exchange; serve until stopped.

    ``mock_port`` moves the mock upstream (the config's ``mock`` upstream) off its configured
    port. Returns the exit status: 0 after ``once``, Ctrl-C or SIGTERM.
    """
    from hardcap_core.config import load_config, parse_config
    from hardcap_core.control.live import LiveConfig
    from hardcap_core.control.store import ConfigStore
    from hardcap_core.gateway.app import create_app
    from hardcap_core.local.admin_serve import serve_admin
    from hardcap_core.local.aws import LocalAws, dynamodb_client
    from hardcap_core.local.mock_upstream import MockSettings, create_mock_app
    from hardcap_core.local.rollup_timer import RollupTimer
    from hardcap_core.local.valkey import LocalValkey
    from hardcap_core.logs import logger
    from hardcap_core.rollup.table import UsageTable

    logger.setLevel("WARNING")  # the demo shows the exchange, not the request log
    # Nor the gateway's per-request EMF line, which would land in the middle of the stream
    # printed below; POWERTOOLS_METRICS_DISABLED=false in the environment shows it.
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    load_config(config_path)  # a config error shows before anything starts
    valkey = aws = mock = gateway = timer = None
    try:
        valkey = LocalValkey().start()
        # As its user on a deployed cache: no FLUSHALL, FLUSHDB, KEYS, CONFIG or DEBUG.
        os.environ[env.REDIS_URL] = valkey.gateway_url
        # Sets the environment the gateway reads the usage table's name from.
        aws = LocalAws().start()
        # Loaded once the variable is set: it overrides the config's redis_url.
        data = _data(config_path, mock_port)
        config = parse_config(data, source=config_path)
        mock_url = httpx.URL(config.upstreams["mock"].base_url)
        mock = ThreadServer(create_mock_app(MockSettings(pace_ms=15, seed=7)), mock_url.port or 80)
        mock.start()
        # Tenants and keys live in the embedded config table once the admin changes them.
        store = ConfigStore(aws.config_table, aws.client())
        app = create_app(config, live=LiveConfig(data, config_path, store))
        token = secrets.token_urlsafe(24)
        serve_admin(app, config_path, aws.config_table, token)
        gateway = ThreadServer(app, port).start()
        live = LiveConfig(data, config_path, store)  # the timer's own: it runs on another loop
        timer = RollupTimer(config, UsageTable(dynamodb_client(), aws.table), live=live).start()
        servers = {"valkey": valkey.url, "mock": mock.url, "base": f"{gateway.url}/v1"}
        return _show(config_path, servers, aws, timer, once=once, admin=(gateway.url, token))
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (hardcap_core.local.servers.Terminated)
        return 0
    finally:
        # Gateway first: requests in flight still reach the mock and the budget server; then
        # the timer's last rollup, which needs the budget server and DynamoDB.
        for server in (gateway, mock, timer, aws, valkey):
            if server is not None:
                server.stop()


def _data(path: str, mock_port: int | None) -> dict[str, Any]:
    """The config data at ``path``, its ``mock`` upstream moved to ``mock_port`` (if given);
    the file itself was validated by load_config already (duplicate keys included)."""
    data: dict[str, Any] = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if mock_port is not None:
        for upstream in data["upstreams"]:
            if upstream["name"] == "mock":
                url = httpx.URL(upstream["base_url"]).copy_with(port=mock_port)
                upstream["base_url"] = str(url)
    return data


def _show(
    config_path: str,
    servers: dict[str, str],
    aws: LocalAws,
    timer: RollupTimer,
    *,
    once: bool,
    admin: tuple[str, str],
) -> int:
    """Print where everything runs, one streamed completion, the usage from the cache and
    from DynamoDB; then wait."""
    say = functools.partial(print, flush=True)  # a pipe (a process manager, tee) sees it now
    base, mock_url = servers["base"], servers["mock"]
    say(f"Config                          {Path(config_path).resolve()}")
    say(f"Valkey (embedded, real server)  {servers['valkey']}")
    say(f"DynamoDB (embedded, moto)       {aws.url}  table {aws.table}")
    say(f"Mock upstream                   {mock_url}/v1")
    say(f"  its ground truth              {mock_url}/mock/ground-truth")
    say(f"Hardcap gateway                 {base}")
    say(f"Rollup                          every {timer.interval_s:g} s, cache -> DynamoDB")
    with httpx.Client(base_url=base, headers={"authorization": f"Bearer {DEMO_KEY}"}) as http:
        say("\n$ POST /v1/chat/completions  (model demo, stream, max_tokens 120)\n")
        _stream(http)
        say("\n$ GET /v1/hardcap/usage\n")
        usage = http.get("/hardcap/usage")
        say(_pretty(usage.json()))
        shown = {k: v for k, v in usage.headers.items() if k.startswith(("x-token", "x-rate"))}
        say("\nbudget headers: " + _pretty(shown))
    _show_rollup(timer)
    _show_other_apis(base)
    _show_admin(base, *admin)
    if once:
        return 0
    say(
        f"\nServing until Ctrl-C. Try:\n  curl -N {base}/chat/completions "
        f'-H \'authorization: Bearer {DEMO_KEY}\' -d \'{{"model":"demo","stream":true,'
        f'"messages":[{{"role":"user","content":"hi"}}]}}\'\n'
        f"  curl {base}/hardcap/usage -H 'authorization: Bearer {DEMO_KEY}'\n"
        f"  {aws.usage_command()}   # spend in DynamoDB, rolled up every "
        f"{timer.interval_s:g} s"
    )
    while True:
        time.sleep(3600)


def _show_admin(base: str, url: str, token: str) -> None:
    """The live config's loop with ``hardcap admin``: a new key used at once, its budget
    raised for a week, then revoked and refused on its next request; no restart."""
    say = functools.partial(print, flush=True)

    def admin(*args: str, json_out: bool = False) -> str:
        shown = " ".join(args)
        say(f"\n$ hardcap admin {shown}")
        command = [sys.executable, "-m", "hardcap_core.local.cli", "admin", *args]
        command += ["--url", url, "--token", token] + (["--json"] if json_out else [])
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        if not json_out:
            say(done.stdout.rstrip())
        return done.stdout

    made = json.loads(admin("keys", "create", "--tenant", DEMO_TENANT, "--id", "alpha-live",
                            json_out=True))  # fmt: skip
    key = made["key"]
    say(f"new key (shown once): {key}")
    say("\n$ POST /v1/chat/completions with it, at once (the OpenAI SDK)")
    say(f"  -> {_one_reply(base, key)}")
    admin("budgets", "set", "--level", "key", "--id", "alpha-live", "--dimension",
          "total_tokens", "--window", "day", "--limit", "50000", "--for", "7d",
          "--reason", "demo: a week's raise")  # fmt: skip
    admin("keys", "revoke", "alpha-live")
    say("\n$ POST /v1/chat/completions with the revoked key")
    say(f"  -> {_one_reply(base, key)}")


def _show_other_apis(base: str) -> None:
    """One Responses API call and one embeddings call with the OpenAI SDK, each with the cost
    the gateway charged (its `x-hardcap-cost-usd` header)."""
    import openai

    say = functools.partial(print, flush=True)
    with openai.OpenAI(base_url=base, api_key=DEMO_KEY, max_retries=0) as client:
        say("\n$ POST /v1/responses  (responses.create, model demo, max_output_tokens 40)")
        raw = client.responses.with_raw_response.create(
            model="demo", input="Why cap a budget hard?", max_output_tokens=40
        )
        response = raw.parse()
        tokens = response.usage.total_tokens if response.usage else 0
        say(f"  -> {response.status}: {response.output_text!r}")
        say(f"     {tokens} tokens, ${raw.headers[COST_HEADER]}")
        say("\n$ POST /v1/embeddings  (embeddings.create, two texts)")
        raw_vectors = client.embeddings.with_raw_response.create(
            model="demo", input=["hard budgets", "for every tenant"]
        )
        vectors = raw_vectors.parse()
        size = len(vectors.data[0].embedding) if vectors.data else 0
        say(f"  -> {len(vectors.data)} vectors of {size} floats")
        say(f"     {vectors.usage.prompt_tokens} tokens, ${raw_vectors.headers[COST_HEADER]}")


def _one_reply(base: str, key: str) -> str:
    """One short completion with the OpenAI SDK: its text, or the error it got."""
    import openai

    client = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
    try:
        reply = client.chat.completions.create(
            model="demo", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
    except openai.APIStatusError as e:
        return f"{e.status_code} {e.message}"
    usage = reply.usage.total_tokens if reply.usage else 0
    return f"200 {reply.choices[0].message.content!r} ({usage} tokens)"


def _show_rollup(timer: RollupTimer) -> None:
    """One rollup now, then the tenant's spend as ``hardcap usage`` reads it from DynamoDB."""
    from hardcap_core.local.usage_command import DEFAULT_SINCE
    from hardcap_core.rollup.report import format_table, parse_time

    report = timer.run_now()
    records = "record" if report.applied == 1 else "records"
    print(
        f"\n$ hardcap usage --tenant {DEMO_TENANT}   (after a rollup: {report.applied} usage "
        f"{records} from the cache into DynamoDB)\n",
        flush=True,
    )
    now_ms = int(time.time() * 1000)
    start_ms = parse_time(DEFAULT_SINCE, now_ms)
    rows = timer.table.usage([DEMO_TENANT], start_ms, now_ms)
    print(format_table(rows, start_ms, now_ms), flush=True)


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
