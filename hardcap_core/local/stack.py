"""Processes for tests and benchmarks: ``hardcap serve`` gateways and the ``hardcap mock``
upstream, one OS process each on a free 127.0.0.1 port, each logging to a file.

The local stand-in for separate Lambda execution environments. Who starts them chooses how:
``command`` is the argv that runs the ``hardcap`` command line (benchmarks start it through a
bootstrap of their own), ``env`` is added to this process's environment. Not shipped to Lambda
(the artifact leaves ``hardcap_core/local/`` out).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from hardcap_core.local.valkey import free_port

# `python -m hardcap_core.local.cli`: the interpreter running this, whether or not a `hardcap`
# script is on PATH.
HARDCAP = (sys.executable, "-m", "hardcap_core.local.cli")


@dataclass
class Service:
    """One server process: its ``url`` (http://127.0.0.1:<port>) and the file it logs to."""

    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM, as a process manager stops it; SIGKILL if it is not gone within
        ``timeout_s``. Returns the exit status (negative: killed by that signal)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """Until ``url`` answers 200; raises if ``proc`` exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up within {timeout_s} s")


def launch(
    name: str,
    args: Sequence[str],
    port: int,
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Service:
    """Start ``args`` (a server that will listen on ``port``) and wait for its /healthz."""
    with log.open("wb") as handle:  # the child has its own descriptor
        proc = subprocess.Popen(
            list(args),
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
    service = Service(name, proc, f"http://127.0.0.1:{port}", log)
    try:
        wait_http(f"{service.url}/healthz", proc)
    except BaseException:
        service.stop()
        raise
    return service


def start_gateway(
    config: Path,
    log_dir: Path,
    *,
    command: Sequence[str] = HARDCAP,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    rollup: bool = False,
    options: Sequence[str] = (),
) -> Service:
    """One ``hardcap serve -c config`` process; its log is ``log_dir/gateway-<port>.log``.

    Without ``rollup`` it runs ``--no-rollup``: a gateway alone, as on Lambda, where the rollup
    is a function of its own; several gateways and a benchmark's load share no rollup work.
    With it, the gateway runs the rollup on a timer against the usage table ``env`` (or this
    environment) names, or against an embedded DynamoDB it starts. ``options`` go on
    ``serve``'s command line (``--rollup-interval``, ...)."""
    port = free_port()
    args = [*command, "serve", "-c", str(config), "--port", str(port), *options]
    if not rollup:
        args.append("--no-rollup")
    return launch("gateway", args, port, log_dir / f"gateway-{port}.log", env=env, cwd=cwd)


def start_mock(
    log_dir: Path,
    options: Sequence[str] = (),
    *,
    command: Sequence[str] = HARDCAP,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Service:
    """``hardcap mock`` with ``options`` (``--pace-ms``, ``--seed``, ...) in its own process,
    so it shares no GIL with the load; its log is ``log_dir/mock-<port>.log``."""
    port = free_port()
    args = [*command, "mock", "--port", str(port), *options]
    return launch("mock", args, port, log_dir / f"mock-{port}.log", env=env, cwd=cwd)


@contextmanager
def gateways(
    data: Mapping[str, Any],
    count: int,
    log_dir: Path,
    *,
    command: Sequence[str] = HARDCAP,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[list[Service]]:
    """``count`` gateway processes serving the config ``data`` (written to
    ``log_dir/config.yaml``); stopped on exit, also when one fails to start."""
    path = log_dir / "config.yaml"
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    with ExitStack() as stack:
        started = []
        for _ in range(count):
            service = start_gateway(path, log_dir, command=command, env=env, cwd=cwd)
            stack.callback(service.stop)
            started.append(service)
        yield started
