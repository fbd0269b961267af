"""What each candidate upstream HTTP client costs a cold start: importing it, and building a
client (its TLS context included), each in a fresh process.

Every run starts a new interpreter that imports asyncio and ssl first (the gateway has them
anyway), then times the import of one client library and then the construction of its client
on a running event loop: httpx 0.28, httpx2, httpx over the aiohttp transport (httpx-aiohttp),
aiohttp, and the gateway's own transport over aiohttp (hardcap_core.providers.aiohttp_transport,
its session and TLS context made as its first request makes them). Candidates take turns run by run.

The libraries are looked up on ``--path`` (a folder ``pip install --target`` filled with wheels
for the interpreter, as infra/Makefile does for the artifact, compiled with ``compileall
--invalidation-mode unchecked-hash`` and read with PYTHONDONTWRITEBYTECODE, as on /var/task),
then on this repository for hardcap_core (PYTHONSAFEPATH: the working directory is not looked
at). ``hardcap_http11``, the gateway's own HTTP/1.1 client until it was replaced by aiohttp, is
looked up on ``--base-path`` instead (an artifact built at a commit that still has it), so the
client before and after the change are measured in one run.

    python -m bench coldstart_transports --python python3.13 --path /tmp/tp313 --runs 15
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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

from bench.lib.machine import machine_info, write_json

ROOT = Path(__file__).resolve().parents[2]

# name: (import statement, client construction run inside a coroutine; `c` is what it built)
CANDIDATES: dict[str, tuple[str, str]] = {
    "httpx": ("import httpx", "c = httpx.AsyncClient()"),
    "httpx2": ("import httpx2", "c = httpx2.AsyncClient()"),
    "httpx_aiohttp": (
        "import httpx, httpx_aiohttp",
        "c = httpx.AsyncClient(transport=httpx_aiohttp.AiohttpTransport())",
    ),
    "aiohttp": ("import aiohttp", "c = aiohttp.ClientSession()"),
    "hardcap_transport": (
        "import hardcap_core.providers.aiohttp_transport as h",
        "c = h.AiohttpTransport(); c._client()",
    ),
    # The client before aiohttp (deleted in f1fc8fc), its TLS context made as its first
    # HTTPS connection made it: only with --base-path.
    "hardcap_http11": (
        "import hardcap_core.providers.http11 as h",
        "c = h.Http11Transport(); c._tls_context()",
    ),
}
BASE_ONLY = ("hardcap_http11",)

CHILD = """
import time
t0 = time.perf_counter()
import asyncio, json, ssl
t1 = time.perf_counter()
{imp}
t2 = time.perf_counter()
async def build():
    {build}
    return c
loop = asyncio.new_event_loop()
c = loop.run_until_complete(build())
t3 = time.perf_counter()
print(json.dumps({{"baseline_ms": (t1 - t0) * 1e3, "import_ms": (t2 - t1) * 1e3,
                  "client_ms": (t3 - t2) * 1e3}}))
"""


def run_one(args: argparse.Namespace, name: str) -> dict[str, float]:
    imp, build = CANDIDATES[name]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONSAFEPATH": "1"}
    # --path may name several folders (the libraries, then an artifact for hardcap_core).
    path = args.base_path if name in BASE_ONLY else args.path
    env["PYTHONPATH"] = os.pathsep.join(p for p in (path, str(ROOT)) if p)
    code = CHILD.format(imp=imp, build=build)
    out = subprocess.run(
        [args.python, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        raise RuntimeError(f"{name}: {out.stderr[-2000:]}")
    sample: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return {k: round(v, 2) for k, v in sample.items()}


def versions(args: argparse.Namespace) -> dict[str, str | None]:
    code = (
        "import json, importlib.metadata as m\n"
        "def v(n):\n"
        "    try: return m.version(n)\n"
        "    except m.PackageNotFoundError: return None\n"
        "print(json.dumps({n: v(n) for n in "
        "['httpx', 'httpx2', 'httpx-aiohttp', 'aiohttp', 'httpcore', 'certifi']}))"
    )
    env = {**os.environ, "PYTHONPATH": args.path or ""}
    out = subprocess.run([args.python, "-c", code], env=env, capture_output=True, text=True)
    found: dict[str, str | None] = json.loads(out.stdout)
    return found


def measure(args: argparse.Namespace) -> dict[str, Any]:
    names = args.candidates.split(",")
    samples: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    with tqdm(total=len(names) * args.runs, unit="run", desc="imports") as bar:
        for i in range(args.runs):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                bar.set_postfix_str(name)
                samples[name].append(run_one(args, name))
                bar.update(1)
    out: dict[str, Any] = {}
    for name, runs in samples.items():
        out[name] = {
            "statement": CANDIDATES[name][0],
            "client": CANDIDATES[name][1],
            "median_ms": {k: round(statistics.median(s[k] for s in runs), 2) for k in runs[0]},
            "min_ms": {k: min(s[k] for s in runs) for k in runs[0]},
            "samples": runs,
        }
    return out


def parse_args(argv: Iterable[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="3 runs")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--path", help="folder with the client libraries (pip --target)")
    parser.add_argument("--base-path", help="--path for hardcap_http11 (the client before)")
    parser.add_argument("--candidates", help=f"comma-separated, of {list(CANDIDATES)}")
    parser.add_argument(
        "--out", default=str(ROOT / "bench" / "results" / "coldstart-transports.json")
    )
    args = parser.parse_args(None if argv is None else list(argv))
    if args.quick:
        args.runs = 3
    if args.candidates is None:
        base = () if args.base_path else BASE_ONLY
        args.candidates = ",".join(n for n in CANDIDATES if n not in base)
    return args


def main(argv: Iterable[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict[str, Any] = {
        "bench": "coldstart-transports",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "bench", "coldstart_transports", *sys.argv[1:]]),
        "parameters": {
            "runs": args.runs,
            "python": args.python,
            "path": args.path,
            "base_path": args.base_path,
        },
        "machine": machine_info(),
        "versions": versions(args),
        "load_average_before": list(os.getloadavg()),
    }
    result["candidates"] = measure(args)
    result["load_average_after"] = list(os.getloadavg())
    write_json(Path(args.out), result)
    for name, r in result["candidates"].items():
        m = r["median_ms"]
        print(f"{name:16} import {m['import_ms']:7.1f} ms   client {m['client_ms']:7.1f} ms")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
