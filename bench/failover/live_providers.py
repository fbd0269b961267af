"""The live check: through a local gateway to each provider you hold credentials for, the
ledger's charge against the provider's own reported usage, and a budget that cuts a stream.

For every provider whose credentials are set it starts a gateway in this process (embedded
Valkey, the official ``openai`` SDK as the client) with one route on that provider, and checks:

* **unary** and **streaming**: the ledger's input and output tokens for the request (usage
  endpoint, before and after) equal what the provider reported in its own reply (read off the
  wire between gateway and provider), and equal the usage the client was given;
* **truncation**: a reasoning stream for a tenant with a 60-token output budget ends with
  ``finish_reason: "length"`` and is charged at most 60 output tokens (the seed's bug: reasoning
  deltas that were not counted let such a stream run to 400 billed tokens).

Providers: ``OPENAI_API_KEY`` (``HARDCAP_LIVE_OPENAI_MODEL``, default gpt-4o-mini; reasoning
``HARDCAP_LIVE_OPENAI_REASONING_MODEL``, default o4-mini), ``GROQ_API_KEY`` (llama-3.1-8b-instant;
reasoning openai/gpt-oss-20b), ``ANTHROPIC_API_KEY`` (``HARDCAP_LIVE_ANTHROPIC_MODEL``, default
claude-haiku-4-5, extended thinking for the reasoning stream), Bedrock when
``HARDCAP_LIVE_BEDROCK_MODEL`` names a model and botocore finds AWS credentials (region from
``AWS_REGION``). Bedrock's replies travel through botocore, not the gateway's HTTP client, so
there the provider's usage is the one the gateway relayed. ``--mock`` runs the same checks
against the mock upstream, in OpenAI and Anthropic modes, with no credentials (CI).

    python -m bench live_providers --mock
    OPENAI_API_KEY=... python -m bench live_providers
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from bench.lib.machine import machine_info, write_json
from bench.lib.wire_tee import Tee, reported_usage
from hardcap_core.auth import hash_key
from hardcap_core.config import parse_config
from hardcap_core.gateway.app import create_app
from hardcap_core.local.mock_upstream import MockSettings, create_mock_app
from hardcap_core.local.servers import ThreadServer
from hardcap_core.local.valkey import LocalValkey, free_port
from hardcap_core.logs import logger

RESULTS = Path(__file__).resolve().parents[1] / "results"
CUT_BUDGET = 60  # output tokens the truncation tenant may spend
KEYS = {"live": "sk-live-check", "cut": "sk-live-cut"}
ASK = "In two sentences, why do budgets matter for LLM gateways?"
MOCK_KEY_ENV = "HARDCAP_LIVE_MOCK_KEY"  # Anthropic mode wants an x-api-key, any will do
LONG = "Think step by step, at length, then write a 600-word essay on token budgets."


@dataclass
class Target:
    """One provider to check: its upstream config and the two models."""

    name: str
    upstream: dict[str, Any]
    model: str
    reasoning_model: str
    reasoning_body: dict[str, Any] = field(default_factory=dict)  # extra fields for it
    prompt_suffix: str = ""  # the mock's directives, for the charge checks
    reasoning_suffix: str = ""  # ... and for the reasoning stream
    truth_url: str | None = None  # the mock's GET /mock/ground-truth: what it generated
    wire_visible: bool = True  # the provider's replies go through the HTTP client (not botocore)


def live_targets(env: dict[str, str]) -> list[Target]:
    """The providers whose credentials are set in ``env``."""
    out = []
    if env.get("OPENAI_API_KEY"):
        base = env.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
        out.append(
            Target(
                "openai",
                {"kind": "openai", "base_url": base, "api_key_env": "OPENAI_API_KEY"},
                env.get("HARDCAP_LIVE_OPENAI_MODEL", "gpt-4o-mini"),
                env.get("HARDCAP_LIVE_OPENAI_REASONING_MODEL", "o4-mini"),
            )
        )
    if env.get("GROQ_API_KEY"):
        out.append(
            Target(
                "groq",
                {
                    "kind": "openai",
                    "base_url": "https://api.groq.com/openai/v1",
                    "api_key_env": "GROQ_API_KEY",
                },
                env.get("HARDCAP_LIVE_GROQ_MODEL", "llama-3.1-8b-instant"),
                env.get("HARDCAP_LIVE_GROQ_REASONING_MODEL", "openai/gpt-oss-20b"),
            )
        )
    if env.get("ANTHROPIC_API_KEY"):
        model = env.get("HARDCAP_LIVE_ANTHROPIC_MODEL", "claude-haiku-4-5")
        out.append(
            Target(
                "anthropic",
                {
                    "kind": "anthropic",
                    "base_url": "https://api.anthropic.com/v1",
                    "api_key_env": "ANTHROPIC_API_KEY",
                },
                model,
                model,
                {"thinking": {"type": "enabled", "budget_tokens": 1024}},
            )
        )
    if env.get("HARDCAP_LIVE_BEDROCK_MODEL") and _aws_credentials():
        model = env["HARDCAP_LIVE_BEDROCK_MODEL"]
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
        out.append(
            Target(
                "bedrock",
                {"kind": "bedrock", "region": region},
                model,
                env.get("HARDCAP_LIVE_BEDROCK_REASONING_MODEL", model),
                wire_visible=False,
            )
        )
    return out


def _aws_credentials() -> bool:
    import botocore.session

    return botocore.session.get_session().get_credentials() is not None


def mock_targets(mock_url: str) -> list[Target]:
    """The mock upstream in OpenAI mode and in Anthropic mode (``/v1/messages``)."""
    return [
        Target(
            "mock-openai",
            {"kind": "openai", "base_url": f"{mock_url}/v1"},
            "mock-small",
            "mock-reason",
            prompt_suffix=" [mock:tokens=24]",
            reasoning_suffix=" [mock:tokens=400]",
            truth_url=f"{mock_url}/mock/ground-truth",
        ),
        Target(
            "mock-anthropic",
            {"kind": "anthropic", "base_url": f"{mock_url}/v1", "api_key_env": MOCK_KEY_ENV},
            "mock-small",
            "mock-small",
            prompt_suffix=" [mock:tokens=24]",
            reasoning_suffix=" [mock:tokens=400] [mock:thinking=300]",
            truth_url=f"{mock_url}/mock/ground-truth",
        ),
    ]


def config_for(target: Target, redis_url: str) -> Any:
    big = [
        {"dimension": d, "limit": 10**9, "window": "day"} for d in ("input_tokens", "output_tokens")
    ]
    cut = [big[0], {"dimension": "output_tokens", "limit": CUT_BUDGET, "window": "day"}]
    price = {"input_per_million": 1.0, "output_per_million": 2.0}
    return parse_config(
        {
            "gateway": {"redis_url": redis_url},
            "upstreams": [{"name": target.name, "timeout_seconds": 120, **target.upstream}],
            "routes": [
                {
                    "name": "chat",
                    "upstream": target.name,
                    "model": target.model,
                    "price": price,
                    "max_output_tokens": 4096,
                },
                {
                    "name": "reason",
                    "upstream": target.name,
                    "model": target.reasoning_model,
                    "price": price,
                    "max_output_tokens": 4096,
                },
            ],
            "tenants": [
                {"id": t, "budgets": b, "keys": [{"id": f"{t}-k", "hash": hash_key(KEYS[t])}]}
                for t, b in (("live", big), ("cut", cut))
            ],
        }
    )


@contextmanager
def gateway(target: Target, redis_url: str) -> Iterator[tuple[str, Tee]]:
    tee = Tee()
    app = create_app(
        config_for(target, redis_url),
        http_client=tee,
    )
    server = ThreadServer(app, free_port()).start()
    try:
        yield f"{server.url}/v1", tee
    finally:
        server.stop()


def ledger(base: str, tenant: str) -> dict[str, int]:
    r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {KEYS[tenant]}"})
    r.raise_for_status()
    rows = r.json()["budgets"]
    used = {b["dimension"]: b["used"] for b in rows if b["level"] == "tenant"}
    return {"input": used.get("input_tokens", 0), "output": used.get("output_tokens", 0)}


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def check_charge(target: Target, base: str, tee: Tee, stream: bool) -> dict[str, Any]:
    """One request on route ``chat``: ledger delta == provider's usage == the client's usage."""
    client = openai.OpenAI(base_url=base, api_key=KEYS["live"], max_retries=0, timeout=120)
    before = ledger(base, "live")
    messages: Any = [{"role": "user", "content": ASK + target.prompt_suffix}]
    if stream:
        chunks = list(
            client.chat.completions.create(
                model="chat",
                messages=messages,
                max_tokens=200,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        got = next((c.usage for c in reversed(chunks) if c.usage), None)
    else:
        got = client.chat.completions.create(model="chat", messages=messages, max_tokens=200).usage
    charged = _delta(before, ledger(base, "live"))
    provider = reported_usage(tee.last) if target.wire_visible else None
    client_usage = (
        None if got is None else {"input": got.prompt_tokens, "output": got.completion_tokens}
    )
    ok = client_usage == charged and (provider == charged or not target.wire_visible)
    return {
        "check": "stream" if stream else "unary",
        "passed": ok,
        "ledger": charged,
        "provider_reported": provider,
        "client_usage": client_usage,
    }


def check_truncation(target: Target, base: str, tee: Tee) -> dict[str, Any]:
    """A reasoning stream on a 60-token output budget: cut (length) and charged within it."""
    client = openai.OpenAI(base_url=base, api_key=KEYS["cut"], max_retries=0, timeout=300)
    cap = (
        "max_completion_tokens"
        if target.reasoning_model.startswith(("o1", "o3", "o4", "gpt-5"))
        else "max_tokens"
    )
    extra = {cap: 2000, **target.reasoning_body}
    messages: Any = [{"role": "user", "content": LONG + target.reasoning_suffix}]
    if target.truth_url:
        httpx.post(target.truth_url.replace("ground-truth", "reset")).raise_for_status()
    finish, reasoning_chunks = None, 0
    stream = client.chat.completions.create(
        model="reason",
        messages=messages,
        stream=True,
        user="cut",
        extra_body=extra,
    )
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            delta = choice.delta.model_dump()
            reasoning_chunks += any(
                delta.get(k) for k in ("reasoning", "reasoning_content", "thinking")
            )
    charged = ledger(base, "cut")
    provider = reported_usage(tee.last) if target.wire_visible else None
    generated = None
    if target.truth_url:  # the mock's own count of every output token it produced
        truth = httpx.get(target.truth_url).json()["tenants"].get("cut", {})
        generated = truth.get("completion_tokens")
    ok = finish == "length" and charged["output"] <= CUT_BUDGET
    return {
        "check": "truncation",
        "passed": ok,
        "finish_reason": finish,
        "output_budget": CUT_BUDGET,
        "ledger": charged,
        "reasoning_chunks": reasoning_chunks,
        "provider_reported": provider,
        "mock_generated_output": generated,
    }


def run_target(target: Target, redis_url: str) -> dict[str, Any]:
    import redis

    with redis.Redis.from_url(redis_url) as r:
        r.flushall()  # each provider starts from empty budgets
    checks = []
    with gateway(target, redis_url) as (base, tee):
        for fn in (
            lambda: check_charge(target, base, tee, False),
            lambda: check_charge(target, base, tee, True),
            lambda: check_truncation(target, base, tee),
        ):
            try:
                checks.append(fn())
            except (openai.APIError, httpx.HTTPError, ValueError) as e:
                checks.append({"check": "error", "passed": False, "error": repr(e)})
    return {
        "provider": target.name,
        "model": target.model,
        "reasoning_model": target.reasoning_model,
        "passed": all(c["passed"] for c in checks),
        "checks": checks,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mock", action="store_true", help="check against the mock upstream (CI)")
    p.add_argument("--out", type=Path, help="result JSON")
    ns = p.parse_args(argv)
    out = ns.out or RESULTS / ("live-providers-mock.json" if ns.mock else "live-providers.json")
    started = time.monotonic()
    # The gateway runs in this process: its per-request log and metric lines would bury the
    # report (set them in the environment to see them).
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    logger.setLevel(os.environ.get("POWERTOOLS_LOG_LEVEL", "WARNING"))
    os.environ.setdefault(MOCK_KEY_ENV, "sk-mock")
    results: list[dict[str, Any]] = []
    mock = None
    with LocalValkey() as valkey:
        try:
            if ns.mock:
                mock = ThreadServer(create_mock_app(MockSettings(pace_ms=0.5, seed=5)), free_port())
                targets = mock_targets(mock.start().url)
            else:
                targets = live_targets(dict(os.environ))
            if not targets:
                print(
                    "no provider credentials found (see --help); nothing checked", file=sys.stderr
                )
                return 2
            for target in targets:
                results.append(run_target(target, valkey.url))
                print(json.dumps(results[-1]))
        finally:
            if mock is not None:
                mock.stop()
    passed = all(r["passed"] for r in results)
    write_json(
        out,
        {
            "benchmark": "live_providers",
            "mock": ns.mock,
            "machine": machine_info(),
            "command": "python -m bench live_providers "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "output_budget": CUT_BUDGET,
            "seconds": round(time.monotonic() - started, 1),
            "passed": passed,
            "providers": results,
        },
    )
    print(f"wrote {out}: {'passed' if passed else 'FAILED'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
