"""One cold start of each Lambda entry point: start a fresh process, time it to its first
served response (see :mod:`bench.coldstart.coldstart`, which runs and summarizes them)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from hardcap_core.local.servers import ThreadServer
from hardcap_core.local.valkey import LocalValkey, free_port

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "functions" / "gateway"
CHAT_EVENT = ROOT / "events" / "function-url-chat.json"


# The Mangum entry's child process: init (import the handler module), then one invocation.
MANGUM_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import buffered
t1 = time.perf_counter()
class Context:
    aws_request_id = "bench"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:bench"
    def get_remaining_time_in_millis(self):
        return 300000
event = json.load(open(sys.argv[1]))
response = buffered.handler(event, Context())
t2 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "invoke_ms": (t2 - t1) * 1e3,
                  "status": response["statusCode"]}), flush=True)
"""


@dataclass
class Target:
    """What runs: an interpreter, the code's location, and environment tweaks."""

    name: str
    python: str
    task_root: Path  # run.sh's LAMBDA_TASK_ROOT; the Mangum child's working directory
    env: dict[str, str] = field(default_factory=dict)

    def environ(self, base: dict[str, str]) -> dict[str, str]:
        path = f"{Path(self.python).parent}{os.pathsep}{os.environ['PATH']}"
        return {
            **os.environ,
            **base,
            **self.env,
            "PATH": path,
            "LAMBDA_TASK_ROOT": str(self.task_root),
        }


@dataclass
class Stack:
    """The budget server, the mock upstream, and the config pointing at them."""

    valkey: LocalValkey
    mock: ThreadServer
    config: Path

    def env(self) -> dict[str, str]:
        return {
            "HARDCAP_CONFIG": str(self.config),
            "HARDCAP_REDIS_URL": self.valkey.url,
            "HARDCAP_REDIS_CLUSTER": "false",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
        }

    def flush(self) -> None:
        # Data only: the server keeps its script cache, as a shared cache would for a new
        # execution environment.
        with redis.Redis.from_url(self.valkey.url) as r:
            r.flushall()


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def run_uvicorn(
    target: Target, stack: Stack, *, profile: bool = False, script: Path = GATEWAY / "run.sh"
) -> dict[str, Any]:
    """One cold start of run.sh (or ``script``): ready (healthz answers), then the first
    completion."""
    event = json.loads(CHAT_EVENT.read_text())
    port = free_port()
    env = target.environ({**stack.env(), "AWS_LWA_PORT": str(port)})
    if profile:
        env["PYTHONPROFILEIMPORTTIME"] = "1"
    url = f"http://127.0.0.1:{port}"
    # stderr to a file, not a pipe: import-time output must never block the measured process.
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [str(script)],
            env=env,
            cwd=target.task_root,
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
        try:
            ready, done = _first_response(proc, url, event)
        except RuntimeError as e:  # say why: the child's last words
            errors.seek(0)
            tail = errors.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"{e}; its stderr ends:\n{tail}") from None
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            errors.seek(0)
            err = errors.read().decode(errors="replace")
    sample: dict[str, Any] = {
        "ready_ms": ms(ready - started),
        "first_request_ms": ms(done - ready),
        "first_response_ms": ms(done - started),
    }
    if profile:
        sample["importtime"] = err
    return sample


def _first_response(
    proc: subprocess.Popen[bytes], url: str, event: dict[str, Any]
) -> tuple[float, float]:
    """(when /healthz first answered, when the first completion was read), perf_counter."""
    with httpx.Client(timeout=30) as client:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"run.sh exited with {proc.returncode}")
            try:
                if client.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.01)  # the Lambda Web Adapter polls every 10 ms
        ready = time.perf_counter()
        response = client.post(
            f"{url}{event['rawPath']}",
            content=event["body"],
            headers={k: v for k, v in event["headers"].items() if k != "host"},
        )
        done = time.perf_counter()
    if response.status_code != 200:
        raise RuntimeError(f"first request: {response.status_code} {response.text}")
    return ready, done


def run_mangum(target: Target, stack: Stack, *, profile: bool = False) -> dict[str, Any]:
    """One cold start of the buffered handler: init, then the first invocation."""
    handler_dir = target.task_root if (target.task_root / "buffered.py").is_file() else GATEWAY
    env = target.environ(stack.env())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(handler_dir), env.get("PYTHONPATH")) if p)
    if profile:
        env["PYTHONPROFILEIMPORTTIME"] = "1"
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [target.python, "-c", MANGUM_CHILD, str(CHAT_EVENT)],
            env=env,
            cwd=handler_dir,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        assert proc.stdout is not None
        # The child prints as soon as its invocation returns; its exit is not part of the start.
        # Lines before it are the app's own stdout (the per-request EMF metrics line).
        line = ""
        for out in proc.stdout:
            if out.startswith('{"import_ms"'):
                line = out
                break
        done = time.perf_counter()
        proc.communicate(timeout=120)
        errors.seek(0)
        err = errors.read().decode(errors="replace")
    if proc.returncode != 0 or not line:
        raise RuntimeError(f"mangum child failed:\n{err[-3000:]}")
    child = json.loads(line)
    if child["status"] != 200:
        raise RuntimeError(f"first invocation answered {child['status']}")
    sample: dict[str, Any] = {
        "init_ms": round(child["import_ms"], 2),
        "first_invoke_ms": round(child["invoke_ms"], 2),
        "first_response_ms": ms(done - started),
    }
    if profile:
        sample["importtime"] = err
    return sample


def import_breakdown(stderr: str, top: int = 15) -> dict[str, Any]:
    """``-X importtime`` output summed per top-level package (self time, so nothing counts
    twice), largest first."""
    per_package: dict[str, int] = {}
    total = 0
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if not m:
            continue
        self_us, name = int(m.group(1)), m.group(4)
        root = name.split(".")[0]
        per_package[root] = per_package.get(root, 0) + self_us
        total += self_us
    ranked = sorted(per_package.items(), key=lambda kv: -kv[1])
    return {
        "total_ms": ms(total / 1e6),
        "modules": len(per_package),
        "by_package_ms": {k: ms(v / 1e6) for k, v in ranked[:top]},
    }
