"""Starving the gateways of CPU on purpose, for the overshoot benchmark's "also on a starved
machine" cells.

Two ways, either or both:

* :class:`Hogs`: ``count`` busy-loop processes at normal priority (nice 0, like the gateways;
  the mock keeps its raised priority, as a provider on its own hardware would), running for a
  cell. Their pids join the cell's CPU meter, so their load is *ours* and a batch is not run
  again as contended.
* :func:`gateway_quota`: every gateway process in one cgroup with a CPU quota
  (:mod:`bench.lib.cgroup_cpu`, the mechanism bench/cost/lambda_cost.py uses; needs root): ``share``
  cores between them.

The earlier starved results (bench/results/overshoot-starved*.json, commit 98a1778) used
neither: they packed 16 tenants x 8 streams into one batch (``--tenants 16 --runs 1
--max-streams 128``) so that the benchmark's own load kept the 2 cores 87-90 % busy. That
needs no code; these options add load that does not depend on the traffic.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.lib import cgroup_cpu

HOG = "while True: pass"


class Hogs:
    """``count`` busy-loop processes while the context is open."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Hogs:
        for _ in range(self.count):
            self.procs.append(subprocess.Popen([sys.executable, "-c", HOG]))
        return self

    def pids(self) -> dict[str, int]:
        return {f"cpu-hog-{i}": p.pid for i, p in enumerate(self.procs)}

    def __exit__(self, *_: object) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


@contextmanager
def gateway_quota(pids: list[int], share: float, period_us: int = 100_000) -> Iterator[Quota]:
    """The gateways ``pids`` in one cgroup limited to ``share`` cores while open."""
    if not cgroup_cpu.is_root():
        raise SystemExit("--gateway-cpu needs root (a cgroup CPU quota)")
    cgroup_cpu.remove_stale()
    group = cgroup_cpu.CpuQuota("overshoot-gateways", round(share * period_us), period_us)
    group.create()
    try:
        for pid in pids:
            group.add(pid)
        yield Quota(group)
    finally:
        group.remove()


class Quota:
    """The gateways' cgroup: its settings, and throttling between :meth:`mark` calls."""

    def __init__(self, group: cgroup_cpu.CpuQuota) -> None:
        self.group = group
        self._last = group.stat()

    def settings(self) -> dict[str, Any]:
        return {**self.group.settings(), "members": self.group.members()}

    def mark(self) -> dict[str, int]:
        """Periods and throttling since the last mark (per cell)."""
        now = self.group.stat()
        delta = cgroup_cpu.stat_delta(self._last, now)
        self._last = now
        return delta
