"""The mock upstream in a process of its own (so it does not share the load generator's GIL),
paced and seeded, optionally at a raised CPU priority: for the end-to-end tests and the
benchmarks alike."""

from __future__ import annotations

import os
from pathlib import Path

from hardcap_core.local import stack as local_stack
from hardcap_core.local.stack import Service

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    """The mock runs from the checkout: the repository goes first on its path."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path}


def start_mock(
    tmp: Path,
    *,
    pace_ms: float,
    seed: int,
    median: int = 150,
    sigma: float = 1.0,
    nice: int = 0,
) -> Service:
    """``hardcap mock`` in its own process (so it does not share the load generator's GIL).

    ``nice`` < 0 raises its CPU priority (needs CAP_SYS_NICE; see :func:`set_nice`).
    """
    options = ["--pace-ms", str(pace_ms), "--seed", str(seed)]
    options += ["--median", str(median), "--sigma", str(sigma)]
    service = local_stack.start_mock(tmp, options, env=_env(), cwd=ROOT)
    if nice:
        set_nice(service.proc.pid, nice)
    return service


def set_nice(pid: int, nice: int) -> bool:
    """Set the scheduling priority of ``pid`` (-20 highest .. 19 lowest); False if not allowed.

    Raising a priority needs root or CAP_SYS_NICE; without it the process keeps the default
    and the caller records what it really got (:func:`get_nice`).
    """
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except PermissionError:
        print(f"bench: may not set nice {nice} for pid {pid}; it keeps its priority", flush=True)
        return False
    return True


def get_nice(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)
