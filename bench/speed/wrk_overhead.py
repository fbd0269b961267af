"""What the gateway adds, measured with wrk (a C load generator), beside the direct call, a bare
Starlette app and bare Starlette proxies over each candidate HTTP client, in one run.

Set-up: a private Valkey, the mock upstream at pace 0, ONE ``hardcap serve`` worker (uvloop +
httptools + hiredis, as shipped; ``--gateway-env KEY=VALUE`` adds to its environment, so a
variant can be measured), and the reference apps of bench/lib/bare_apps.py, each in its own
uvicorn process (uvloop + httptools). Targets (``--targets``):

* ``direct``: the mock itself; ``bare``: a Starlette app answering fixed JSON;
* ``httpx``, ``httpx_aiohttp``, ``aiohttp``, ``httpx2``: bare proxies to the mock;
* ``gateway``: the p95-estimator route, a tenant with budget and rate limits (the full path).

With ``--base-tree REV`` a second gateway runs from REV (``gateway_base``) and, if ``transport``
is a target, a second ``transport`` proxy over REV's ``make_transport()`` (``transport_base``):
the client alone, before and after. With ``--gateway-tree`` the ``transport`` proxy uses that
tree's client too.

Measurements, in alternating blocks (every round visits every target in turn, the order
rotated each round, so all see the same machine): (i) ``latency``: non-streamed 1-token
completions at ONE connection (``wrk -c1 -t1``), p50/p90/p99/mean, reported as the target's
minus the direct call's in the same round; (ii) ``saturation``: requests/s at
``--connections`` (16) connections, the ratio to the bare app in the same round, and the CPU
seconds every process used (gateway CPU / requests is the machine-independent figure: wrk
and the mock share this machine's cores); (iii) ``stream``: a ``--stream-tokens`` (200)
token stream at one connection: added p50 to the last byte and CPU µs per relayed token.
Latency and stream blocks read and check every response (bench/wrk/check.lua: status, the
usage's completion_tokens, [DONE]); saturation blocks count wrk's non-2xx and socket errors.
Any error is reported in the table, never dropped. A block during which other processes took
more than a quarter of the machine is run again (up to twice). Figures are medians over
rounds. ``--profile`` records py-spy flame graphs of the gateway under saturation load,
non-streamed and streamed (bench/results/profile-gateway*.svg).

    python -m bench wrk_overhead --rounds 3
    python -m bench wrk_overhead --quick
    python -m bench wrk_overhead \
        --rounds 0 --profile   # flame graphs only
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

from bench.lib import stack
from bench.lib.machine import CpuWatch, machine_info, write_json
from bench.lib.wrk_report import plot, print_table, summarise
from bench.lib.wrk_run import (
    Target,
    fold_wrk_cpu,
    irq_seconds,
    parse_wrk,
    problems,
    run_wrk,
    settle,
    steal_seconds,
    verify,
    wait_quiet,
    wrk_command,
)
from hardcap_core.local import stack as local_stack
from hardcap_core.local.valkey import LocalValkey, free_port
from tests.load.harness import chat_body

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
TENANT = "bench"
PY_SPY = Path(sys.executable).parent / "py-spy"  # installed beside this interpreter
TARGETS = ("direct", "bare", "httpx", "httpx_aiohttp", "aiohttp", "httpx2", "transport", "gateway")
# What the published run measures: clients the bench extra installs.
DEFAULT_TARGETS = ("direct", "bare", "httpx", "aiohttp", "transport", "gateway")
# (and gateway_base, with --base-tree)
PROXIES = ("httpx", "httpx_aiohttp", "aiohttp", "httpx2", "transport")
KINDS = ("latency", "saturation", "stream")
CONTENDED = 0.25  # share of the machine other processes took during a block: run it again
RETRIES_CONTENDED = 3
CLIENT_PACKAGES: tuple[str, ...] = ("httpx", "httpx2", "httpcore", "httpcore2", "aiohttp")
CLIENT_PACKAGES += ("httpx-aiohttp", "uvloop", "httptools", "orjson", "wrk")
ROUTES = [
    stack.mock_route("p95", estimator={"kind": "p95", "min_samples": 50}, max_output_tokens=1024)
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 s blocks, 1 round (a smoke run)")
    p.add_argument(
        "--targets",
        default=",".join(DEFAULT_TARGETS),
        help=f"comma-separated, of {TARGETS} (httpx_aiohttp, httpx2: pip install them first)",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--block-seconds", type=float, default=7.0)
    p.add_argument("--connections", type=int, default=16, help="saturation blocks")
    p.add_argument("--wrk-threads", type=int, default=1, help="saturation blocks")
    p.add_argument("--stream-tokens", type=int, default=200)
    p.add_argument("--log-level", default="INFO", help="gateway POWERTOOLS_LOG_LEVEL")
    p.add_argument("--gateway-env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--gateway-tree",
        metavar="REV",
        help="run the gateway from `git archive REV` (say HEAD) instead of the working tree",
    )
    p.add_argument(
        "--base-tree",
        metavar="REV",
        help="also run a gateway from `git archive REV` (target gateway_base), blocks "
        "alternating with the gateway's: a change measured against its base in the same run",
    )
    p.add_argument("--profile", action="store_true", help="py-spy flame graphs of the gateway")
    p.add_argument("--profile-seconds", type=int, default=15)
    p.add_argument("--profile-rate", type=int, default=250)
    p.add_argument("--py-spy-nonblocking", action="store_true", help="do not pause the gateway")
    p.add_argument(
        "--profile-format", choices=("flamegraph", "raw"), default="flamegraph",
        help="raw: py-spy's collapsed stacks (.txt), to add up per function",
    )  # fmt: skip
    p.add_argument("--plot", action="store_true")
    p.add_argument("--out", type=Path)
    ns = p.parse_args(argv)
    if ns.quick:
        ns.block_seconds, ns.rounds = 2.0, 1
    ns.targets = [t for t in ns.targets.split(",") if t]
    unknown = set(ns.targets) - set(TARGETS)
    if unknown:
        p.error(f"unknown targets {sorted(unknown)}")
    if "direct" not in ns.targets:
        ns.targets.insert(0, "direct")  # every added figure is against it
    if ns.profile and not PY_SPY.is_file():
        p.error(f"--profile needs py-spy at {PY_SPY} (the bench extra installs it)")
    if ns.profile and "gateway" not in ns.targets:
        p.error("--profile needs the gateway target")
    ns.gateway_env = dict(kv.split("=", 1) for kv in ns.gateway_env)
    if ns.base_tree:
        if "gateway" not in ns.targets:
            p.error("--base-tree needs the gateway target")
        ns.targets.append("gateway_base")
        if "transport" in ns.targets:
            ns.targets.insert(ns.targets.index("transport") + 1, "transport_base")
    return ns


def kind_targets(kind: str, targets: list[str]) -> list[str]:
    """The bare app answers fixed JSON without an upstream: only its throughput is meaningful."""
    return [t for t in targets if kind == "saturation" or t != "bare"]


def config(mock_url: str, redis_url: str) -> dict[str, Any]:
    data = stack.base_config(mock_url, redis_url)
    data["routes"] = ROUTES
    tenant = stack.tenant_entry(TENANT, 10**15, "30d")
    tenant["rate_limits"] = {"requests_per_minute": 10**8, "tokens_per_minute": 10**12}
    data["tenants"] = [tenant]
    return data


def start_bare(
    kind: str, upstream: str, tmp: Path, tree: dict[str, str] | None = None, name: str = ""
) -> local_stack.Service:
    """One bench/lib/bare_apps.py app under uvicorn, as the gateway runs (uvloop, httptools).
    With ``tree`` (an export), hardcap_core is that tree's (this checkout's bench/ still
    serves the app: a folder holding only a link to it goes first on the path)."""
    name = name or kind
    port = free_port()
    args = [sys.executable, "-m", "uvicorn", "--factory", "bench.lib.bare_apps:app"]
    args += ["--host", "127.0.0.1", "--port", str(port), "--loop", "uvloop", "--http", "httptools"]
    args += ["--log-level", "warning", "--no-access-log", "--timeout-keep-alive", "75"]
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {"BARE_KIND": kind, "BARE_UPSTREAM": upstream, "PYTHONPATH": pythonpath}
    if tree:
        shim = tmp / f"bench-only-{name}"
        shim.mkdir()
        (shim / "bench").symlink_to(ROOT / "bench")
        env = {**env, **tree_env(tree)}
        env["PYTHONPATH"] = f"{shim}{os.pathsep}{env['PYTHONPATH']}"
        args += ["--app-dir", str(shim)]  # uvicorn puts it first on sys.path (default: the cwd)
    return local_stack.launch(name, args, port, tmp / f"{name}-{port}.log", env=env, cwd=ROOT)


def write_bodies(tmp: Path, tokens: int) -> dict[tuple[str, str], Path]:
    """Request bodies: (model, shape) -> file, shape one of non_stream, stream, warm."""
    out = {}
    for model in ("mock-small", "p95"):
        shapes = {
            "non_stream": chat_body(TENANT, model, 1024, "Hi. [mock:tokens=1]", stream=False),
            "stream": chat_body(TENANT, model, 1024, f"Hi. [mock:tokens={tokens}]", stream=True),
            "warm": chat_body(TENANT, model, 1024, "Warm.", stream=False),  # log-normal lengths
        }
        for shape, body in shapes.items():
            path = tmp / f"body-{model}-{shape}.json"
            path.write_text(json.dumps(body))
            out[(model, shape)] = path
    return out


def block(
    kind: str,
    target: Target,
    bodies: dict[tuple[str, str], Path],
    pids: dict[str, int],
    ns: argparse.Namespace,
) -> dict[str, Any]:
    """One wrk block of ``kind`` against ``target``, with the CPU every process used."""
    stream = kind == "stream"
    tokens = ns.stream_tokens if stream else 1
    body = bodies[(target.model, "stream" if stream else "non_stream")]
    connections, threads = (ns.connections, ns.wrk_threads) if kind == "saturation" else (1, 1)
    retries = 0
    while True:
        settled = settle([target.pid, pids["mock"]])
        quiet = wait_quiet(pids)
        irq0, steal0, watch = irq_seconds(), steal_seconds(), CpuWatch(pids).start()
        res = run_wrk(
            target, body, connections=connections, threads=threads, seconds=ns.block_seconds
        )
        cpu = fold_wrk_cpu(watch.stop(), res["wrk_cpu_seconds"], irq_seconds() - irq0)
        cpu["steal_seconds"] = round(steal_seconds() - steal0, 2)
        if (cpu["other_share"] or 0.0) <= CONTENDED or retries == RETRIES_CONTENDED:
            break
        retries += 1
    n = res.get("requests") or 0
    row: dict[str, Any] = {
        "kind": kind,
        "target": target.name,
        "connections": connections,
        "wrk_threads": threads,
        "reply_tokens": tokens,
        "wrk": res,
        "cpu": cpu,
        "settle_seconds": settled,
        "quiet_wait_seconds": quiet,
        "contended_retries": retries,
        "requests": n,
        "requests_per_second": round(n / (res["duration_us"] / 1e6), 1) if n else 0.0,
        "problems": problems(res),
    }
    lat = res.get("latency_us") or {}
    for q, name in (("50", "p50"), ("90", "p90"), ("99", "p99"), ("mean", "mean")):
        row[f"{name}_ms"] = round(lat[q] / 1000, 3) if q in lat else None
    seconds = cpu["cpu_seconds"]
    for proc in ("target", "mock", "wrk"):
        used = seconds[target.proc_name if proc == "target" else proc]
        row[f"{proc}_cpu_us_per_request"] = round(used / n * 1e6, 1) if n else None
    if stream and n:
        row["target_cpu_us_per_token"] = round(seconds[target.proc_name] / (n * tokens) * 1e6, 2)
    return row


def warm(target: Target, bodies: dict[tuple[str, str], Path], seconds: float) -> dict[str, Any]:
    """Open the pools and, for the gateway, fill the p95 estimator's sample (>= 50 replies
    of log-normal length), so measured blocks see the steady state."""
    shape = "warm" if target.name == "gateway" else "non_stream"
    res = run_wrk(target, bodies[(target.model, shape)], connections=8, threads=1, seconds=seconds)
    return {"requests": res.get("requests"), "problems": problems(res)}


def profile(
    kind: str,
    gateway: Target,
    bodies: dict[tuple[str, str], Path],
    out: Path,
    ns: argparse.Namespace,
) -> dict[str, Any]:
    """py-spy flame graph of the gateway while wrk drives it at ``--connections``."""
    shape = "stream" if kind == "stream" else "non_stream"
    seconds = ns.profile_seconds + 5
    cmd, env = wrk_command(gateway, bodies[("p95", shape)], ns.connections, 1, seconds, False)
    spy = [str(PY_SPY), "record", "--format", ns.profile_format]
    spy += ["-o", str(out), "--pid", str(gateway.pid), "--rate", str(ns.profile_rate)]
    spy += ["--duration", str(ns.profile_seconds)]
    if ns.py_spy_nonblocking:
        spy.append("--nonblocking")
    load = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)
        recorded = subprocess.run(
            spy, capture_output=True, text=True, timeout=ns.profile_seconds + 60
        )
    finally:
        stdout, stderr = load.communicate(timeout=seconds + 60)
    res = parse_wrk(stdout, stderr, load.returncode)
    return {
        "kind": kind,
        "svg": str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else str(out),
        "py_spy_command": " ".join(spy[1:]),
        "py_spy_returncode": recorded.returncode,
        "py_spy_output": (recorded.stdout + recorded.stderr)[-1500:],
        "wrk_requests_per_second": round(res["requests"] / (res["duration_us"] / 1e6), 1)
        if res.get("requests")
        else 0.0,
        "wrk_problems": problems(res),
        "note": "throughput while py-spy samples"
        + ("" if ns.py_spy_nonblocking else " (it pauses the process for each sample)"),
    }


def gateway_target(
    es: ExitStack,
    name: str,
    data: dict[str, Any],
    log_dir: Path,
    env: dict[str, str],
    ns: argparse.Namespace,
    targets: dict[str, Target],
    pids: dict[str, int],
) -> local_stack.Service:
    """One gateway worker serving ``data`` with ``env`` (a tree of its own on PYTHONPATH), as
    target ``name``; stopped when ``es`` closes."""
    (gateway,) = es.enter_context(
        stack.gateways_with_env(data, 1, log_dir, env, log_level=ns.log_level)
    )
    pids[name] = gateway.proc.pid
    url = f"{gateway.url}/v1/chat/completions"
    targets[name] = Target(name, url, gateway.proc.pid, name, "p95", stack.tenant_key(TENANT))
    return gateway


def export_tree(rev: str, dest: Path) -> dict[str, str]:
    """``git archive rev`` unpacked at ``dest``: a gateway that others' edits in progress in
    the working tree cannot change (or break) during a run."""
    commit = subprocess.run(
        ["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return {"rev": rev, "commit": commit, "path": str(dest)}


def tree_env(tree: dict[str, str]) -> dict[str, str]:
    """A gateway's environment that imports hardcap_core from ``tree``. The gateway starts as
    ``python -c`` in the checkout, which puts the working directory (the checkout) first on
    sys.path, ahead of PYTHONPATH: PYTHONSAFEPATH=1 leaves it off. Checked in a child started
    the same way; :class:`SystemExit` if it would import another copy."""
    env = {"PYTHONPATH": f"{tree['path']}{os.pathsep}{ROOT}", "PYTHONSAFEPATH": "1"}
    code = "import hardcap_core; print(hardcap_core.__file__)"
    found = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    if not Path(found).is_relative_to(tree["path"]):
        raise SystemExit(f"a gateway from {tree['rev']} would import {found}")
    tree["hardcap_core_imported_from"] = found
    return env


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for package in CLIENT_PACKAGES:
        if package == "wrk":
            out[package] = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout
            out[package] = (out[package] or "").splitlines()[0] if out[package] else None
            continue
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    default = "wrk-profile.json" if ns.rounds == 0 else "wrk-overhead.json"
    out = ns.out or RESULTS / (default.replace(".json", "-quick.json") if ns.quick else default)
    result: dict[str, Any] = {
        "benchmark": "wrk_overhead",
        "command": "python -m bench wrk_overhead " + " ".join(argv or sys.argv[1:]),
        "complete": False,
        "machine": machine_info(),
        "versions": versions(),
        "parameters": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(ns).items()},
            "mock_pace_ms": 0,
            "gateway_processes": 1,
            "routes": ROUTES,
            "contended_share": CONTENDED,
        },
    }
    started = time.monotonic()
    plan = [
        (rnd, kind, t)
        for rnd in range(ns.rounds)
        for kind in KINDS
        for t in rotated(kind_targets(kind, ns.targets), rnd)
    ]
    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory(prefix="hardcap-wrk-")))
        vk = es.enter_context(LocalValkey())
        mock = stack.start_mock(tmp, pace_ms=0.0, seed=11)
        es.callback(mock.stop)
        mock_chat = f"{mock.url}/v1/chat/completions"
        pids = {"mock": mock.proc.pid, "valkey": vk.proc.pid if vk.proc else 0}
        targets: dict[str, Target] = {}
        if "direct" in ns.targets:
            targets["direct"] = Target(
                "direct", mock_chat, mock.proc.pid, "mock", "mock-small", None
            )
        trees: dict[str, dict[str, str] | None] = {"transport": None}
        if ns.gateway_tree:
            trees["transport"] = tree = export_tree(ns.gateway_tree, tmp / "gateway-tree")
            result["gateway_tree"] = tree
            ns.gateway_env = {**tree_env(tree), **ns.gateway_env}
        if ns.base_tree:
            trees["transport_base"] = base = export_tree(ns.base_tree, tmp / "base-tree")
            result["base_tree"] = base
        for name in ns.targets:
            if name in ("bare", *PROXIES, "transport_base"):
                kind = {"bare": "fixed", "transport_base": "transport"}.get(name, name)
                svc = start_bare(kind, mock_chat, tmp, trees.get(name), name)
                es.callback(svc.stop)
                pids[name] = svc.proc.pid
                targets[name] = Target(
                    name, f"{svc.url}/v1/chat/completions", svc.proc.pid, name, "mock-small", None
                )
        if "gateway" in ns.targets:
            gws = [gateway_target(es, "gateway", config(mock.url, vk.url), tmp, ns.gateway_env,
                                  ns, targets, pids)]  # fmt: skip
        if ns.base_tree:
            env = {**ns.gateway_env, **tree_env(base)}
            (tmp / "base").mkdir()
            gateway_target(es, "gateway_base", config(mock.url, vk.url), tmp / "base", env, ns,
                           targets, pids)  # fmt: skip
        bodies = write_bodies(tmp, ns.stream_tokens)
        result["warm"] = {
            n: warm(t, bodies, 3.0 if n == "gateway" else 1.0 if ns.quick else 2.0)
            for n, t in targets.items()
        }
        check_s = 1.0
        result["checks_before"] = {
            n: verify(t, bodies, ns.stream_tokens, check_s) for n, t in targets.items()
        }
        if "gateway" in targets:
            result["gateway_server"] = stack.server_in_use(gws[0])
            result["gateway_redis_parser"] = stack.parser_in_use(gws[0])
        rows: list[dict[str, Any]] = []
        bar = tqdm(total=len(plan) + 2 * ns.profile, unit="block")
        try:
            for rnd, kind, name in plan:
                bar.set_postfix_str(f"round {rnd} {kind} {name}")
                rows.append({"round": rnd, **block(kind, targets[name], bodies, pids, ns)})
                bar.update(1)
                result["blocks"] = rows
                result["summary"] = summarise(rows, ns.targets)  # a cut-short run keeps it
                write_json(out, result)
            result["summary"] = summarise(rows, ns.targets)
            result["checks_after"] = {
                n: verify(t, bodies, ns.stream_tokens, check_s) for n, t in targets.items()
            }
            for name, s in result["summary"].items():
                for when in ("checks_before", "checks_after"):
                    for shape, got in result[when][name].items():
                        for k, v in got["problems"].items():
                            key = f"{when}:{shape}:{k}"
                            s["problems"][key] = s["problems"].get(key, 0) + v
            if ns.profile:
                result["profiles"] = []
                for kind, svg in (
                    ("non_stream", "profile-gateway.svg"),
                    ("stream", "profile-gateway-stream.svg"),
                ):
                    bar.set_postfix_str(f"py-spy {kind}")
                    settle([targets["gateway"].pid, mock.proc.pid])
                    if ns.profile_format == "raw":
                        svg = svg.removesuffix(".svg") + ".txt"
                    svg_path = (ns.out.parent if ns.out else RESULTS) / svg
                    got = profile(kind, targets["gateway"], bodies, svg_path, ns)
                    result["profiles"].append(got)
                    bar.update(1)
        finally:
            bar.close()
            if "gateway" in targets:
                tail = gws[0].log.read_text(errors="replace").splitlines()[-60:]
                result["gateway_log_tail"] = tail
    result["complete"] = True
    result["seconds"] = round(time.monotonic() - started, 1)
    write_json(out, result)
    print_table(result, out)
    if ns.plot and ns.rounds:
        plot(result, out.with_suffix(".png"))
    return 0


def rotated(items: list[str], n: int) -> list[str]:
    k = n % len(items) if items else 0
    return items[k:] + items[:k]


if __name__ == "__main__":
    sys.exit(main())
