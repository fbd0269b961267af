"""Where a request's CPU goes: the gateway's hot path split into stages, per request.

One run of :mod:`bench.speed.wrk_overhead` against the mock (the gateway, and the bare proxy
over the same upstream transport, ``transport``, beside it), with py-spy sampling the gateway
under saturation load for a non-streamed request and a streamed one (``--profile-format raw``).
Each sampled stack goes to the stage of the innermost gateway function it is in (:data:`STAGES`,
searched from the leaf up), else to the ASGI server and framework around the handler, else to
the event loop and everything else. A stage's CPU per request is its share of the samples times
the gateway process's CPU per request measured by the same run. The bare proxy's
CPU per request is the floor a gateway on this transport and server cannot go under.

py-spy pauses the process to sample it, so shares, not the throughput while sampled, are the
result; a stage under ~2 % is within the sampling's noise.

    python -m bench hot_path                # table + bench/results/hot-path.json
    python -m bench hot_path --quick        # shorter blocks and profiles (a smoke run)
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.lib.machine import ROOT, write_json
from bench.speed import wrk_overhead

RESULT = ROOT / "bench" / "results" / "hot-path.json"

# Stage -> the gateway's functions (py-spy's frame names: ``Class.method`` or ``function``) that
# are that stage. A frame is matched by its name and its file's tail, so a name two modules use
# is told apart. Searched innermost first: the settle's ledger call is the settle's, not the
# handler's.
STAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "parse and validate": (
        ("OpenAIChat.parse", "openai_chat.py"),
        ("parse_chat_request", "openai_request.py"),
        ("Gateway.read_body", "pipeline.py"),
        ("with_headers", "anthropic_request.py"),
        ("check_pdf_pages", "openai_input.py"),
        ("output_cap", "money.py"),
        ("tool_hold", "money.py"),
        ("ToolHold.bounded", "money.py"),
    ),
    "caller and route": (
        ("Gateway.authenticate", "pipeline.py"),
        ("Callers.for_request", "callers.py"),
        ("Gateway.route_for", "pipeline.py"),
        ("Callers.allowing", "callers.py"),
        ("request_id", "request_id.py"),
        ("choose", "request_id.py"),
    ),
    "admit (estimate, encode, round trip, decode)": (("Gateway._admit", "pipeline.py"),),
    "upstream request (build, send, reply)": (
        ("Targets.complete", "failover.py"),
        ("Targets.stream", "failover.py"),
        ("Listened.__anext__", "pace.py"),
    ),
    "relay (per read: decode, meter, encode)": (
        ("Relay.chunks", "relay.py"),
        ("Relay.open", "relay.py"),
        ("Relay.end", "relay.py"),
        ("RelayResponse.__call__", "response.py"),
    ),
    "settle": (("Meter.settle", "meter.py"),),
    "sending to the client (each message, through the id middleware)": (
        ("RequestIdMiddleware.__call__.<locals>.send_with_id", "request_id.py"),
    ),
    "the reply's body, headers and the log/metric line": (
        ("record_request", "metrics.py"),
        ("budget_headers", "headers.py"),
        ("Gateway._complete", "pipeline.py"),
    ),
    "handler, other": (
        ("Gateway.chat", "pipeline.py"),
        ("create_app.<locals>.endpoint.<locals>.serve", "app.py"),
    ),
}
FRAMEWORK = ("uvicorn/", "starlette/", "httptools")
FRAME = re.compile(r"(?P<name>.*) \((?P<file>.*?):\d+\)$")


def stage_of(stack: list[tuple[str, str]]) -> str:
    """The stage of one sampled stack (root first): the innermost frame a stage names."""
    for name, file in reversed(stack):
        for stage, frames in STAGES.items():
            if any(name == n and file.endswith(f) for n, f in frames):
                return stage
    if any(any(f in file for f in FRAMEWORK) for _, file in stack):
        return "ASGI server and framework (outside the handler)"
    return "event loop and other"


def shares(raw: Path) -> tuple[int, dict[str, float]]:
    """The samples of a py-spy raw (collapsed) profile, and each stage's share of them."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack_text, _, n = line.rstrip().rpartition(" ")
        if not stack_text or not n.isdigit():
            continue
        frames = []
        for frame in stack_text.split(";"):
            m = FRAME.match(frame.strip())
            frames.append((m["name"], m["file"]) if m else (frame.strip(), ""))
        counts[stage_of(frames)] += int(n)
        total += int(n)
    return total, {s: c / total for s, c in counts.most_common()} if total else {}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench hot_path", description=__doc__)
    p.add_argument("--quick", action="store_true", help="2 s blocks, 6 s profiles")
    p.add_argument("--block-seconds", type=float, default=5.0)
    p.add_argument("--profile-seconds", type=int, default=15)
    p.add_argument("--out", type=Path, default=RESULT)
    p.add_argument("--keep-profiles", type=Path, help="copy py-spy's raw profiles to this folder")
    ns = p.parse_args(argv)
    if ns.quick:
        ns.block_seconds, ns.profile_seconds = 2.0, 6
    return ns


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hardcap-hot-path-") as tmp:
        wrk_json = Path(tmp) / "wrk.json"
        wrk_overhead.main([
            "--targets", "direct,transport,gateway", "--rounds", "1",
            "--block-seconds", str(ns.block_seconds), "--profile", "--profile-format", "raw",
            "--profile-seconds", str(ns.profile_seconds), "--out", str(wrk_json),
        ])  # fmt: skip
        run = json.loads(wrk_json.read_text())
        summary = run["summary"]

        def cpu(target: str, prefix: str) -> float:
            """The target process's own CPU per request (the mock's is measured apart)."""
            return float(summary[target][f"{prefix}target_cpu_us_per_request"])

        kinds: dict[str, Any] = {}
        profiles = (("non_stream", "sat_", "profile-gateway.txt"),
                    ("stream", "stream_", "profile-gateway-stream.txt"))  # fmt: skip
        for kind, prefix, file in profiles:
            if ns.keep_profiles:
                ns.keep_profiles.mkdir(parents=True, exist_ok=True)
                shutil.copy(Path(tmp) / file, ns.keep_profiles / file)
            samples, split = shares(Path(tmp) / file)
            per_request = cpu("gateway", prefix)
            kinds[kind] = {
                "gateway_cpu_us_per_request": round(per_request, 1),
                "bare_transport_proxy_cpu_us_per_request": round(cpu("transport", prefix), 1)
                if kind == "non_stream"
                else None,
                "samples": samples,
                "stages": {
                    s: {"share": round(v, 4), "cpu_us_per_request": round(v * per_request, 1)}
                    for s, v in split.items()
                },
            }
    result = {
        "benchmark": "hot_path",
        "command": "python -m bench hot_path "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "complete": True,
        "machine": run["machine"],
        "versions": run["versions"],
        "parameters": {**{k: str(v) for k, v in vars(ns).items()}, "wrk_overhead": run["command"]},
        "non_stream_connections": run["parameters"]["connections"],
        "stream_tokens": run["parameters"]["stream_tokens"],
        "kinds": kinds,
    }
    write_json(ns.out, result)
    for kind, got in kinds.items():
        floor = got["bare_transport_proxy_cpu_us_per_request"]
        beside = f" (bare proxy over the same transport: {floor:.0f})" if floor else ""
        print(f"{kind}: gateway {got['gateway_cpu_us_per_request']:.0f} µs CPU/request{beside}")
        for stage, v in got["stages"].items():
            print(f"  {v['share'] * 100:5.1f}%  {v['cpu_us_per_request']:7.0f} µs  {stage}")
    print(f"wrote {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
