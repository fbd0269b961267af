"""A CPU-quota cgroup for one process: Lambda's CPU share (memory / 1,769 MB of one vCPU)
emulated with the kernel's CFS bandwidth control.

cgroup v2 (``cpu.max = "<quota> <period>"``) where the v2 hierarchy has the cpu controller;
otherwise cgroup v1's cpu controller (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), the same
mechanism (on a hybrid mount such as this VM's the cpu controller is bound to v1 and the v2
hierarchy at /sys/fs/cgroup/unified has no cpu controller). Needs root. A group is named
``hardcap-bench-<label>``; :func:`remove_stale` deletes groups a killed run left behind.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

PREFIX = "hardcap-bench-"
V2_CANDIDATES = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
V1_CANDIDATES = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct"))


def _v2_root() -> Path | None:
    for root in V2_CANDIDATES:
        controllers = root / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return root
    return None


def _v1_root() -> Path | None:
    for root in V1_CANDIDATES:
        if (root / "cpu.cfs_quota_us").exists():
            return root
    return None


def backend() -> tuple[str, Path] | None:
    """("v2" | "v1", the hierarchy's root) for the cpu controller; None if there is none."""
    root = _v2_root()
    if root is not None:
        return "v2", root
    root = _v1_root()
    if root is not None:
        return "v1", root
    return None


class CpuQuota:
    """``quota_us`` of CPU time per ``period_us`` for the processes put in it."""

    def __init__(self, label: str, quota_us: int, period_us: int) -> None:
        found = backend()
        if found is None:
            raise RuntimeError("no cgroup cpu controller found (v2 cpu.max or v1 cfs quota)")
        self.version, self.root = found
        self.path = self.root / f"{PREFIX}{label}"
        self.quota_us, self.period_us = quota_us, period_us

    def create(self) -> CpuQuota:
        if self.version == "v2":
            control = self.root / "cgroup.subtree_control"
            if "cpu" not in control.read_text().split():
                control.write_text("+cpu")
        self.path.mkdir(exist_ok=True)
        if self.version == "v2":
            (self.path / "cpu.max").write_text(f"{self.quota_us} {self.period_us}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(self.period_us))
            (self.path / "cpu.cfs_quota_us").write_text(str(self.quota_us))
        return self

    def settings(self) -> dict[str, Any]:
        """What the kernel reports back, for the record."""
        if self.version == "v2":
            written = {"cpu.max": (self.path / "cpu.max").read_text().strip()}
        else:
            written = {
                "cpu.cfs_quota_us": (self.path / "cpu.cfs_quota_us").read_text().strip(),
                "cpu.cfs_period_us": (self.path / "cpu.cfs_period_us").read_text().strip(),
            }
        return {
            "cgroup_version": self.version,
            "path": str(self.path),
            "quota_us": self.quota_us,
            "period_us": self.period_us,
            "cpu_share": round(self.quota_us / self.period_us, 4),
            "kernel_reports": written,
        }

    def add(self, pid: int) -> None:
        """Move ``pid`` and all its threads into the group."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def members(self) -> list[int]:
        return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]

    def stat(self) -> dict[str, int]:
        """Periods, throttled periods and time throttled (µs) so far."""
        raw = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        throttled = (
            int(raw.get("throttled_usec", 0))
            if self.version == "v2"
            else int(raw.get("throttled_time", 0)) // 1000  # v1 reports ns
        )
        return {
            "nr_periods": int(raw.get("nr_periods", 0)),
            "nr_throttled": int(raw.get("nr_throttled", 0)),
            "throttled_us": throttled,
        }

    def remove(self) -> None:
        """Move what is left to the root group and delete the group."""
        if not self.path.exists():
            return
        for pid in self.members():
            with contextlib.suppress(OSError):
                (self.root / "cgroup.procs").write_text(str(pid))
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)  # a process just leaving
        self.path.rmdir()


def stat_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


def remove_stale() -> list[str]:
    """Delete ``hardcap-bench-*`` groups an earlier run left (their processes go to the root)."""
    found = backend()
    if found is None:
        return []
    version, root = found
    removed = []
    for path in sorted(root.glob(f"{PREFIX}*")):
        group = CpuQuota.__new__(CpuQuota)
        group.version, group.root, group.path = version, root, path
        group.quota_us = group.period_us = 0
        with contextlib.suppress(OSError):
            group.remove()
            removed.append(str(path))
    return removed


def is_root() -> bool:
    return os.geteuid() == 0
