"""Where a cold start of the streaming entry goes, phase by phase.

Each run starts a fresh process (``bench/coldstart/coldstart_probe.py``) that does what
``functions/gateway/run.sh`` does one step at a time and times each in-process: the interpreter's
start (spawn to the probe's first statement), importing uvicorn and its CLI, importing the app,
loading the config, building the app, uvicorn's config and event loop, the server's startup, the
first chat completion (split into the cache connection, the ledger, the HTTP client and the
providers it builds on the way) and a second one for comparison. The first request includes
the upstream call to the mock and the budget scripts; the cache keeps its script cache across
runs, as a shared cache would for a new execution environment.

Targets as in :mod:`bench.coldstart.coldstart`: the source tree with this interpreter, or
``--artifact
DIR --python PY`` a built artifact under CPython 3.13 with /var/task's read-only bytecode rule.
``--servers`` runs the probe once per ``<loop>-<http>`` (uvloop-httptools as run.sh has it).

    python -m bench coldstart_phases --runs 10 --artifact /tmp/art --python python3.13 \\
        --servers uvloop-httptools,asyncio-h11 --out bench/results/coldstart-phases.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

from bench.coldstart.coldstart import CHAT_EVENT, local_stack
from bench.coldstart.coldstart_runs import Stack, import_breakdown
from bench.lib.machine import machine_info
from hardcap_core.local.valkey import free_port

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "bench" / "coldstart" / "coldstart_probe.py"


def probe_env(args: argparse.Namespace, stack: Stack, port: int) -> dict[str, str]:
    env = {**os.environ, **stack.env(), "AWS_LWA_PORT": str(port)}
    if args.artifact:
        # /var/task is read-only: only bytecode the build shipped is used. The artifact first
        # on the path, as run.sh puts it.
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPATH"] = str(Path(args.artifact).resolve())
    else:
        env["PYTHONPATH"] = str(ROOT)
    return env


def run_probe(
    args: argparse.Namespace, stack: Stack, server: str, *, profile: bool = False
) -> dict[str, Any]:
    """One cold start; its phases, with ``interpreter_ms`` and ``total_ms`` seen from here."""
    python = args.python or sys.executable
    env = probe_env(args, stack, free_port())
    if profile:
        env["PYTHONPROFILEIMPORTTIME"] = "1"
    loop, _, http = server.partition("-")
    with tempfile.TemporaryFile() as errors:
        spawned = time.monotonic()
        proc = subprocess.Popen(
            [python, str(PROBE), str(CHAT_EVENT), loop, http],
            env=env,
            cwd=args.artifact or ROOT,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        out, _ = proc.communicate(timeout=120)
        done = time.monotonic()
        errors.seek(0)
        err = errors.read().decode(errors="replace")
    lines = [line for line in out.splitlines() if line.startswith('{"started_monotonic"')]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"probe failed ({proc.returncode}):\n{err[-3000:]}")
    child = json.loads(lines[-1])
    phases = {"interpreter": round((child["started_monotonic"] - spawned) * 1e3, 2)}
    phases.update(child["phases_ms"])
    sample: dict[str, Any] = {
        "phases_ms": phases,
        # Spawn to the second response read, minus the second request: the first response.
        "first_response_ms": round(
            phases["interpreter"]
            + sum(v for k, v in child["phases_ms"].items() if "." not in k)
            - child["phases_ms"]["second_request"],
            2,
        ),
        "process_ms": round((done - spawned) * 1e3, 2),
        "imported": child["imported"],
        "modules": child["modules"],
    }
    if profile:
        sample["importtime"] = err
    return sample


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    names = list(samples[0]["phases_ms"])
    out: dict[str, Any] = {}
    for name in [*names, "first_response_ms"]:
        values = sorted(
            s["phases_ms"][name] if name in s["phases_ms"] else s[name] for s in samples
        )
        out[name] = {
            "median": round(statistics.median(values), 2),
            "min": values[0],
            "max": values[-1],
        }
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    servers = args.servers.split(",")
    results: dict[str, Any] = {}
    with local_stack() as stack:
        bar = tqdm(total=len(servers) * (args.runs + 1), unit="run", desc="cold starts")
        samples: dict[str, list[dict[str, Any]]] = {s: [] for s in servers}
        try:
            for i in range(args.runs):
                shift = i % len(servers)
                for server in servers[shift:] + servers[:shift]:
                    bar.set_postfix_str(server)
                    stack.flush()
                    samples[server].append(run_probe(args, stack, server))
                    bar.update(1)
            for server in servers:
                stack.flush()
                profiled = run_probe(args, stack, server, profile=True)
                bar.update(1)
                results[server] = {
                    "summary": summarize(samples[server]),
                    "imported_by_phase": samples[server][0]["imported"],
                    "modules": samples[server][0]["modules"],
                    "samples": [
                        {k: v for k, v in s.items() if k != "imported"} for s in samples[server]
                    ],
                    "imports": import_breakdown(profiled.pop("importtime"), top=25),
                }
        finally:
            bar.close()
    return results


def parse_args(argv: Iterable[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=10, help="cold starts per server variant")
    parser.add_argument("--quick", action="store_true", help="3 runs: a smoke test")
    parser.add_argument("--artifact", help="a built artifact folder (default: the source tree)")
    parser.add_argument("--python", help="the interpreter (CPython 3.13 for an artifact)")
    parser.add_argument(
        "--servers", default="uvloop-httptools", help="comma-separated <loop>-<http> variants"
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "coldstart-phases.json"))
    args = parser.parse_args(None if argv is None else list(argv))
    if args.quick:
        args.runs = 3
    return args


def main(argv: Iterable[str] | None = None) -> int:
    args = parse_args(argv)
    data: dict[str, Any] = {
        "bench": "coldstart-phases",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "bench", "coldstart_phases", *sys.argv[1:]]),
        "parameters": {
            "runs": args.runs,
            "artifact": args.artifact,
            "python": args.python or sys.executable,
            "servers": args.servers,
            "event": CHAT_EVENT.relative_to(ROOT).as_posix(),
        },
        "machine": machine_info(),
        "load_average_before": list(os.getloadavg()),
    }
    data["servers"] = measure(args)
    data["load_average_after"] = list(os.getloadavg())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    for server, result in data["servers"].items():
        print(f"{server}:")
        for name, s in result["summary"].items():
            print(f"  {name:34} median {s['median']:8.1f} ms  (min {s['min']:.1f})")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
