"""Charts from the benchmark result files (matplotlib, Agg backend): docs/img/overshoot.png and
docs/img/overhead.png.

    python -m bench plot
    python -m bench plot --overshoot /tmp/overshoot-quick.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported: no display on CI or servers
import matplotlib.pyplot as plt

from bench.report import MODE_ORDER

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
IMG = ROOT / "docs" / "img"
COLORS = {
    "count_after": "tab:blue",
    "max_tokens": "tab:orange",
    "max_tokens_whole": "tab:brown",
    "p95_allow": "tab:green",
    "p95_truncate": "tab:red",
    "p95_truncate_whole": "tab:purple",
}


def plot_overshoot(data: dict[str, Any], out: Path) -> None:
    """Worst and mean overshoot against ground truth, and budget usable, per mode."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    modes = [m for m in MODE_ORDER if any(c["mode"] == m for c in data["cells"])]
    for mode in modes:
        cells = sorted(
            (c for c in data["cells"] if c["mode"] == mode), key=lambda c: c["concurrency"]
        )
        xs = [c["concurrency"] for c in cells]
        label = cells[0]["label"]
        color = COLORS.get(mode)
        worst = [c["summary"]["worst_overshoot_ground_truth"] * 100 for c in cells]
        mean = [c["summary"]["mean_overshoot_ground_truth"] * 100 for c in cells]
        ax1.plot(xs, worst, "o-", color=color, label=f"{label} (worst)")
        ax1.plot(xs, mean, "x--", color=color, alpha=0.6, label=f"{label} (mean)")
        usable = [min(c["summary"]["usable_mean"], 1.0) * 100 for c in cells]
        ax2.plot(xs, usable, "o-", color=color, label=label)
    levels = sorted({c["concurrency"] for c in data["cells"]})
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(n) for n in levels])
        ax.set_xlabel("concurrent streams per tenant")
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_yscale("symlog", linthresh=1.0)
    ax1.axhline(0, color="black", linewidth=0.8)
    ax1.set_ylabel("overshoot vs ground truth, % of budget (symlog)")
    ax1.set_title("Tokens generated beyond the budget")
    ax1.legend(fontsize=7, loc="upper left")
    ax2.set_ylabel("ground truth / budget, % (capped at 100)")
    ax2.set_title("Share of the budget usable")
    ax2.legend(fontsize=7, loc="lower left")
    p = data["parameters"]
    fig.suptitle(
        f"{p['budget_tokens']:,}-token budgets, {p['gateway_processes']} gateway processes, "
        f"mock pace {p['mock_pace_ms']:g} ms/token, {data['machine']['cpu_count']} cores",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_overhead(data: dict[str, Any], out: Path) -> None:
    """Added latency against load, and one worker's throughput against offered load."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    for kind, marker in (("non_stream", "o"), ("stream", "s")):
        rows = [a for a in data.get("added_latency", []) if a["kind"] == kind]
        if not rows:
            continue
        xs = [a["rate"] for a in rows]
        name = "not streamed" if kind == "non_stream" else "streamed"
        for q, style in (("p50", "-"), ("p99", "--")):
            ys = [a[f"added_{q}_ms"] for a in rows]
            ax1.plot(xs, ys, marker + style, label=f"{name}, added {q}")
    ax1.axhline(0, color="black", linewidth=0.8)
    ax1.set_xlabel("offered load, requests/s")
    ax1.set_ylabel("gateway minus direct, ms")
    ax1.set_yscale("symlog", linthresh=2.0)
    ax1.set_title("Added latency (open loop, from scheduled send time)")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    for label, color in (("hiredis", "tab:red"), ("no_hiredis", "tab:blue")):
        s = data.get(f"saturation_{label}")
        if not s:
            continue
        xs = [b["rate"] for b in s["blocks"]]
        ax2.plot(
            xs,
            [b.get("achieved_per_second") or 0 for b in s["blocks"]],
            "o-",
            color=color,
            label=f"{label.replace('_', ' ')}: completed/s",
        )
    lim = max((float(x) for x in data["parameters"]["sat_rates"].split(",")), default=1.0)
    ax2.plot([0, lim], [0, lim], ":", color="gray", label="offered")
    ax2.set_xlabel("offered load, requests/s (non-streamed, 1-token replies)")
    ax2.set_ylabel("completed within the window, requests/s")
    ax2.set_title("One gateway worker process")
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    fig.suptitle(
        f"{data['machine']['cpu_model']}, {data['machine']['cpu_count']} cores; "
        "load generator, mock, gateway and Valkey share the machine",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--overshoot", type=Path, default=RESULTS / "overshoot.json")
    p.add_argument("--overhead", type=Path, default=RESULTS / "overhead.json")
    p.add_argument("--out-dir", type=Path, default=IMG)
    ns = p.parse_args(argv)
    ns.out_dir.mkdir(parents=True, exist_ok=True)
    for path, fn, name in (
        (ns.overshoot, plot_overshoot, "overshoot.png"),
        (ns.overhead, plot_overhead, "overhead.png"),
    ):
        if path.exists():
            fn(json.loads(path.read_text()), ns.out_dir / name)
            print(f"wrote {ns.out_dir / name} from {path}")
        else:
            print(f"skipped {name}: no {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
