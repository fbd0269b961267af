"""Cold start of the gateway's two Lambda entry points, measured locally.

For each entry, each run starts a new process and times it to its first served response:

* ``uvicorn`` — ``functions/gateway/run.sh``, as the Lambda Web Adapter starts it: readiness
  (GET /healthz answering, polled every 10 ms like the adapter) and then a first chat completion.
* ``mangum`` — a process that imports ``buffered`` (the handler module, as Lambda's init phase
  does) and invokes ``handler`` with ``events/function-url-chat.json``.

The first request includes what the app builds lazily: the budget server connection, the Lua
scripts, the upstream HTTP client. A budget server (LocalValkey) and the mock upstream run in
this process. One extra run per entry with ``PYTHONPROFILEIMPORTTIME=1`` (``python -X
importtime``) attributes import time to top-level packages.

Targets: the source tree with this interpreter (default), and with ``--artifact DIR --python
PY`` a built artifact (``LAMBDA_ARCH=x86_64 sam build`` on an x86_64 machine) under CPython 3.13
with /var/task's read-only bytecode rule (PYTHONDONTWRITEBYTECODE), both with the bytecode the
build shipped and with none (``--targets`` picks among them). ``--base-artifact DIR`` adds a
second artifact (targets ``artifact-base``, ``artifact-base-no-bytecode``): a change measured
against its base in the same run. The page cache is warm: Lambda also reads code from a local
disk.

``--servers asyncio-h11,uvloop-httptools`` measures the uvicorn entry once per event loop and
HTTP parser: run.sh is copied with its ``--loop`` and ``--http`` options replaced, everything
else as shipped. Entries and targets take turns run by run, the first of each round rotating,
so a burst of other work on the machine hits them alike.

    python -m bench coldstart --runs 10
    python -m bench coldstart --artifact .aws-sam/build/GatewayFunction \\
        --python ~/.pyenv/versions/3.13.0/bin/python3.13 --plot /tmp/coldstart.png
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm  # type: ignore[import-untyped]

from bench.coldstart.coldstart_runs import Stack, Target, import_breakdown, run_mangum, run_uvicorn
from bench.lib.machine import machine_info
from hardcap_core.config.loader import write_validated
from hardcap_core.local.mock_upstream import MockSettings, create_mock_app
from hardcap_core.local.servers import ThreadServer
from hardcap_core.local.valkey import LocalValkey, free_port

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "functions" / "gateway"
CHAT_EVENT = ROOT / "events" / "function-url-chat.json"
PACKAGES = (
    "pydantic",
    "pydantic-core",
    "starlette",
    "uvicorn",
    "httpx",
    "redis",
    "hiredis",
    "pyyaml",
    "aws-lambda-powertools",
    "mangum",
    "anyio",
    "h11",
)


def interpreter(name: str) -> str:
    """The real executable ``name`` runs here (a pyenv shim resolved with this environment,
    e.g. PYENV_VERSION), so the children, whose environment is their own, start that one and
    the stored command can say just ``python3.13``."""
    out = subprocess.run(
        [name, "-c", "import sys; print(sys.executable)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def summarize(samples: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    keys = [k for k, v in samples[0].items() if isinstance(v, float)]
    out = {}
    for k in keys:
        values = sorted(s[k] for s in samples)
        p90 = values[min(len(values) - 1, round(0.9 * (len(values) - 1)))]
        out[k] = {
            "median": round(statistics.median(values), 2),
            "p90": p90,
            "min": values[0],
            "max": values[-1],
        }
    return out


def progress(total: int) -> Any:
    return tqdm(total=total, unit="run", desc="cold starts")


def interpreter_info(target: Target) -> dict[str, Any]:
    """Python version and package versions as the target's interpreter sees them."""
    code = (
        "import json, sys, importlib.metadata as m\n"
        f"names = {list(PACKAGES)!r}\n"
        "def v(n):\n"
        "    try: return m.version(n)\n"
        "    except m.PackageNotFoundError: return None\n"
        "print(json.dumps({'python': sys.version, 'implementation': sys.implementation.name,"
        " 'packages': {n: v(n) for n in names}}))"
    )
    env = target.environ({})
    env["PYTHONPATH"] = os.pathsep.join(
        p
        for p in (str(target.task_root), env.get("PYTHONPATH"))
        if p and target.name.startswith("artifact")
    )
    out = subprocess.run(
        [target.python, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    info: dict[str, Any] = json.loads(out.stdout)
    return info


@contextmanager
def local_stack() -> Iterator[Stack]:
    """Valkey and the mock upstream on loopback, and the demo config rewired to them."""
    with LocalValkey() as valkey, tempfile.TemporaryDirectory(prefix="coldstart-") as tmp:
        mock = ThreadServer(create_mock_app(MockSettings(pace_ms=0.0, seed=1)), free_port())
        mock.start()
        try:
            config = yaml.safe_load((ROOT / "hardcap_core" / "local" / "demo.yaml").read_text())
            config["upstreams"][0]["base_url"] = f"{mock.url}/v1"
            path = Path(tmp) / "config.yaml"
            path.write_text(yaml.safe_dump(config))
            # As infra/Makefile ships it: the validated copy beside the YAML.
            write_validated(path)
            yield Stack(valkey, mock, path)
        finally:
            mock.stop()


def targets(args: argparse.Namespace, scratch: Path) -> list[Target]:
    """The targets ``--targets`` names (tree, artifact, artifact-no-bytecode; default: all)."""
    found = _all_targets(args, scratch)
    wanted = set(args.targets.split(",")) if args.targets else None
    chosen = [t for t in found if wanted is None or re.sub(r"-py[\d.]+", "", t.name) in wanted]
    if not chosen:
        raise SystemExit(f"--targets {args.targets}: none of {[t.name for t in found]}")
    return chosen


def _all_targets(args: argparse.Namespace, scratch: Path) -> list[Target]:
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    # The repository's hardcap_core, whether or not this environment has it installed.
    found = [Target(f"tree-py{version}", sys.executable, GATEWAY, {"PYTHONPATH": str(ROOT)})]
    artifacts = [("artifact", args.artifact), ("artifact-base", args.base_artifact)]
    for name, folder in artifacts:
        if not folder:
            continue
        artifact = Path(folder).resolve()
        python = interpreter(args.python or "python3.13")
        # /var/task is read-only: only bytecode shipped in the artifact can be used.
        readonly = {"PYTHONDONTWRITEBYTECODE": "1"}
        found.append(Target(f"{name}-py3.13", python, artifact, readonly))
        # Bytecode looked for under an empty prefix: as if the build had shipped none.
        empty = scratch / f"no-pycache-{name}"
        empty.mkdir()
        found.append(
            Target(
                f"{name}-py3.13-no-bytecode",
                python,
                artifact,
                {**readonly, "PYTHONPYCACHEPREFIX": str(empty)},
            )
        )
    return found


ENTRIES: dict[str, Callable[..., dict[str, Any]]] = {"uvicorn": run_uvicorn, "mangum": run_mangum}
# uvicorn's --loop and --http choices a variant can name, as "<loop>-<http>".
LOOPS, PARSERS = ("asyncio", "uvloop"), ("h11", "httptools")
SERVER_OPTION = re.compile(r"--(loop|http) \S+")


def shipped_server(script: Path = GATEWAY / "run.sh") -> str:
    """The ``<loop>-<http>`` run.sh starts uvicorn with."""
    found = dict(m.group(0).split() for m in SERVER_OPTION.finditer(script.read_text()))
    return f"{found['--loop']}-{found['--http']}"


def server_script(variant: str, scratch: Path) -> Path:
    """A copy of run.sh whose uvicorn uses the loop and HTTP parser of ``variant``."""
    loop, _, http = variant.partition("-")
    if loop not in LOOPS or http not in PARSERS:
        raise SystemExit(f"--servers: {variant!r} is not <{'|'.join(LOOPS)}>-<{'|'.join(PARSERS)}>")
    text = (GATEWAY / "run.sh").read_text()
    if len(SERVER_OPTION.findall(text)) != 2:
        raise SystemExit("run.sh: expected one --loop and one --http option to replace")
    text = SERVER_OPTION.sub(
        lambda m: f"--{m.group(1)} {loop if m.group(1) == 'loop' else http}", text
    )
    path = scratch / f"run-{variant}.sh"
    path.write_text(text)
    path.chmod(0o755)
    return path


def entries(args: argparse.Namespace, scratch: Path) -> dict[str, Callable[..., dict[str, Any]]]:
    """The entries to measure: ``uvicorn`` (or one ``uvicorn:<loop>-<http>`` per server variant),
    ``mangum``."""
    chosen: dict[str, Callable[..., dict[str, Any]]] = {}
    for name in args.entries.split(","):
        if name == "uvicorn" and args.servers:
            for variant in args.servers.split(","):
                script = server_script(variant, scratch)
                chosen[f"uvicorn:{variant}"] = functools.partial(run_uvicorn, script=script)
        else:
            chosen[name] = ENTRIES[name]
    return chosen


def measure(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with local_stack() as stack, tempfile.TemporaryDirectory() as scratch:
        chosen = targets(args, Path(scratch))
        runs = entries(args, Path(scratch))
        bar = progress(len(chosen) * len(runs) * (args.runs + 1))
        try:
            samples: dict[tuple[str, str], list[dict[str, Any]]] = {
                (t.name, e): [] for t in chosen for e in runs
            }
            # Targets and entries take turns, run by run, and who goes first rotates: load from
            # elsewhere, and whatever one start leaves behind for the next, fall on all alike.
            order = [(t, e, r) for t in chosen for e, r in runs.items()]
            for i in range(args.runs):
                shift = i % len(order)
                for target, entry, run in order[shift:] + order[:shift]:
                    bar.set_postfix_str(f"{target.name} {entry}")
                    stack.flush()
                    samples[(target.name, entry)].append(run(target, stack))
                    bar.update(1)
            for target in chosen:
                entry_results: dict[str, Any] = {}
                for entry, run in runs.items():
                    stack.flush()
                    profiled = run(target, stack, profile=True)
                    bar.update(1)
                    entry_results[entry] = {
                        "summary": summarize(samples[(target.name, entry)]),
                        "samples": samples[(target.name, entry)],
                        "imports": import_breakdown(profiled.pop("importtime")),
                    }
                results[target.name] = {
                    "python": target.python,
                    "task_root": str(target.task_root),
                    "env": target.env,
                    "interpreter": interpreter_info(target),
                    "entries": entry_results,
                }
        finally:
            bar.close()
    return results


def plot(data: dict[str, Any], path: Path) -> None:
    """Median time to first response per target and entry, split into start and first call."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, starts, firsts = [], [], []
    for name, target in data["targets"].items():
        for entry, result in target["entries"].items():
            s = result["summary"]
            start = s["ready_ms" if entry.startswith("uvicorn") else "init_ms"]["median"]
            labels.append(f"{name}\n{entry}")
            starts.append(start)
            firsts.append(s["first_response_ms"]["median"] - start)
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(labels) + 1.5))
    ax.barh(labels, starts, label="start (ready / init)")
    ax.barh(labels, firsts, left=starts, label="first request")
    ax.set_xlabel("ms, median")
    ax.set_title(f"Cold start to first response ({data['machine']['cpu_model']})")
    ax.invert_yaxis()
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv: Iterable[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=10, help="cold starts per entry and target")
    parser.add_argument("--quick", action="store_true", help="3 runs: a smoke test")
    parser.add_argument("--artifact", help="a built artifact folder to measure as well")
    parser.add_argument("--base-artifact", help="a second artifact (its base), same run")
    parser.add_argument("--python", help="CPython 3.13 for the artifact (default python3.13)")
    parser.add_argument(
        "--targets",
        help="comma-separated: tree, artifact, artifact-no-bytecode, artifact-base, "
        "artifact-base-no-bytecode (default: all)",
    )
    parser.add_argument(
        "--entries", default="uvicorn,mangum", help="comma-separated: uvicorn, mangum"
    )
    parser.add_argument(
        "--servers",
        help="uvicorn entry once per <loop>-<http>, e.g. asyncio-h11,uvloop-httptools "
        "(default: as run.sh has it)",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "coldstart.json"))
    parser.add_argument("--plot", help="also draw the medians into this PNG (matplotlib)")
    args = parser.parse_args(None if argv is None else list(argv))
    if args.quick:
        args.runs = 3
    return args


def main(argv: Iterable[str] | None = None) -> int:
    args = parse_args(argv)
    data: dict[str, Any] = {
        "bench": "coldstart",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "bench", "coldstart", *sys.argv[1:]]),
        "parameters": {
            "runs": args.runs,
            "artifact": args.artifact,
            "base_artifact": args.base_artifact,
            "python": args.python,
            "event": CHAT_EVENT.relative_to(ROOT).as_posix(),
            "targets": args.targets,
            "entries": args.entries,
            "servers": args.servers,
            "run_sh_server": shipped_server(),
        },
        "machine": machine_info(),
    }
    # Other work on the machine slows every number: keep the load next to them.
    data["load_average_before"] = list(os.getloadavg())
    data["targets"] = measure(args)
    data["load_average_after"] = list(os.getloadavg())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    for name, target in data["targets"].items():
        for entry, result in target["entries"].items():
            first = result["summary"]["first_response_ms"]
            print(
                f"{name:30} {entry:26} first response: median {first['median']:8.1f} ms, "
                f"p90 {first['p90']:8.1f} ms; imports {result['imports']['total_ms']} ms"
            )
    print(f"wrote {out}")
    if args.plot:
        plot(data, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
