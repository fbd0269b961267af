"""The stack the real clients run against: ``hardcap serve`` and ``hardcap mock`` as processes
on free ports, one real Valkey, and one tenant per scenario so a test never shares a budget.

Every client is pointed at the gateway by its base URL and key only; its model is a route of
the same name. The tenant's key says the scenario: ``normal`` (a budget no turn reaches),
``cut-<test>`` (60 output tokens: the stream is cut), ``spent`` (1 token: every turn is
refused at admission).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hardcap_core.auth import hash_key

HERE = Path(__file__).parent
NODE_BIN = HERE / "node_modules" / ".bin"
# `make test` sets it: a client that is not installed fails its test instead of skipping.
REQUIRE_ENV = "HARDCAP_REQUIRE_CLIENTS"
UPSTREAM_KEY_ENV = "HC_CLIENTS_ANTHROPIC_KEY"
PRICE = {"input_per_million": 3.0, "output_per_million": 15.0}
CUT_BUDGET = [{"dimension": "output_tokens", "limit": 60, "window": "day"}]
# One token: every request is larger than the whole budget, refused before it is held.
SPENT_BUDGET = [{"dimension": "total_tokens", "limit": 1, "window": "day"}]
BIG_BUDGET = [{"dimension": "total_tokens", "limit": 1_000_000_000, "window": "day"}]
# The routes a client names: OpenAI-shaped clients use `m` (an OpenAI-compatible upstream;
# Responses is translated onto it); Anthropic clients use `claude` or Claude Code's own names; the
# OpenAI Agents SDK's default model is a route too.
OPENAI_ROUTES = ("m", "gpt-5.6-luna")
ANTHROPIC_ROUTES = ("claude", "claude-opus-5-5", "claude-haiku-4-5")
CUT_TENANTS = 32


def key_of(tenant: str) -> str:
    return f"sk-hc-{tenant}"


def config(mock_url: str, redis_url: str) -> dict[str, Any]:
    """The gateway's config: the mock as an OpenAI-compatible and an Anthropic upstream."""
    routes = [
        {"name": name, "upstream": "mock", "model": "mock-small", "price": PRICE,
         "max_output_tokens": 4096}
        for name in OPENAI_ROUTES
    ] + [
        {"name": name, "upstream": "claude", "model": "mock-small", "price": PRICE,
         "max_output_tokens": 128_000}
        for name in ANTHROPIC_ROUTES
    ]  # fmt: skip
    tenants = [("normal", BIG_BUDGET), ("spent", SPENT_BUDGET)] + [
        (f"cut-{i}", CUT_BUDGET) for i in range(CUT_TENANTS)
    ]
    return {
        "gateway": {"redis_url": redis_url, "max_body_bytes": 4_000_000},
        "upstreams": [
            {"name": "mock", "base_url": f"{mock_url}/v1", "timeout_seconds": 30},
            {
                "name": "claude",
                "kind": "anthropic",
                "base_url": f"{mock_url}/v1",
                "timeout_seconds": 30,
                "api_key_env": UPSTREAM_KEY_ENV,
            },
        ],
        "routes": routes,
        "tenants": [
            {
                "id": tenant,
                "budgets": budgets,
                "keys": [{"id": f"{tenant}-k", "hash": hash_key(key_of(tenant))}],
            }
            for tenant, budgets in tenants
        ],
    }


@dataclass
class Run:
    """What a client printed and how it exited."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return (
            f"$ {' '.join(self.argv)}\nexit {self.returncode}\n"
            f"--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}"
        )


def run(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    cwd: Path,
    timeout_s: float = 120,
    stdin: str | None = None,
) -> Run:
    """``argv`` with only ``env`` (plus PATH), bounded by ``timeout_s``."""
    full = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **env}
    done = subprocess.run(
        list(argv),
        env=full,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        input=stdin,
        check=False,
    )
    return Run(list(argv), done.returncode, done.stdout, done.stderr)


def tenant_requests(log: Path, tenant: str) -> list[dict[str, Any]]:
    """Each request the gateway answered for ``tenant``, from its log: a settled stream's
    "request settled" line, or the "request" line of any other answer (a refusal, an error)."""
    seen = []
    for line in log.read_text().splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("message") in ("request", "request settled") and entry.get("tenant") == tenant:
            seen.append(entry)
    return seen


def outcomes(log: Path, tenant: str) -> list[str]:
    """Per request of ``tenant``: its outcome (``completed``, ``truncated``) or its status."""
    return [str(e.get("Outcome") or e.get("status")) for e in tenant_requests(log, tenant)]
