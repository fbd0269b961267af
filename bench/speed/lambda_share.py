"""The figure a Lambda user sees: what the gateway adds to a request's latency (p50, p99) and
the CPU it spends per request, under the CPU share Lambda gives the template's default memory
size, with the cache 0.5 ms (one round trip) away.

Set-up, all on this machine, all torn down at the end (also on Ctrl-C, SIGTERM or an error):

* **the cache 0.5 ms away**: Valkey in a network namespace of its own (``hardcap-bench-cache``)
  behind a veth pair (10.254.24.1/30 here, 10.254.24.2 there: no route leaves the machine).
  The delay is ``tc netem`` on both ends of the pair when the kernel has it; this VM's kernel
  does not (``tc qdisc add ... netem`` answers "Error: Specified qdisc kind is unknown.", the
  exact error is kept in the result), so a userspace relay (`bench/lib/delay_relay.py`, a process of
  its own) forwards each chunk a fixed delay after it arrived, each way: a thread per
  direction reads, another writes on time (sleeps to within 150 µs, then spins: an event
  loop's timers have 1 ms resolution). The delay starts at half of ``--rtt-us`` (500) and is
  calibrated (the relay's own wake-ups and writes add ~40 µs a hop) until the median PING
  round trip through the relay is within 15 µs of it. The round trip the gateway really sees
  (PING through the relay, before and after the load) and how late the relay wrote each
  chunk are measured and recorded.
* **the Lambda CPU share**: ONE ``hardcap serve`` worker in a cgroup whose CPU quota is
  ``MemorySize / 1,769 MB`` of one vCPU (infra/template.yaml's default; bench/lib/cgroup_cpu.py),
  entered before Python starts; the mock upstream, Valkey, the relay and wrk stay outside it.
* **the load**: wrk at one connection (one request in flight, as one Lambda environment serves
  them), in blocks that alternate between the gateway and the direct call to the same mock in
  the same run: ``non_stream`` (1-token replies back to back), ``stream`` (``--stream-tokens``
  streams at mock pace 0, to the last byte, back to back) and ``non_stream_after_idle`` (each
  request ``--idle-ms`` after the previous answer: a quota refilled, as at an environment that
  is not busy). Added = the gateway's percentile minus the direct call's, per round; the
  summary gives medians over rounds. CPU per request: the gateway's threads' on-CPU time
  (/proc/<pid>/task/*/schedstat) over the block, minus its idle rate, per request.

    python -m bench lambda_share            # ~7 min (flock /tmp/hardcap-bench.lock in front
    python -m bench lambda_share --quick    # ~1 min  keeps other benchmarks off the machine)

Needs root (network namespaces, cgroups). Writes bench/results/lambda-share.json
(lambda-share-quick.json with --quick).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

from bench.cost.lambda_cost import ONE_VCPU_MB, ROUTE, start_in_group, warm_mock
from bench.cost.lambda_cost_ab import write_bodies
from bench.cost.lambda_cost_requests import TENANT, pct, thread_cpu_ns
from bench.lib import cgroup_cpu, stack
from bench.lib.delay_relay import SPIN_S
from bench.lib.machine import CpuWatch, machine_info, write_json
from bench.lib.wrk_run import (
    WRK_DIR,
    Target,
    fold_wrk_cpu,
    irq_seconds,
    parse_wrk,
    problems,
    run_wrk,
    settle,
    verify,
    wrk_command,
)
from bench.speed.wrk_overhead import export_tree, tree_env
from hardcap_core.local.valkey import find_server_binary, free_port

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
TEMPLATE = ROOT / "infra" / "template.yaml"
NETNS = "hardcap-bench-cache"
GROUP = "hardcap-share-lambda"
VETH_HOST, VETH_CACHE = "hcb-host", "hcb-cache"
HOST_IP, CACHE_IP, PREFIX_LEN = "10.254.24.1", "10.254.24.2", 30
CACHE_PORT = 6379
KINDS = ("non_stream", "stream", "non_stream_after_idle")
CALIBRATED_US = 15  # the relay's round trip within this of the target: calibrated


# --- pure parts -----------------------------------------------------------------------------


def template_memory_mb(text: str) -> int:
    """The gateway's default MemorySize: the ``MemorySize`` parameter's ``Default`` in
    infra/template.yaml (read as text: the template's ``!Ref`` tags are not plain YAML)."""
    match = re.search(r"^  MemorySize:\n(?:    .*\n)*?    Default: (\d+)\s*$", text, re.MULTILINE)
    if match is None:
        raise ValueError("no MemorySize parameter with a Default in the template")
    return int(match.group(1))


def cpu_quota_us(memory_mb: int, period_us: int) -> int:
    """Lambda's CPU share of ``memory_mb`` (1,769 MB is one vCPU) as a CFS quota per period;
    at least 1 ms, the kernel's minimum."""
    return max(1000, round(memory_mb / ONE_VCPU_MB * period_us))


def distribution_us(samples_s: list[float]) -> dict[str, Any]:
    """Count, p50, p90, p99, max and mean of ``samples_s`` (seconds) in µs."""
    if not samples_s:
        return {"count": 0}
    return {
        "count": len(samples_s),
        **{f"p{q}_us": round((pct(samples_s, q / 100) or 0.0) * 1e6, 1) for q in (50, 90, 99)},
        "max_us": round(max(samples_s) * 1e6, 1),
        "mean_us": round(statistics.fmean(samples_s) * 1e6, 1),
    }


def next_delay_us(delay_us: int, measured_rtt_us: float, target_rtt_us: int) -> int:
    """The relay's delay each way that brings a measured round trip to the target: the
    difference split over the two hops; never below zero."""
    return max(0, round(delay_us - (measured_rtt_us - target_rtt_us) / 2))


def median_or_none(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return round(statistics.median(got), 3) if got else None


def summarize(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind, medians over rounds: what the gateway adds over the direct call of the same
    round (p50, p99, mean), its CPU per request, and the errors any block saw."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        rounds = sorted({b["round"] for b in blocks if b["kind"] == kind})
        added: dict[str, list[float | None]] = {"p50": [], "p99": [], "mean": []}
        for rnd in rounds:
            pair = {b["target"]: b for b in blocks if b["kind"] == kind and b["round"] == rnd}
            if {"gateway", "direct"} <= pair.keys():
                for q in added:
                    g, d = pair["gateway"].get(f"{q}_ms"), pair["direct"].get(f"{q}_ms")
                    added[q].append(None if g is None or d is None else g - d)
        gw = [b for b in blocks if b["kind"] == kind and b["target"] == "gateway"]
        dr = [b for b in blocks if b["kind"] == kind and b["target"] == "direct"]
        if not gw:
            continue
        out[kind] = {
            "rounds": len(rounds),
            **{f"added_{q}_ms": median_or_none(v) for q, v in added.items()},
            "gateway_p50_ms": median_or_none([b.get("p50_ms") for b in gw]),
            "gateway_p99_ms": median_or_none([b.get("p99_ms") for b in gw]),
            "direct_p50_ms": median_or_none([b.get("p50_ms") for b in dr]),
            "direct_p99_ms": median_or_none([b.get("p99_ms") for b in dr]),
            "gateway_cpu_ms_per_request": median_or_none(
                [b.get("gateway_cpu_ms_per_request") for b in gw]
            ),
            "requests": sum(b["requests"] for b in gw),
            # Share of the machine other processes took during the gateway's blocks.
            "other_share_median": median_or_none(
                [b.get("machine_cpu", {}).get("other_share") for b in gw]
            ),
            "throttled_periods": sum(b["throttling"]["nr_throttled"] for b in gw),
            "problems": {
                f"{b['target']}@{b['round']}": b["problems"] for b in gw + dr if b["problems"]
            },
        }
    return out


# --- the relay (a process of its own: no GIL shared with the benchmark) ----------------------


def _ip(*args: str, netns: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", "netns", "exec", NETNS, *args] if netns else list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def _must(*args: str, netns: bool = False) -> None:
    done = _ip(*args, netns=netns)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")


def remove_stale_network() -> list[str]:
    """Delete the namespace and veth a killed run left behind."""
    removed = []
    if _ip("ip", "link", "show", VETH_HOST).returncode == 0:
        _ip("ip", "link", "del", VETH_HOST)
        removed.append(VETH_HOST)
    if NETNS in _ip("ip", "netns", "list").stdout.split():
        _ip("ip", "netns", "del", NETNS)
        removed.append(NETNS)
    return removed


def ping_rtts(host: str, port: int, count: int) -> list[float]:
    """Seconds per PING/PONG round trip, one at a time over one connection."""
    out = []
    with socket.create_connection((host, port), timeout=5) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            t0 = time.perf_counter()
            s.sendall(b"PING\r\n")
            got = b""
            while not got.endswith(b"\r\n"):
                piece = s.recv(64)
                if not piece:
                    raise ConnectionError("the cache closed the connection")
                got += piece
            out.append(time.perf_counter() - t0)
            if got != b"+PONG\r\n":
                raise ConnectionError(f"PING answered {got!r}")
    return out


class CacheAway:
    """Valkey in its own network namespace behind a veth pair, ``delay_us`` away each way
    (netem when the kernel has it, else the relay); everything removed by :meth:`close`."""

    def __init__(self, target_rtt_us: int, tmp: Path) -> None:
        self.target_rtt_us, self.tmp = target_rtt_us, tmp
        self.delay_us = target_rtt_us // 2
        self.calibration: list[dict[str, Any]] = []
        self.valkey: subprocess.Popen[bytes] | None = None
        self.relay: subprocess.Popen[bytes] | None = None
        self.relay_port = 0
        self.mode = ""
        self.attempts: list[dict[str, Any]] = []
        self.relay_lateness: dict[str, Any] = {}

    @property
    def host_port(self) -> tuple[str, int]:
        """Where the gateway connects: the relay on 127.0.0.1, or Valkey across the veth."""
        return ("127.0.0.1", self.relay_port) if self.mode == "relay" else (CACHE_IP, CACHE_PORT)

    @property
    def url(self) -> str:
        host, port = self.host_port
        return f"redis://{host}:{port}"

    def open(self) -> CacheAway:
        _must("ip", "netns", "add", NETNS)
        _must(
            "ip",
            "link",
            "add",
            VETH_HOST,
            "type",
            "veth",
            "peer",
            "name",
            VETH_CACHE,
            "netns",
            NETNS,
        )
        _must("ip", "addr", "add", f"{HOST_IP}/{PREFIX_LEN}", "dev", VETH_HOST)
        _must("ip", "link", "set", VETH_HOST, "up")
        _must("ip", "addr", "add", f"{CACHE_IP}/{PREFIX_LEN}", "dev", VETH_CACHE, netns=True)
        _must("ip", "link", "set", VETH_CACHE, "up", netns=True)
        _must("ip", "link", "set", "lo", "up", netns=True)
        delay = f"{self.delay_us}us"
        netem = [
            (["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", delay], True),
            (["tc", "qdisc", "add", "dev", VETH_HOST, "root", "netem", "delay", delay], False),
            (["tc", "qdisc", "add", "dev", VETH_CACHE, "root", "netem", "delay", delay], True),
        ]
        for cmd, inside in netem:
            done = _ip(*cmd, netns=inside)
            self.attempts.append(
                {
                    "command": ("ip netns exec " + NETNS + " " if inside else "") + " ".join(cmd),
                    "returncode": done.returncode,
                    "stderr": done.stderr.strip(),
                }
            )
        if all(a["returncode"] == 0 for a in self.attempts[1:]):
            self.mode = "netem"
            _ip("tc", "qdisc", "del", "dev", "lo", "root", netns=True)  # the pair carries it
        else:
            self.mode = "relay"
        workdir = self.tmp / "valkey"
        workdir.mkdir()
        # Reachable only from this machine, through the pair: no password, protected mode off
        # (protected mode refuses every client that is not on loopback).
        args = [find_server_binary(), "--port", str(CACHE_PORT), "--bind", CACHE_IP]
        args += ["--save", "", "--appendonly", "no", "--dir", str(workdir)]
        args += ["--protected-mode", "no", "--loglevel", "warning"]
        self.valkey = subprocess.Popen(
            ["ip", "netns", "exec", NETNS, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._wait_ping(CACHE_IP, CACHE_PORT, self.valkey)
        if self.mode == "relay":
            self._start_relay()
            self._calibrate()
        return self

    def _start_relay(self) -> None:
        self.relay_port = free_port()
        stats = self.tmp / "relay-lateness.json"
        code = "import bench.lib.delay_relay as m; m.relay_main()"
        argv = [str(self.relay_port), CACHE_IP, str(CACHE_PORT), str(self.delay_us), str(stats)]
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.relay = subprocess.Popen(
            [sys.executable, "-c", code, *argv],
            env={**os.environ, "PYTHONPATH": path},
            cwd=ROOT,
            start_new_session=True,
        )
        self._wait_ping("127.0.0.1", self.relay_port, self.relay)

    def _stop_relay(self) -> None:
        if self.relay is None:
            return
        if self.relay.poll() is None:
            self.relay.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.relay.wait(10)
        if self.relay.poll() is None:
            self.relay.kill()
            self.relay.wait(5)
        stats = self.tmp / "relay-lateness.json"
        if stats.exists():
            self.relay_lateness = distribution_us(json.loads(stats.read_text()))
        self.relay = None

    def _calibrate(self, pings: int = 400, tries: int = 3) -> None:
        """The relay's own cost (a thread's wake-up and a write, per hop) comes on top of its
        delay: shorten the delay until the PING round trip's median is the target."""
        for _ in range(tries):
            p50 = distribution_us(ping_rtts("127.0.0.1", self.relay_port, pings))["p50_us"]
            self.calibration.append({"delay_us_each_way": self.delay_us, "rtt_p50_us": p50})
            if abs(p50 - self.target_rtt_us) <= CALIBRATED_US:
                return
            self.delay_us = next_delay_us(self.delay_us, p50, self.target_rtt_us)
            self._stop_relay()
            self._start_relay()
        p50 = distribution_us(ping_rtts("127.0.0.1", self.relay_port, pings))["p50_us"]
        self.calibration.append({"delay_us_each_way": self.delay_us, "rtt_p50_us": p50})

    @staticmethod
    def _wait_ping(host: str, port: int, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
            try:
                ping_rtts(host, port, 1)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def rtt(self, count: int) -> dict[str, Any]:
        """PING round trips the gateway's way (``through``) and straight across the pair."""
        host, port = self.host_port
        return {
            "through": f"{self.mode}: {host}:{port}",
            "rtt": distribution_us(ping_rtts(host, port, count)),
            "rtt_veth_without_delay": distribution_us(ping_rtts(CACHE_IP, CACHE_PORT, count))
            if self.mode == "relay"
            else None,
        }

    def close(self) -> None:
        self._stop_relay()
        if self.valkey is not None and self.valkey.poll() is None:
            self.valkey.terminate()
            try:
                self.valkey.wait(5)
            except subprocess.TimeoutExpired:
                self.valkey.kill()
                self.valkey.wait(5)
        remove_stale_network()

    def describe(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "netem_attempts": self.attempts,
            "netem_unavailable_error": next(
                (a["stderr"] for a in self.attempts if a["returncode"]), None
            ),
            "netns": NETNS,
            "veth": {VETH_HOST: f"{HOST_IP}/{PREFIX_LEN}", VETH_CACHE: f"{CACHE_IP}/{PREFIX_LEN}"},
            "target_rtt_us": self.target_rtt_us,
            "delay_us_each_way": self.delay_us,
            "calibration": self.calibration,
            "relay": "userspace, bench/lib/delay_relay.py relay_main: a reader and a writer "
            "thread per direction, each chunk written delay_us after it was read (sleep to "
            f"{SPIN_S * 1e6:.0f} µs before, then spin); TCP_NODELAY both sides"
            if self.mode == "relay"
            else None,
        }


# --- the CPU share ----------------------------------------------------------------------------


def share_group(quota_us: int, period_us: int) -> cgroup_cpu.CpuQuota:
    """The gateway's cgroup, named outside ``hardcap-bench-*``: another benchmark starting
    meanwhile deletes every group of that name (:func:`cgroup_cpu.remove_stale`), and with it
    this run's quota."""
    group = cgroup_cpu.CpuQuota(GROUP, quota_us, period_us)
    group.path = group.root / GROUP
    return group


def remove_stale_group() -> list[str]:
    """This benchmark's group, if a killed run left it (others' groups are theirs)."""
    if cgroup_cpu.backend() is None:
        return []
    group = share_group(1000, 100_000)
    if not group.path.exists():
        return []
    group.remove()
    return [str(group.path)]


# --- the load -------------------------------------------------------------------------------


def children_cpu_seconds() -> float:
    """CPU seconds of this process's children that have exited (wrk, after its block)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def idle_script(tmp: Path, idle_ms: int) -> Path:
    """bench/wrk/post.lua with a pause of ``idle_ms`` before each request (wrk's delay())."""
    path = tmp / "post-after-idle.lua"
    path.write_text(
        f'dofile("{WRK_DIR / "post.lua"}")\nfunction delay()\n  return {idle_ms}\nend\n'
    )
    return path


def run_block(
    kind: str,
    target: Target,
    bodies: dict[tuple[str, str], Path],
    gateway_pid: int,
    group: cgroup_cpu.CpuQuota,
    pids: dict[str, int],
    idle_cpu_ms_per_s: float,
    ns: argparse.Namespace,
) -> dict[str, Any]:
    """One wrk block at one connection, with the gateway's CPU and throttling meanwhile."""
    body = bodies[(target.model, "stream" if kind == "stream" else "non_stream")]
    settled = settle(list(pids.values()))
    cpu0, stat0, t0 = thread_cpu_ns(gateway_pid), group.stat(), time.monotonic()
    irq0, watch = irq_seconds(), CpuWatch(pids).start()
    if kind == "non_stream_after_idle":
        wrk0 = children_cpu_seconds()
        cmd, env = wrk_command(target, body, 1, 1, ns.block_seconds, False)
        cmd[cmd.index("-s") + 1] = str(ns.idle_lua)
        done = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=ns.block_seconds + 60
        )
        res = parse_wrk(done.stdout, done.stderr, done.returncode)
        res["wrk_cpu_seconds"] = round(children_cpu_seconds() - wrk0, 3)
    else:
        res = run_wrk(target, body, connections=1, threads=1, seconds=ns.block_seconds)
    wall = time.monotonic() - t0
    cpu_ms = (thread_cpu_ns(gateway_pid) - cpu0) / 1e6
    machine = fold_wrk_cpu(watch.stop(), res["wrk_cpu_seconds"], irq_seconds() - irq0)
    n = res.get("requests") or 0
    lat = res.get("latency_us") or {}
    row: dict[str, Any] = {
        "kind": kind,
        "target": target.name,
        "requests": n,
        "settle_seconds": settled,
        "wrk": res,
        "problems": problems(res),
        "machine_cpu": machine,
        **{
            f"{name}_ms": round(lat[q] / 1000, 3) if q in lat else None
            for q, name in (("50", "p50"), ("90", "p90"), ("99", "p99"), ("mean", "mean"))
        },
    }
    if target.name == "gateway":
        busy = max(cpu_ms - idle_cpu_ms_per_s * wall, 0.0)
        row["gateway_cpu_ms"] = round(cpu_ms, 2)
        row["gateway_cpu_ms_per_request"] = round(busy / n, 4) if n else None
        row["throttling"] = cgroup_cpu.stat_delta(stat0, group.stat())
    return row


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 round of 2 s blocks (~1 min)")
    p.add_argument("--out", type=Path)
    p.add_argument("--memory-mb", type=int, help="default: infra/template.yaml's MemorySize")
    p.add_argument("--period-us", type=int, default=100_000, help="CFS period (kernel default)")
    p.add_argument("--rtt-us", type=int, default=500, help="round trip to the cache")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--block-seconds", type=float, default=10.0)
    p.add_argument("--stream-tokens", type=int, default=200)
    p.add_argument("--idle-ms", type=int, default=100, help="before each after-idle request")
    p.add_argument("--pings", type=int, default=2000, help="PINGs per RTT measurement")
    p.add_argument("--warm-seconds", type=float, default=4.0)
    p.add_argument(
        "--gateway-tree",
        metavar="REV",
        help="run the gateway from `git archive REV` (say HEAD), not the working tree",
    )
    p.add_argument("--log-level", default="INFO", help="gateway POWERTOOLS_LOG_LEVEL")
    ns = p.parse_args(argv)
    if ns.quick:
        ns.rounds, ns.block_seconds, ns.pings, ns.warm_seconds = 1, 2.0, 300, 2.0
    return ns


def recorded_command(argv: list[str]) -> str:
    """The command as a reader reruns it (``python -m bench lambda_share ...``), relative paths
    only: an ``--out`` inside the checkout is made relative to it, one outside is left out
    (where this run wrote is in ``written_to``)."""
    kept: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--out" or arg.startswith("--out="):
            value = arg.partition("=")[2] or next(args, "")
            path = Path(value).resolve()
            if path.is_relative_to(ROOT):
                kept += ["--out", str(path.relative_to(ROOT))]
        else:
            kept.append(arg)
    return " ".join(["python -m bench", Path(__file__).stem, *kept])


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    ns = parse_args(args)
    if os.geteuid() != 0:
        print(
            "bench/speed/lambda_share.py needs root (network namespaces, cgroups)", file=sys.stderr
        )
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # finally blocks tear down
    memory_mb = ns.memory_mb or template_memory_mb(TEMPLATE.read_text())
    quota = cpu_quota_us(memory_mb, ns.period_us)
    out = ns.out or RESULTS / ("lambda-share-quick.json" if ns.quick else "lambda-share.json")
    result: dict[str, Any] = {
        "benchmark": "lambda-share",
        "command": recorded_command(args),
        "written_to": str(out.resolve().relative_to(ROOT))
        if out.resolve().is_relative_to(ROOT)
        else str(out.resolve()),
        "complete": False,
        "machine": machine_info(),
        "stale_removed": {"network": remove_stale_network(), "cgroup": remove_stale_group()},
        "parameters": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(ns).items()},
            "memory_mb": memory_mb,
            "memory_from": "infra/template.yaml MemorySize Default"
            if not ns.memory_mb
            else "--memory-mb",
            "one_vcpu_mb": ONE_VCPU_MB,
            "cpu_quota_us": quota,
            "cpu_share": round(quota / ns.period_us, 4),
            "route": ROUTE,
            "gateway_processes": 1,
            "connections": 1,
            "load": "wrk -t1 -c1 (bench/wrk/post.lua; after idle: with wrk's delay())",
            "outside_the_cgroup": ["mock upstream", "valkey", "relay", "wrk"],
        },
        "blocks": [],
    }
    started = time.monotonic()
    group: cgroup_cpu.CpuQuota | None = None
    with tempfile.TemporaryDirectory(prefix="hardcap-share-") as tmp_name:
        tmp = Path(tmp_name)
        cache = CacheAway(ns.rtt_us, tmp)
        bar = tqdm(total=ns.rounds * len(KINDS) * 2 + 2, unit="block")
        try:
            cache.open()
            result["cache"] = cache.describe()
            bar.set_postfix_str("cache RTT")
            result["cache_rtt_before"] = cache.rtt(ns.pings)
            bar.update(1)
            mock = stack.start_mock(tmp, pace_ms=0.0, seed=13)
            gw = None
            try:
                data = stack.base_config(mock.url, cache.url)
                data["routes"] = [ROUTE]
                data["tenants"] = [stack.tenant_entry(TENANT, 10**15, "30d")]
                group = share_group(quota, ns.period_us).create()
                result["cgroup"] = group.settings()
                env: dict[str, str] = {}
                if ns.gateway_tree:
                    tree = export_tree(ns.gateway_tree, tmp / "gateway-tree")
                    env = tree_env(tree)
                    result["gateway_tree"] = tree
                gw, result["gateway_start"] = start_in_group(group, data, tmp, ns, env)
                pid = gw.proc.pid
                if pid not in group.members():
                    raise RuntimeError(f"gateway {pid} is not in {group.path}")
                result["gateway_server"] = stack.server_in_use(gw)
                bodies = write_bodies(tmp, ns.stream_tokens)
                ns.idle_lua = idle_script(tmp, ns.idle_ms)
                key = stack.tenant_key(TENANT)
                targets = {
                    "gateway": Target(
                        "gateway", f"{gw.url}/v1/chat/completions", pid, "gateway", "cost", key
                    ),
                    "direct": Target(
                        "direct",
                        f"{mock.url}/v1/chat/completions",
                        mock.proc.pid,
                        "direct",
                        "mock-small",
                        None,
                    ),
                }
                pids = {"gateway": pid, "direct": mock.proc.pid}
                if cache.relay is not None:
                    pids["relay"] = cache.relay.pid
                bar.set_postfix_str("warm")
                warm_mock(mock.url)
                for t in targets.values():
                    for shape in ("non_stream", "stream"):
                        run_wrk(
                            t,
                            bodies[(t.model, shape)],
                            connections=1,
                            threads=1,
                            seconds=ns.warm_seconds / 2,
                        )
                result["checks_before"] = {
                    n: verify(t, bodies, ns.stream_tokens, 1.0) for n, t in targets.items()
                }
                failing = {
                    n: c
                    for n, c in result["checks_before"].items()
                    if any(shape["problems"] for shape in c.values())
                }
                if failing:
                    raise RuntimeError(f"the check before the load failed: {failing}")
                result["gateway_redis_parser"] = stack.parser_in_use(gw)
                cpu0, t0 = thread_cpu_ns(pid), time.monotonic()
                time.sleep(1.0)
                idle = (thread_cpu_ns(pid) - cpu0) / 1e6 / (time.monotonic() - t0)
                result["gateway_idle_cpu_ms_per_s"] = round(idle, 3)
                bar.update(1)
                for rnd in range(ns.rounds):
                    for kind in KINDS:
                        order = ["direct", "gateway"] if rnd % 2 == 0 else ["gateway", "direct"]
                        for name in order:
                            bar.set_postfix_str(f"round {rnd} {kind} {name}")
                            row = run_block(kind, targets[name], bodies, pid, group, pids, idle, ns)
                            result["blocks"].append({"round": rnd, **row})
                            result["summary"] = summarize(result["blocks"])
                            write_json(out, result)
                            bar.update(1)
                result["checks_after"] = {
                    n: verify(t, bodies, ns.stream_tokens, 1.0) for n, t in targets.items()
                }
                result["cache_rtt_after"] = cache.rtt(ns.pings)
            finally:
                if gw is not None:
                    result["gateway_log_tail"] = gw.log.read_text(errors="replace")[-3000:]
                    gw.stop()
                mock.stop()
        finally:
            bar.close()
            if group is not None:
                group.remove()
            cache.close()
            result["relay_lateness"] = cache.relay_lateness
            result["torn_down"] = {
                "netns_left": NETNS in _ip("ip", "netns", "list").stdout.split(),
                "veth_left": _ip("ip", "link", "show", VETH_HOST).returncode == 0,
                "cgroup_left": group is not None and group.path.exists(),
            }
            result["seconds"] = round(time.monotonic() - started, 1)
            result["load_average_after"] = list(os.getloadavg())
            write_json(out, result)
    result["complete"] = True
    write_json(out, result)
    print_summary(result, out)
    return 0


def print_summary(result: dict[str, Any], out: Path) -> None:
    p = result["parameters"]
    rtt = result["cache_rtt_before"]["rtt"]
    print(
        f"\n{p['memory_mb']} MB: CPU share {p['cpu_share']}; cache via {result['cache']['mode']},"
        f" PING RTT p50 {rtt['p50_us']} µs p99 {rtt['p99_us']} µs"
    )
    print(f"{'kind':24}{'added p50':>12}{'added p99':>12}{'CPU ms/req':>12}{'throttled':>11}")
    for kind, s in result["summary"].items():
        print(
            f"{kind:24}{s['added_p50_ms']!s:>12}{s['added_p99_ms']!s:>12}"
            f"{s['gateway_cpu_ms_per_request']!s:>12}{s['throttled_periods']:>11}"
        )
    print(f"written to {out} in {result['seconds']} s")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
