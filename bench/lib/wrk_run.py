"""wrk (a C load generator) as the benchmarks drive it: one run with a Lua script from bench/wrk/,
its figures read back from the JSON line the script prints, the errors it saw, and the CPU it and
the rest of the machine used meanwhile (wrk takes CPU on a 2-core box too).

:func:`run_wrk` POSTs one body at fixed connections for a while (bench/wrk/post.lua): wrk counts
socket errors and statuses > 399 but reads no body. :func:`verify` reads and checks every
response for a while (bench/wrk/check.lua: status, usage, [DONE], SSE events).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.machine import CpuWatch, process_cpu_seconds

WRK_DIR = Path(__file__).resolve().parents[1] / "wrk"
QUIET, QUIET_WAIT_S = 0.10, 10.0  # before a block: wait up to 10 s for others to take < 10 %


@dataclass
class Target:
    name: str
    url: str  # the chat completions URL
    pid: int
    proc_name: str  # the key of its process in the CPU figures
    model: str
    key: str | None


def _children_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wrk_command(
    target: Target, body: Path, connections: int, threads: int, seconds: float, check: bool
) -> tuple[list[str], dict[str, str]]:
    script = WRK_DIR / ("check.lua" if check else "post.lua")
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--latency"]
    cmd += ["--timeout", "10s", "-s", str(script), target.url]
    return cmd, {**os.environ, "WRK_BODY": str(body), "WRK_KEY": target.key or ""}


def parse_wrk(stdout: str, stderr: str, returncode: int) -> dict[str, Any]:
    for line in stdout.splitlines():
        if line.startswith("WRK_JSON "):
            result: dict[str, Any] = json.loads(line[len("WRK_JSON ") :])
            result["returncode"] = returncode
            return result
    return {"returncode": returncode, "failed": (stdout + stderr)[-2000:], "requests": 0}


def run_wrk(
    target: Target,
    body: Path,
    *,
    connections: int,
    threads: int,
    seconds: float,
    check: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One wrk run; ``check`` (WRK_EXPECT_TOKENS, WRK_STREAM) reads every response."""
    cmd, env = wrk_command(target, body, connections, threads, seconds, check is not None)
    env.update(check or {})
    before = _children_cpu_seconds()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds + 60)
    result = parse_wrk(proc.stdout, proc.stderr, proc.returncode)
    result["wrk_cpu_seconds"] = round(_children_cpu_seconds() - before, 3)
    return result


def problems(res: dict[str, Any]) -> dict[str, int]:
    """Every error wrk or check.lua saw in a block (empty: a clean block)."""
    found = {k: v for k, v in (res.get("errors") or {}).items() if v}
    check = res.get("check") or {}
    for k in ("bad_status", "bad_tokens", "no_done"):
        if check.get(k):
            found[f"check_{k}"] = check[k]
    if res.get("returncode") or "failed" in res:
        found["wrk_failed"] = 1
    return found


def verify(
    target: Target, bodies: dict[tuple[str, str], Path], tokens: int, seconds: float
) -> dict[str, Any]:
    """Every response read and checked (bench/wrk/check.lua) for a while at one connection,
    non-streamed and streamed: status, completion_tokens, [DONE] and the SSE event count.
    Measured blocks do not read bodies (that costs wrk CPU a 2-core box cannot spare); they
    count wrk's non-2xx and socket errors only."""
    out = {}
    shapes = [("non_stream", 1)] + ([] if target.name == "bare" else [("stream", tokens)])
    for shape, expect in shapes:
        check = {"WRK_EXPECT_TOKENS": str(expect), "WRK_STREAM": "1" if shape == "stream" else "0"}
        body = bodies[(target.model, shape)]
        res = run_wrk(target, body, connections=1, threads=1, seconds=seconds, check=check)
        out[shape] = {"requests": res.get("requests"), "check": res.get("check")}
        out[shape]["problems"] = problems(res)
    return out


def settle(pids: list[int], timeout_s: float = 20.0) -> float:
    """Wait until the processes are idle (under 3 % of a core over 0.2 s)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        before = sum(process_cpu_seconds(p) for p in pids)
        time.sleep(0.2)
        if sum(process_cpu_seconds(p) for p in pids) - before < 0.006:
            break
    return round(time.monotonic() - started, 2)


def wait_quiet(pids: dict[str, int], timeout_s: float = QUIET_WAIT_S) -> float:
    """Wait (up to ``timeout_s``) until other processes take under QUIET of the machine over
    half a second: tests others run on this machine come and go."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        watch = CpuWatch(pids).start()
        time.sleep(0.5)
        if (watch.stop()["other_share"] or 0.0) <= QUIET:
            break
    return round(time.monotonic() - started, 1)


def steal_seconds() -> float:
    """CPU seconds the hypervisor gave other guests while this VM wanted to run (/proc/stat):
    it slows every process here without showing in their CPU times, so a block records it."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    return int(fields[7]) / os.sysconf("SC_CLK_TCK") if len(fields) > 7 else 0.0


def irq_seconds() -> float:
    """CPU seconds the machine spent in hard and soft interrupts since boot (/proc/stat)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    return (int(fields[5]) + int(fields[6])) / os.sysconf("SC_CLK_TCK")


def fold_wrk_cpu(cpu: dict[str, Any], wrk_seconds: float, irq_seconds: float) -> dict[str, Any]:
    """CpuWatch counts wrk (a child that exited during the block) as another process, and
    the kernel's interrupt time too; most of that is our own loopback traffic (softirq), so
    ``other_share`` here leaves both out (``other_share_with_irq`` keeps the interrupts)."""
    cpu["cpu_seconds"]["wrk"] = round(wrk_seconds, 3)
    cpu["irq_softirq_seconds"] = round(irq_seconds, 2)
    capacity = cpu["wall_seconds"] * (os.cpu_count() or 1)
    if cpu["other_processes_seconds"] is not None and capacity > 0:  # 0: wrk failed at once
        other = max(cpu["other_processes_seconds"] - wrk_seconds, 0.0)
        cpu["other_share_with_irq"] = round(other / capacity, 3)
        other = round(max(other - irq_seconds, 0.0), 2)
        cpu["other_processes_seconds"] = other
        cpu["other_share"] = round(other / capacity, 3)
    return cpu
