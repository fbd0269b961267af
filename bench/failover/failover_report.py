"""What :mod:`bench.failover.failover` makes of its phases: per-window counts and latencies, the
goals
checked, the summary it prints, and the chart (latency and upstream share over time)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.failover.failover_load import (
    DROPPED,
    ERROR_EVENT,
    OK,
    BreakerWatch,
    Shot,
    bins,
    summarize,
    window,
)

BIN_S = 0.5


def _failed_rows(shots: list[Shot], t0: float) -> list[dict[str, Any]]:
    return [s.as_json(t0) for s in shots if s.outcome != OK]


def _usage(shots: list[Shot]) -> dict[str, int]:
    """Tokens the clients were told they were charged (closing usage chunks)."""
    return {
        "ok_streams": sum(s.usage_tokens or 0 for s in shots if s.outcome == OK),
        "other_streams": sum(s.usage_tokens or 0 for s in shots if s.outcome != OK),
    }


def phase_a_report(
    shots: list[Shot], t0: float, ns: argparse.Namespace, watch: BreakerWatch
) -> dict[str, Any]:
    """The 503 phase: before, during and after the primary's errors."""
    end = ns.before + ns.fault_seconds
    return {
        "fault": {"status": 503, "from_s": ns.before, "until_s": end},
        "all": summarize(shots),
        "before": summarize(window(shots, t0, 0, ns.before)),
        "during": summarize(window(shots, t0, ns.before, end)),
        "after": summarize(window(shots, t0, end, ns.phase_seconds)),
        "breaker": watch.timeline(t0, t0 + ns.phase_seconds + 5),
        "client_usage_tokens": _usage(shots),
        "bins": bins(shots, t0, BIN_S),
        "failed_requests": _failed_rows(shots, t0),
    }


def phase_b_report(
    shots: list[Shot], t0: float, kill_at: float, ns: argparse.Namespace, watch: BreakerWatch
) -> dict[str, Any]:
    """The kill phase: streams done before the kill, in flight at it, and sent after it."""
    after = [s for s in shots if s.sent is None or s.sent >= kill_at]
    rest = [s for s in shots if s.sent is not None and s.sent < kill_at]
    in_flight = [s for s in rest if s.done is not None and s.done >= kill_at]
    done_before = [s for s in rest if s.done is not None and s.done < kill_at]
    failed_in_flight = [s for s in in_flight if s.outcome != OK]
    return {
        "kill_at_s": round(kill_at - t0, 4),
        "all": summarize(shots),
        "done_before_kill": summarize(done_before),
        "in_flight_at_kill": summarize(in_flight),
        "in_flight_failed": {
            "count": len(failed_in_flight),
            "outcomes": summarize(failed_in_flight)["outcomes"],
            "served_by": summarize(failed_in_flight)["served_by"],
        },
        "sent_after_kill": summarize(after),
        "first_2s_after_kill": summarize([s for s in after if s.scheduled < kill_at + 2]),
        "breaker": watch.timeline(t0, t0 + ns.phase_seconds + 5),
        "client_usage_tokens": _usage(shots),
        "bins": bins(shots, t0, BIN_S),
        "failed_requests": _failed_rows(shots, t0),
    }


def check(result: dict[str, Any]) -> dict[str, Any]:
    """The goals: none failed in the 503 phase; after the kill only streams in flight on the
    primary failed, each with an error event; none sent after it failed; nothing left reserved."""
    a, b = result["phase_503"], result["phase_kill"]
    dropped = a["all"]["outcomes"].get(DROPPED, 0) + b["all"]["outcomes"].get(DROPPED, 0)
    # A stream in flight on the primary may fail: with an SSE error event once bytes reached the
    # client, or a clean 5xx when none had (the gateway did not retry it: see the report).
    bad_in_flight = sum(
        n
        for o, n in b["in_flight_failed"]["outcomes"].items()
        if o != ERROR_EVENT and not o.startswith("http_5")
    ) + sum(n for who, n in b["in_flight_failed"]["served_by"].items() if who == "secondary")
    left = sum(t["live_reservations"] for t in result["settled"].values())
    goals = {
        "failed_in_503_phase": a["all"]["failed"],
        "failed_sent_after_kill": b["sent_after_kill"]["failed"],
        "in_flight_failures_dropped_or_not_on_primary": bad_in_flight,
        "dropped_streams": dropped,
        "live_reservations_left": left,
    }
    return {**goals, "passed": not any(goals.values())}


def _line(label: str, s: dict[str, Any]) -> str:
    return (
        f"  {label:<22} {s['requests']:>5} req  failed {s['failed']:>3}  "
        f"ttfb p50/p99 {s['ttfb_ms']['p50']}/{s['ttfb_ms']['p99']} ms  "
        f"total p50/p99 {s['total_ms']['p50']}/{s['total_ms']['p99']} ms  "
        f"{s['served_by']}"
    )


def print_summary(result: dict[str, Any], out: Path) -> None:
    print(f"\nwrote {out} in {result['seconds']} s")
    search = result["rate_search"]
    for blk in search["blocks"]:
        print(f"search {blk['rate']:>5g}/s held={blk['held']}: {_line('', blk).strip()}")
    print(f"rate: {search['chosen_rate']:g} streams/s (asked {search['asked_rate']})")
    print(_line("direct to mock", result["calibration"]))
    a, b = result["phase_503"], result["phase_kill"]
    print("phase 503:")
    for k in ("before", "during", "after", "all"):
        print(_line(k, a[k]))
    print(f"phase kill (at {b['kill_at_s']} s):")
    for k in ("done_before_kill", "in_flight_at_kill", "sent_after_kill", "all"):
        print(_line(k, b[k]))
    print("check:", result["check"])


def plot(result: dict[str, Any], out: Path) -> None:
    """Per phase: p50/p99 latency over time (top), requests per upstream and failures (bottom),
    with the breaker's open spans shaded and the fault or kill marked."""
    import matplotlib

    matplotlib.use("Agg")  # no display on CI or servers
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 7), sharex="col")
    phases = (("phase_503", "Primary answers 503"), ("phase_kill", "Primary process killed"))
    for col, (name, title) in enumerate(phases):
        ph = result[name]
        xs = [b["t"] for b in ph["bins"]]
        top, bottom = axes[0][col], axes[1][col]
        for metric, color in (("ttfb_ms", "tab:blue"), ("total_ms", "tab:green")):
            for q, style in (("p50", "-"), ("p99", "--")):
                ys = [b[metric][q] for b in ph["bins"]]
                label = f"{'first byte' if metric == 'ttfb_ms' else 'total'} {q}"
                top.plot(xs, ys, style, color=color, label=label)
        top.set_yscale("log")
        top.set_ylabel("ms from scheduled send")
        top.set_title(title)
        prim = [b["ok_served_by"].get("primary", 0) for b in ph["bins"]]
        sec = [b["ok_served_by"].get("secondary", 0) for b in ph["bins"]]
        fail = [b["failed"] for b in ph["bins"]]
        w = 0.45
        bottom.bar(xs, prim, width=w, align="edge", color="tab:blue", label="primary")
        bottom.bar(
            xs,
            sec,
            width=w,
            align="edge",
            bottom=prim,
            color="tab:orange",
            label="secondary (fallback)",
        )
        bottom.bar(
            xs,
            fail,
            width=w,
            align="edge",
            bottom=[p + s for p, s in zip(prim, sec, strict=True)],
            color="tab:red",
            label="failed",
        )
        bottom.set_ylabel("requests per 0.5 s")
        bottom.set_xlabel("seconds into the phase (scheduled send time)")
        end = xs[-1] + 0.5 if xs else 0
        for ax in (top, bottom):
            _shade_open(ax, ph["breaker"], end)
            if name == "phase_503":
                ax.axvspan(ph["fault"]["from_s"], ph["fault"]["until_s"], color="red", alpha=0.06)
            else:
                ax.axvline(ph["kill_at_s"], color="red", linewidth=1.2)
            ax.grid(True, alpha=0.3)
        top.legend(fontsize=7, loc="upper right")
        bottom.legend(fontsize=7, loc="lower right")
    m = result["machine"]
    rate = result["rate_search"]["chosen_rate"]
    fig.suptitle(
        f"Failover at {rate:g} streams/s, {result['parameters']['gateways']} gateways, "
        f"breaker 5 failures / 2 s cooldown (grey: primary's breaker open); "
        f"{m['cpu_count']} cores",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _shade_open(ax: Any, timeline: list[dict[str, Any]], end: float) -> None:
    for i, row in enumerate(timeline):
        if row["state"] != "open":
            continue
        until = timeline[i + 1]["t"] if i + 1 < len(timeline) else end
        ax.axvspan(row["t"], until, color="grey", alpha=0.18, linewidth=0)


if __name__ == "__main__":  # redraw from a result file
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("bench/results/failover.json")
    plot(json.loads(src.read_text()), src.with_suffix(".png"))
    print(f"wrote {src.with_suffix('.png')}")
