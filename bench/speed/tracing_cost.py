"""What tracing costs a request: the gateway's CPU per request with tracing off against the base
tree (before tracing), and with it on, in one run.

Set-up: a private Valkey, the mock upstream at pace 0 in its own process, an OTLP/HTTP receiver
in this process (it answers every ``POST /v1/traces`` and keeps the bodies; they are decoded
once the gateways have stopped, to count the spans), and three ``hardcap serve`` gateways, as
shipped (uvloop, httptools, hiredis): ``base`` from ``git archive --base-tree``, ``off`` and
``on`` from the working tree, ``on`` with ``--otlp`` to the receiver (the batch processor's
export thread runs in the gateway, so its CPU is counted).

Blocks alternate: every round visits every gateway, the order rotated each round, so all see
the same machine. A block sends ``--requests`` requests one after another over one keep-alive
connection (httpx, in this process: its CPU is not the gateway's), non-streamed (a 1-token
completion) or streamed (``--stream-tokens`` tokens), and reads the gateway's CPU seconds from
/proc before and after. Figures: the median over rounds of CPU µs per request, and ``off`` minus
``base`` and ``on`` minus ``off`` per round, medians. Wall time per request is recorded too but
is not the figure: the client and the mock share the machine's two cores.

    python -m bench tracing_cost --rounds 5
    python -m bench tracing_cost --quick
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml
from tqdm import tqdm  # type: ignore[import-untyped]

from bench.lib import stack
from bench.lib.machine import machine_info, process_cpu_seconds, write_json
from bench.speed.wrk_overhead import export_tree, tree_env
from hardcap_core.local import stack as local_stack
from hardcap_core.local.valkey import LocalValkey
from tests.load.harness import chat_body

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
TENANT = "bench"
GATEWAYS = ("base", "off", "on")
KINDS = ("whole", "stream")


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1 that keeps what it is sent."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                bodies.append(body)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> int:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        count = 0
        for body in self.bodies:
            for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
                count += sum(len(scope.spans) for scope in resource.scope_spans)
        return count

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 round of 100 requests (a smoke run)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=400, help="per block")
    p.add_argument("--stream-tokens", type=int, default=50)
    p.add_argument("--base-tree", default="main", metavar="REV", help="the tree before tracing")
    p.add_argument("--out", type=Path)
    ns = p.parse_args(argv)
    if ns.quick:
        ns.rounds, ns.requests = 1, 100
    return ns


def config(mock_url: str, redis_url: str) -> dict[str, Any]:
    data = stack.base_config(mock_url, redis_url)
    data["routes"] = [stack.mock_route("small", max_output_tokens=1024)]
    data["tenants"] = [stack.tenant_entry(TENANT, 10**15, "30d")]
    return data


def block(client: httpx.Client, url: str, pid: int, body: dict[str, Any], n: int) -> dict[str, Any]:
    """``n`` requests one after another; the gateway's CPU and the wall time per request."""
    cpu0, t0 = process_cpu_seconds(pid), time.perf_counter()
    errors = 0
    for _ in range(n):
        if body["stream"]:
            with client.stream("POST", url, json=body) as r:
                for _ in r.iter_bytes():
                    pass
        else:
            r = client.post(url, json=body)
        errors += r.status_code != 200
    wall, cpu = time.perf_counter() - t0, process_cpu_seconds(pid) - cpu0
    return {"cpu_us_per_request": round(cpu / n * 1e6, 1),
            "wall_ms_per_request": round(wall / n * 1000, 3), "errors": errors}  # fmt: skip


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for kind in KINDS:
        per: dict[str, dict[int, float]] = {g: {} for g in GATEWAYS}
        for row in rows:
            if row["kind"] == kind:
                per[row["gateway"]][row["round"]] = row["cpu_us_per_request"]
        rounds = sorted(set.intersection(*(set(v) for v in per.values())))
        if not rounds:
            continue
        summary[kind] = {
            **{f"{g}_cpu_us": statistics.median(per[g][r] for r in rounds) for g in GATEWAYS},
            "off_minus_base_cpu_us": statistics.median(
                per["off"][r] - per["base"][r] for r in rounds
            ),
            "on_minus_off_cpu_us": statistics.median(per["on"][r] - per["off"][r] for r in rounds),
            "rounds": len(rounds),
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    out = ns.out or RESULTS / ("tracing-cost-quick.json" if ns.quick else "tracing-cost.json")
    result: dict[str, Any] = {
        "benchmark": "tracing_cost",
        "command": "python -m bench tracing_cost " + " ".join(argv or sys.argv[1:]),
        "complete": False,
        "machine": machine_info(),
        "parameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(ns).items()},
    }
    rows: list[dict[str, Any]] = []
    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory(prefix="hardcap-tracing-")))
        vk = es.enter_context(LocalValkey())
        mock = stack.start_mock(tmp, pace_ms=0.0, seed=11)
        es.callback(mock.stop)
        receiver = Receiver()
        es.callback(receiver.stop)
        path = tmp / "config.yaml"
        path.write_text(yaml.safe_dump(config(mock.url, vk.url), sort_keys=False))
        base = export_tree(ns.base_tree, tmp / "base-tree")
        result["base_tree"] = base
        here = {"PYTHONPATH": str(ROOT), "POWERTOOLS_LOG_LEVEL": "WARNING"}
        launches = {
            "base": ({**here, **tree_env(base)}, []),
            "off": (here, []),
            "on": (here, ["--otlp", receiver.url]),
        }
        services = {}
        for name, (env, options) in launches.items():
            (tmp / name).mkdir()
            services[name] = local_stack.start_gateway(
                path, tmp / name, env=env, cwd=ROOT, options=options
            )
        bodies = {
            "whole": chat_body(TENANT, "small", 1, stream=False),
            "stream": chat_body(TENANT, "small", ns.stream_tokens, stream=True),
        }
        bodies["stream"]["messages"][-1]["content"] += f" [mock:tokens={ns.stream_tokens}]"
        headers = {"authorization": f"Bearer {stack.tenant_key(TENANT)}"}
        clients = {n: es.enter_context(httpx.Client(headers=headers, timeout=30)) for n in GATEWAYS}
        url = {n: f"{s.url}/v1/chat/completions" for n, s in services.items()}
        for n in GATEWAYS:  # warm: connections, estimators, the first import of each path
            for kind in KINDS:
                block(clients[n], url[n], services[n].proc.pid, bodies[kind], 50)
        plan = [
            (rnd, kind, GATEWAYS[(i + rnd) % len(GATEWAYS)])
            for rnd in range(ns.rounds)
            for kind in KINDS
            for i in range(len(GATEWAYS))
        ]
        for rnd, kind, name in tqdm(plan, unit="block"):
            got = block(clients[name], url[name], services[name].proc.pid, bodies[kind],
                        ns.requests)  # fmt: skip
            rows.append({"round": rnd, "kind": kind, "gateway": name, **got})
            result["blocks"] = rows
            result["summary"] = summarise(rows)
            write_json(out, result)
        for service in services.values():
            service.stop()  # the traced one exports what it still holds as it stops
        sent = (len(KINDS) * 50 + ns.rounds * len(KINDS) * ns.requests) * 4
        result["spans"] = {"received": receiver.spans(), "expected_at_least": sent}
    result["summary"] = summarise(rows)
    result["complete"] = True
    write_json(out, result)
    for kind, s in result["summary"].items():
        print(f"{kind}: base {s['base_cpu_us']:.0f} µs, off {s['off_cpu_us']:.0f} µs, "
              f"on {s['on_cpu_us']:.0f} µs of gateway CPU per request; off - base "
              f"{s['off_minus_base_cpu_us']:+.0f} µs, on - off {s['on_minus_off_cpu_us']:+.0f} µs "
              f"({s['rounds']} rounds)")  # fmt: skip
    print(f"spans received: {result['spans']}")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
