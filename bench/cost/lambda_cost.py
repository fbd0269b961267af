"""What a request costs on Lambda at each memory size: ONE gateway worker in a cgroup whose CPU
quota is Lambda's share of one vCPU (memory / 1,769 MB), sequential requests (one in flight, as
one Lambda execution environment serves them), and the bill that follows.

Per memory size (128, 256, 512, 768, 1024 MB and 1,769 MB, the one-vCPU reference) a fresh
gateway process (``hardcap serve``, one uvicorn worker) is started, moved into
``hardcap-bench-<M>`` with ``quota = M / 1769 x period`` (bench/lib/cgroup_cpu.py: cgroup v2
``cpu.max`` where the v2 hierarchy has the cpu controller, else v1's CFS quota, the same kernel
mechanism), warmed, and measured:

* non-streamed 1-token completions: gateway CPU per request (its threads' on-CPU time from
  /proc/<pid>/task/*/schedstat; utime+stime ticks too), wall-clock duration per request;
* streams of 200 and 1,000 tokens at mock pace 0: CPU per stream, CPU per relayed token (the
  slope between the two lengths), duration;
* a stream paced at 100 tokens/s (``[mock:pace_ms=10]``, one token per network read) and one
  at 200 tokens/s (headroom): time to first and last byte and the inter-token gap as the
  client sees it, against the same streams straight from the mock (no gateway, no quota)
  measured in the same run: is it slowed? And the share of the CPU quota the stream used;
* non-streamed requests each after 0.3 s idle (a full quota): a single request's duration;
* RSS of the gateway (VmRSS, VmHWM) after warm-up and after the load; the cgroup's throttling.

The mock upstream and the private Valkey run outside the cgroup (they stand for the provider
and ElastiCache). The costs (duration billed by wall clock, rounded up to 1 ms, at arm64 and
x86 prices), the memory default and the share of the model's price are computed from the
measurements by :func:`cost_model`; docs/cost.md has the tables and sources.

A change measured against its base in one run (bench/cost/lambda_cost_ab.py): ``--gateway-tree
REV`` / ``--base-tree REV`` run gateways from ``git archive`` exports, ``--rounds N`` measures
each N times (who goes first alternating, the direct call's blocks between rounds), and
``--wrk-seconds S`` adds wrk's latency at one connection (back to back, 1-token replies and
``--short-tokens`` streams) beside the raw-socket client's; the result's ``ab`` holds what
each adds over the direct call, medians over rounds.

    python -m bench lambda_cost --plot      # ~5 min
    python -m bench lambda_cost --quick     # < 2 min
    python -m bench lambda_cost --report bench/results/lambda-cost.json --markdown

Needs root (cgroups). Writes bench/results/lambda-cost.json (lambda-cost-quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm  # type: ignore[import-untyped]

from bench.cost.lambda_cost_ab import ab_summary, print_ab, variants, write_bodies, wrk_latency
from bench.cost.lambda_cost_model import cost_model
from bench.cost.lambda_cost_report import publish
from bench.cost.lambda_cost_requests import (
    MAX_TOKENS,
    TENANT,
    CpuMeter,
    body_bytes,
    memory_kb,
    run_sequential,
    summarize_paced,
    summarize_walls,
    thread_cpu_ns,
)
from bench.lib import cgroup_cpu, stack
from bench.lib.machine import CpuWatch, machine_info, write_json
from hardcap_core.local import stack as local_stack
from hardcap_core.local.valkey import LocalValkey

RESULTS = Path(__file__).resolve().parents[1] / "results"
ONE_VCPU_MB = 1769
MEMORY_SIZES = (128, 256, 512, 768, 1024, 1769)
# A route that reserves max_tokens: every stream here fits its hold, so no extend round trips
# depend on an estimator's warm-up (the p95 estimator would reserve less and extend instead).
ROUTE = stack.mock_route("cost", estimator={"kind": "max_tokens"}, max_output_tokens=MAX_TOKENS)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer requests (< 2 min)")
    p.add_argument("--out", type=Path)
    p.add_argument("--memory", default=",".join(map(str, MEMORY_SIZES)), help="MB, comma list")
    p.add_argument("--period-us", type=int, default=100_000, help="CFS period (kernel default)")
    p.add_argument("--warm", type=int, default=40, help="warm-up requests per memory size")
    p.add_argument("--requests", type=int, default=200, help="non-streamed requests")
    p.add_argument("--isolated", type=int, default=20, help="non-streamed, each after idle")
    p.add_argument("--isolated-gap-s", type=float, default=0.3, help="idle before each of those")
    p.add_argument("--short-streams", type=int, default=20, help="200-token streams at pace 0")
    p.add_argument("--long-streams", type=int, default=8, help="1,000-token streams at pace 0")
    p.add_argument("--short-tokens", type=int, default=200)
    p.add_argument("--long-tokens", type=int, default=1000)
    p.add_argument("--paced-streams", type=int, default=3)
    p.add_argument("--paced-tokens", type=int, default=500)
    p.add_argument("--pace-ms", type=float, default=10.0, help="mock pace of the paced stream")
    p.add_argument("--fast-pace-ms", type=float, default=5.0, help="a faster model, for headroom")
    p.add_argument("--log-level", default="INFO", help="gateway POWERTOOLS_LOG_LEVEL")
    p.add_argument("--report", type=Path, help="recompute the cost model of a result file")
    p.add_argument("--plot", action="store_true", help="also write a PNG beside the result")
    p.add_argument("--markdown", action="store_true", help="print docs/cost.md's tables")
    p.add_argument("--gateway-tree", metavar="REV", help="the gateway from `git archive REV`")
    p.add_argument("--base-tree", metavar="REV", help="also a gateway from REV (gateway_base)")
    p.add_argument("--rounds", type=int, default=1, help="each gateway this many times")
    p.add_argument("--wrk-seconds", type=float, default=0.0, help="wrk blocks (0: none)")
    p.add_argument("--write-doc", action="store_true", help="put the tables into docs/cost.md")
    add_model_arguments(p)
    ns = p.parse_args(argv)
    if ns.quick:
        ns.warm, ns.requests, ns.short_streams, ns.long_streams = 15, 40, 5, 3
        ns.isolated = 8
        ns.paced_streams, ns.paced_tokens = 1, 200
    return ns


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The cost model's knobs (they only change the arithmetic, not what is measured)."""
    p.add_argument("--stream-rate", type=float, default=100.0, help="tokens/s of a model")
    p.add_argument("--stream-lengths", default="100,500,2000", help="table columns, tokens")
    p.add_argument("--share-in", type=int, default=500, help="input tokens, model share")
    p.add_argument("--share-out", type=int, default=200, help="output tokens, model share")
    p.add_argument(
        "--headroom-mb",
        type=int,
        default=48,
        help="memory the sandbox needs beside the gateway (adapter, runtime): an assumption",
    )
    p.add_argument("--slow-ttlb-ms", type=float, default=100.0, help="added last byte allowed")
    p.add_argument("--slow-gap-ms", type=float, default=10.0, help="added gap p99 allowed")
    p.add_argument("--slow-ttfb-ms", type=float, default=50.0, help="added first byte allowed")
    p.add_argument(
        "--max-quota-used",
        type=float,
        default=0.5,
        help="headroom: share of the CPU quota the paced stream may use",
    )


# --- the gateway process ------------------------------------------------------------------


def measure_memory_size(
    memory_mb: int,
    data: dict[str, Any],
    tmp: Path,
    ns: argparse.Namespace,
    bar: Any,
    env: dict[str, str] | None = None,
    bodies: dict[tuple[str, str], Path] | None = None,
) -> dict[str, Any]:
    quota = max(1000, round(memory_mb / ONE_VCPU_MB * ns.period_us))  # the kernel's minimum 1 ms
    group = cgroup_cpu.CpuQuota(str(memory_mb), quota, ns.period_us).create()
    key = stack.tenant_key(TENANT)
    row: dict[str, Any] = {"memory_mb": memory_mb, "cgroup": group.settings()}
    try:
        gw, row["start"] = start_in_group(group, data, tmp, ns, env or {})
        try:
            pid = gw.proc.pid
            row["cgroup"]["members"] = group.members()
            if pid not in row["cgroup"]["members"]:
                raise RuntimeError(f"gateway {pid} is not in {group.path}")
            row["rss_kb_after_start"] = memory_kb(pid)
            row["server"] = stack.server_in_use(gw)
            url = f"{gw.url}/v1"
            meter = CpuMeter(pid, group)
            watch = CpuWatch({"gateway": pid}).start()

            bar.set_postfix_str(f"{memory_mb} MB warm")
            warm = [(body_bytes("cost", 1, False), False)] * ns.warm
            warm += [(body_bytes("cost", ns.short_tokens, True), True)] * 3
            m = meter.start()
            warm_rows = run_sequential(url, key, warm)
            row["warm"] = {**m.stop(), "failures": sum(not r["ok"] for r in warm_rows)}
            failed = [r for r in warm_rows if not r["ok"]]
            if failed:
                print_logs(tmp)
                raise RuntimeError(
                    f"{len(failed)} of {len(warm_rows)} warm-up requests failed at {memory_mb} MB:"
                    f" status {failed[0]['status']}: {failed[0].get('error')}"
                )
            row["rss_kb_after_warm"] = memory_kb(pid)
            row["parser"] = stack.parser_in_use(gw)
            bar.update(1)

            m = meter.start()
            time.sleep(1.0)
            row["idle"] = m.stop()  # background work with no request: subtracted below
            idle_ms_per_s = row["idle"]["cpu_ms"] / row["idle"]["wall_s"]

            def phase(name: str, plan: list[tuple[bytes, bool]], per: int = 1) -> dict[str, Any]:
                bar.set_postfix_str(f"{memory_mb} MB {name}")
                m = meter.start()
                rows = run_sequential(url, key, plan)
                cpu = m.stop()
                n = len(plan)
                busy_ms = max(cpu["cpu_ms"] - idle_ms_per_s * cpu["wall_s"], 0.0)
                out = {**summarize_walls(rows), **cpu, "cpu_ms_per_request": round(busy_ms / n, 4)}
                out["cpu_ms_per_request_ticks"] = round(cpu["cpu_ms_ticks"] / n, 3)
                if per > 1:
                    out["cpu_us_per_token"] = round(busy_ms * 1e3 / n / per, 3)
                    out["ttfb_ms_p50"] = round(
                        statistics.median(r["ttfb_s"] for r in rows) * 1e3, 3
                    )
                bar.update(1)
                return out

            row["non_streamed"] = phase(
                "non-streamed", [(body_bytes("cost", 1, False), False)] * ns.requests
            )
            bar.set_postfix_str(f"{memory_mb} MB isolated")
            m = meter.start()
            isolated = run_sequential(
                url, key, [(body_bytes("cost", 1, False), False)] * ns.isolated, ns.isolated_gap_s
            )
            row["non_streamed_isolated"] = {
                **summarize_walls(isolated),
                "gap_before_each_s": ns.isolated_gap_s,
                "throttling": m.stop()["throttling"],
            }
            bar.update(1)
            short = body_bytes("cost", ns.short_tokens, True)
            row["stream_short"] = phase(
                "short streams", [(short, True)] * ns.short_streams, ns.short_tokens
            )
            long = body_bytes("cost", ns.long_tokens, True)
            row["stream_long"] = phase(
                "long streams", [(long, True)] * ns.long_streams, ns.long_tokens
            )
            s, lg = row["stream_short"], row["stream_long"]
            extra = ns.long_tokens - ns.short_tokens
            row["cpu_us_per_relayed_token"] = round(
                (lg["cpu_ms_per_request"] - s["cpu_ms_per_request"]) * 1e3 / extra, 3
            )

            for name, pace in (("paced", ns.pace_ms), ("paced_fast", ns.fast_pace_ms)):
                bar.set_postfix_str(f"{memory_mb} MB {name}")
                paced = body_bytes("cost", ns.paced_tokens, True, pace)
                m = meter.start()
                # Each after two periods of idle: the stream starts on a fresh quota, as one
                # arriving at an idle environment does (what came before is not its fault).
                paced_rows = run_sequential(
                    url, key, [(paced, True)] * ns.paced_streams, 2 * ns.period_us / 1e6
                )
                cpu = m.stop()
                busy_ms = max(cpu["cpu_ms"] - idle_ms_per_s * cpu["wall_s"], 0.0)
                row[name] = {
                    **summarize_paced(paced_rows, pace, ns.paced_tokens),
                    **cpu,
                    "cpu_ms_per_request": round(busy_ms / ns.paced_streams, 3),
                    # One token per network read here, unlike the pace-0 streams' batches.
                    "cpu_us_per_token": round(
                        busy_ms * 1e3 / ns.paced_streams / ns.paced_tokens, 2
                    ),
                    "cpu_share_used": round(busy_ms / 1e3 / cpu["wall_s"], 4),
                }
                bar.update(1)
            if ns.wrk_seconds and bodies:
                bar.set_postfix_str(f"{memory_mb} MB wrk")
                m = meter.start()
                row["wrk"] = wrk_latency(gw.url, pid, key, "cost", bodies, ns.wrk_seconds)
                row["wrk"]["throttling"] = m.stop()["throttling"]
                bar.update(1)
            row["rss_kb_after_load"] = memory_kb(pid)
            row["machine_cpu"] = watch.stop()
        finally:
            gw.stop()
    finally:
        group.remove()
    return row


def start_in_group(
    group: cgroup_cpu.CpuQuota,
    data: dict[str, Any],
    tmp: Path,
    ns: argparse.Namespace,
    env: dict[str, str],
) -> tuple[local_stack.Service, dict[str, Any]]:
    """A gateway process that enters the cgroup before Python starts (a shell writes its own
    pid into cgroup.procs, then execs the interpreter), so its start runs under the quota too:
    seconds from the process's start to its first /healthz answer."""
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    launch = stack._gateway_launch(hiredis=True, fast_server=True, log_level=ns.log_level)
    # As on Lambda, where the loop-lag monitor is not started (gateway/loop_lag.py): under the
    # quota its ticks run late by a throttled period, and it would shed the requests measured.
    launch["env"] = {**launch["env"], "AWS_LAMBDA_FUNCTION_NAME": "hardcap-bench", **env}
    procs = group.path / "cgroup.procs"
    launch["command"] = ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *launch["command"]]
    t0 = time.monotonic()
    gw = local_stack.start_gateway(config, tmp, **launch)
    seconds = time.monotonic() - t0
    return gw, {
        "seconds_to_healthz": round(seconds, 2),
        "cpu_s_to_healthz": round(thread_cpu_ns(gw.proc.pid) / 1e9, 3),
        "note": "from the checkout (not the shipped artifact), polled every 0.1 s",
    }


def warm_mock(mock_url: str) -> None:
    """The mock's first requests load its tokenizer: not part of any baseline."""
    url = f"{mock_url}/v1"
    run_sequential(url, None, [(body_bytes("mock-small", 50, True), True)] * 5)
    run_sequential(url, None, [(body_bytes("mock-small", 20, True, 10.0), True)] * 2)


def direct_rows(mock_url: str, ns: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """The same requests straight from the mock (no gateway, no quota): the baseline."""
    url = f"{mock_url}/v1"
    n_paced = max(ns.paced_streams, 2)
    return {
        "paced": run_sequential(
            url,
            None,
            [(body_bytes("mock-small", ns.paced_tokens, True, ns.pace_ms), True)] * n_paced,
        ),
        "paced_fast": run_sequential(
            url,
            None,
            [(body_bytes("mock-small", ns.paced_tokens, True, ns.fast_pace_ms), True)] * n_paced,
        ),
        "non_streamed": run_sequential(
            url, None, [(body_bytes("mock-small", 1, False), False)] * 50
        ),
        "stream_short": run_sequential(
            url, None, [(body_bytes("mock-small", ns.short_tokens, True), True)] * 10
        ),
    }


def direct_summary(parts: list[dict[str, list[dict[str, Any]]]], ns: argparse.Namespace) -> dict:
    """The baseline over every direct block of the run (one before, one after the gateways)."""
    rows = {k: [r for part in parts for r in part[k]] for k in parts[0]}
    return {
        "blocks": len(parts),
        "paced": summarize_paced(rows["paced"], ns.pace_ms, ns.paced_tokens),
        "paced_fast": summarize_paced(rows["paced_fast"], ns.fast_pace_ms, ns.paced_tokens),
        "non_streamed": summarize_walls(rows["non_streamed"]),
        "stream_short": {
            **summarize_walls(rows["stream_short"]),
            "ttfb_ms_p50": round(
                statistics.median(r["ttfb_s"] for r in rows["stream_short"]) * 1e3, 3
            ),
        },
    }


# --- the cost model -----------------------------------------------------------------------


def print_logs(tmp: Path, lines: int = 15) -> None:
    for log in sorted(tmp.glob("gateway-*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        print(f"--- {log.name} (last {len(tail)} lines)", *tail, sep="\n", file=sys.stderr)


# --- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    if ns.report:
        result = json.loads(ns.report.read_text())
        result["cost"] = cost_model(result, ns)
        write_json(ns.report, result)
        publish(result, ns.report, ns)
        return 0
    if not cgroup_cpu.is_root():
        print("bench/cost/lambda_cost.py needs root to create cgroups", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = ns.out or RESULTS / ("lambda-cost-quick.json" if ns.quick else "lambda-cost.json")
    sizes = [int(x) for x in ns.memory.split(",")]
    stale = cgroup_cpu.remove_stale()
    result: dict[str, Any] = {
        "benchmark": "lambda-cost",
        "command": "python -m bench lambda_cost "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "complete": False,
        "machine": machine_info(),
        "cgroup_backend": cgroup_cpu.backend()[0],  # type: ignore[index]
        "stale_cgroups_removed": stale,
        "parameters": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(ns).items()},
            "one_vcpu_mb": ONE_VCPU_MB,
            "route": ROUTE,
            "gateway_processes": 1,
            "in_flight": 1,
            "outside_the_cgroup": ["mock upstream", "valkey", "load generator"],
            "cpu_measure": "gateway threads' on-CPU time (/proc/<pid>/task/*/schedstat), "
            "minus its idle rate; utime+stime ticks beside it",
        },
        "memory_sizes": [],
    }
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hardcap-cost-") as tmp_name, LocalValkey() as vk:
        tmp = Path(tmp_name)
        gateways = variants(ns, tmp)
        result["trees"] = {name: tree for name, _, tree in gateways}
        phases = (7 + bool(ns.wrk_seconds)) * len(sizes) * len(gateways) * ns.rounds
        bar = tqdm(total=phases + 1 + ns.rounds, unit="phase")
        bodies = write_bodies(tmp, ns.short_tokens) if ns.wrk_seconds else None
        mock = stack.start_mock(tmp, pace_ms=0.0, seed=13)
        try:
            data = stack.base_config(mock.url, vk.url)
            data["routes"] = [ROUTE]
            data["tenants"] = [stack.tenant_entry(TENANT, 10**15, "30d")]

            def direct_block() -> dict[str, list[dict[str, Any]]]:
                bar.set_postfix_str("direct")
                got = direct_rows(mock.url, ns)
                if bodies:
                    wrk = wrk_latency(mock.url, mock.proc.pid, None, "mock-small", bodies,
                                      ns.wrk_seconds)  # fmt: skip
                    result.setdefault("direct_wrk", []).append(wrk)
                bar.update(1)
                return got

            warm_mock(mock.url)
            direct = [direct_block()]
            for rnd in range(ns.rounds):
                k = rnd % len(gateways)
                for name, env, tree in gateways[k:] + gateways[:k]:
                    for mb in sizes:
                        try:
                            row = measure_memory_size(mb, data, tmp, ns, bar, env, bodies)
                        except Exception:
                            print_logs(tmp)  # a gateway that would not start says why in its log
                            raise
                        result["memory_sizes"].append(
                            {"variant": name, "round": rnd, "tree": tree, **row}
                        )
                        write_json(out, result)
                direct.append(direct_block())
            result["direct"] = direct_summary(direct, ns)
        finally:
            bar.close()
            mock.stop()
            cgroup_cpu.remove_stale()
    result["complete"] = True
    result["seconds"] = round(time.monotonic() - started, 1)
    result["cost"] = cost_model(result, ns)
    result["ab"] = ab_summary(result)
    write_json(out, result)
    publish(result, out, ns)
    print_ab(result["ab"])
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
