"""How long a live config change takes to apply on every gateway instance.

Two ``hardcap serve`` processes share one Valkey and one config table (moto's DynamoDB, in this
process); the admin service runs here as the admin API would. Each round makes seven changes and
times, per instance, from the admin call's return to the first request that sees the change:

* a new key: until the first 200 with it (the instance has never seen it: one table lookup);
* the tenant disabled: until the first 403 (the admit finds the copy stale);
* the tenant enabled again: until the first 200 (the refusal finds the copy stale);
* the tenant's routes emptied: until the first 403 (the admit finds the copy stale);
* the tenant's routes restored: until the first 200 (the refusal finds the copy stale);
* a lowered budget: until the first 429 (the admit finds the copy stale, it reloads);
* the key revoked: until the first 401.

Requests are sent back to back on each instance (a client that keeps calling), so the figure is
what a user sees, request round trips included. The goal is 5 s.

    python -m bench live_config_propagation --rounds 20 \
        --out bench/results/live-config-propagation.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.lib import stack
from bench.lib.machine import machine_info
from hardcap_core.control.store import ConfigStore
from hardcap_core.local.admin_serve import admin_caller
from hardcap_core.local.aws import LocalAws
from hardcap_core.local.valkey import LocalValkey

WHO = "local:bench"
GOAL_S = 5.0


def chat(base: str, key: str) -> int:
    body = {"model": "r", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(
        f"{base}/chat/completions", json=body, headers=headers, timeout=30
    ).status_code


def until(base: str, key: str, status: int, limit_s: float = 30.0) -> float:
    """Seconds until a request on ``base`` with ``key`` answers ``status``."""
    started = time.perf_counter()
    while chat(base, key) != status:
        if time.perf_counter() - started > limit_s:
            return float("inf")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", type=Path, required=True)
    ns = p.parse_args(argv)
    times: dict[str, list[float]] = {
        change: []
        for change in (
            "new_key", "disabled_tenant", "reenabled_tenant", "emptied_routes",
            "restored_routes", "lowered_budget", "revoked_key",
        )
    }  # fmt: skip
    with (
        LocalValkey() as valkey,
        LocalAws(table="prop-usage", config_table="prop-config") as aws,
        tempfile.TemporaryDirectory() as tmp,
    ):
        mock = stack.start_mock(Path(tmp), pace_ms=0.0, seed=7)
        data = stack.base_config(mock.url, valkey.url)
        data["routes"] = [stack.mock_route("r", max_output_tokens=64)]
        data["tenants"] = [stack.tenant_entry("seed", 10**9, "day")]

        store = ConfigStore(aws.config_table, aws.client())
        admin = admin_caller(valkey.url, store, data)

        try:
            with stack.gateways(data, 2, Path(tmp)) as started:
                urls = [f"{g.url}/v1" for g in started]
                for base in urls:
                    assert chat(base, stack.tenant_key("seed")) == 200
                for n in range(ns.rounds):
                    tenant = f"prop{n}"
                    admin(
                        lambda a, t=tenant: a.create_tenant(
                            WHO,
                            {
                                "id": t,
                                "budgets": [
                                    {
                                        "dimension": "total_tokens",
                                        "limit": 1_000_000,
                                        "window": "day",
                                    }
                                ],
                            },
                        )
                    )
                    key = admin(lambda a, t=tenant: a.create_key(WHO, {"tenant": t}))["key"]
                    times["new_key"] += [until(b, key, 200) for b in urls]
                    admin(lambda a, t=tenant: a.disable_tenant(WHO, t))
                    times["disabled_tenant"] += [until(b, key, 403) for b in urls]
                    admin(lambda a, t=tenant: a.enable_tenant(WHO, t))
                    times["reenabled_tenant"] += [until(b, key, 200) for b in urls]
                    admin(lambda a, t=tenant: a.update_tenant(WHO, t, {"routes": []}))
                    times["emptied_routes"] += [until(b, key, 403) for b in urls]
                    admin(lambda a, t=tenant: a.update_tenant(WHO, t, {"routes": None}))
                    times["restored_routes"] += [until(b, key, 200) for b in urls]
                    admin(lambda a, t=tenant: a.set_budget(WHO, {
                        "level": "tenant", "id": t, "dimension": "total_tokens",
                        "window": "day", "limit": 1}))  # fmt: skip
                    times["lowered_budget"] += [until(b, key, 429) for b in urls]
                    key_id = admin(lambda a, t=tenant: a.list_keys(t))["keys"][0]["id"]
                    admin(lambda a, k=key_id: a.revoke_key(WHO, k))
                    times["revoked_key"] += [until(b, key, 401) for b in urls]
                    print(f"round {n + 1}/{ns.rounds}", file=sys.stderr)
        finally:
            mock.stop()
    summary = {
        change: {
            "instances_x_rounds": len(seconds),
            "median_ms": round(statistics.median(seconds) * 1000, 1),
            "max_ms": round(max(seconds) * 1000, 1),
            "within_goal": all(s <= GOAL_S for s in seconds),
        }
        for change, seconds in times.items()
    }
    result = {
        "benchmark": "live_config_propagation",
        "command": f"python -m bench live_config_propagation --rounds {ns.rounds} --out {ns.out}",
        "machine": machine_info(),
        "parameters": {"rounds": ns.rounds, "instances": 2, "goal_s": GOAL_S},
        "summary": summary,
        "seconds": times,
    }
    ns.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
