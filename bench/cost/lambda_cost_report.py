"""The output side of bench/cost/lambda_cost.py: the console summary, the markdown tables written
into docs/cost.md between its ``lambda_cost:`` markers, and the plot."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.cost.lambda_cost_model import PRICES


def print_summary(result: dict[str, Any], out: Path) -> None:
    print(f"\nwrote {out}")
    d = result["direct"]["paced"]
    print(
        f"direct paced stream: {d['tokens']} tokens at {d['pace_ms']} ms: last byte "
        f"{d['ttlb_s_median']} s, gap p99 {d['gap_ms_p99']} ms"
    )
    print(" MB   cpu ms/req  req ms p50  cpu us/token  paced ttlb s  gap p99 ms  ttfb ms  HWM MB")
    for m in result["memory_sizes"]:
        p = m["paced"]
        print(
            f"{m['memory_mb']:>5} {m['non_streamed']['cpu_ms_per_request']:>10.3f} "
            f"{m['non_streamed']['wall_ms_p50']:>11.2f} {m['cpu_us_per_relayed_token']:>13.2f} "
            f"{p['ttlb_s_median']:>13.3f} {p['gap_ms_p99']:>11.2f} {p['ttfb_ms_median']:>8.2f} "
            f"{m['rss_kb_after_load']['VmHWM'] / 1024:>7.1f}"
        )
    cost = result["cost"]
    cols = ["non_streamed"] + [f"stream_{n}" for n in cost["assumptions"]["stream_lengths"]]
    for arch in PRICES["lambda_gb_second"]:
        print(f"$ per million requests, {arch}: " + ", ".join(cols))
        for r in cost["table"]:
            cells = "  ".join(f"{r['usd_per_million'][arch][c]:>8.2f}" for c in cols)
            flags = ("" if r["fits_memory"] else " (RSS too big)") + (
                " (slows the stream)" if r["slows_stream"] else ""
            )
            print(f"  {r['memory_mb']:>5} MB  {cells}{flags}")
    print(f"default memory: {cost['default_memory_mb']} MB")


def markdown(result: dict[str, Any]) -> str:
    """The tables docs/cost.md shows, from a result file."""
    cost, direct = result["cost"], result["direct"]
    by_mb = {r["memory_mb"]: r for r in cost["table"]}
    d = direct["paced"]
    lines = [
        f"Measured {result['machine']['date_utc']} at commit "
        f"{(result['machine']['git_commit'] or '?')[:10]}"
        f"{' (tree with local changes)' if result['machine']['git_dirty'] else ''}, "
        f"{result['machine']['cpu_model']}; CFS period "
        f"{result['parameters']['period_us'] / 1000:g} ms. Straight from the mock: a "
        f"{d['tokens']}-token stream at {1000 / d['pace_ms']:.0f} tokens/s takes "
        f"{d['ttlb_s_median']:.3f} s, gap p99 {d['gap_ms_p99']:.1f} ms.",
        "",
        "| memory | CPU share | start to /healthz (s) | CPU ms / request | request ms, "
        "back to back (mean) | request ms, after idle (p50) | CPU µs / token, batched | "
        "CPU µs / token, one per read | 100 tok/s: added last byte / gap p99 / first byte (ms)"
        " | 100 tok/s: share of the quota used | 200 tok/s: added gap p99 (ms) | VmHWM MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for m in result["memory_sizes"]:
        c = by_mb[m["memory_mb"]]
        fast = c.get("fast_stream", {})
        lines.append(
            f"| {m['memory_mb']} MB | {m['cgroup']['cpu_share']:.3f} "
            f"| {m.get('start', {}).get('seconds_to_healthz', '—')} "
            f"| {m['non_streamed']['cpu_ms_per_request']:.2f} "
            f"| {m['non_streamed']['wall_ms_mean']:.1f} "
            f"| {m.get('non_streamed_isolated', {}).get('wall_ms_p50', '—')} "
            f"| {m['cpu_us_per_relayed_token']:.0f} "
            f"| {m['paced']['cpu_us_per_token']:.0f} "
            f"| {c['added_ttlb_ms']:+.0f} / {c['added_gap_p99_ms']:+.1f} / "
            f"{c['added_ttfb_ms']:+.1f}{' **slowed**' if c['slows_stream'] else ''} "
            f"| {c['quota_used_by_stream'] * 100:.0f} % "
            f"| {fast.get('added_gap_p99_ms', 0):+.1f}"
            f"{' **slowed**' if c.get('slows_fast_stream') else ''} "
            f"| {c['vmhwm_mb']:.0f} |"
        )
    cols = ["non_streamed"] + [f"stream_{n}" for n in cost["assumptions"]["stream_lengths"]]
    heads = ["non-streamed (gateway time only)"] + [
        f"{n}-token stream" for n in cost["assumptions"]["stream_lengths"]
    ]
    for arch in PRICES["lambda_gb_second"]:
        lines += [
            "",
            f"$ per million requests, Lambda only ({arch}: "
            f"${PRICES['lambda_gb_second'][arch]:.10f} per GB-s, $0.20 per million requests), "
            f"streams at {cost['assumptions']['stream_rate_tokens_per_s']:g} tokens/s:",
            "",
            "| memory | " + " | ".join(heads) + " |",
            "|---:|" + "---:|" * len(cols),
        ]
        for r in cost["table"]:
            cells = " | ".join(f"{r['usd_per_million'][arch][c]:.2f}" for c in cols)
            lines.append(f"| {r['memory_mb']} MB | {cells} |")
    share = cost["model_share"]
    lines += [
        "",
        f"The gateway's Lambda cost for one request of {share['input_tokens']} tokens in and "
        f"{share['output_tokens']} out streamed at {share['stream_rate']:g} tokens/s, as a share "
        "of the model's price (arm64; in brackets with API Gateway REST in front, +$3.50 per "
        "million):",
        "",
        "| model ($ in / out per M tokens) | model $ per request | "
        + " | ".join(f"{r['memory_mb']} MB" for r in cost["table"])
        + " |",
        "|---|---:|" + "---:|" * len(cost["table"]),
    ]
    for name, m in share["models"].items():
        pin, pout = m["usd_per_million_in_out"]
        cells = " | ".join(
            f"{a['share_of_model'] * 100:.1f} % ({a['share_with_rest_api'] * 100:.1f} %)"
            for a in (v["arm64"] for v in m["by_memory"].values())
        )
        lines.append(f"| {name} (${pin:g} / ${pout:g}) | ${m['model_usd']:.6f} | {cells} |")
    lines += [
        "",
        f"Default memory by the rule: {cost['default_memory_mb']} MB; with headroom for "
        f"twice the rate: {cost.get('default_with_headroom_mb')} MB.",
    ]
    return "\n".join(lines)


DOC = Path(__file__).resolve().parents[2] / "docs" / "cost.md"


def write_doc(result: dict[str, Any], path: Path = DOC) -> None:
    """Replace the tables between docs/cost.md's ``<!-- lambda_cost:NAME -->`` markers."""
    parts = markdown(result).split("\n\n")
    i_share = next(i for i, p in enumerate(parts) if p.startswith("The gateway's Lambda cost"))
    blocks = {
        "MEASUREMENTS": parts[:2],
        "COST": parts[2:i_share],
        "SHARE": parts[i_share:],
    }
    doc = path.read_text()
    for name, body in blocks.items():
        begin, end = f"<!-- lambda_cost:{name} -->", f"<!-- /lambda_cost:{name} -->"
        head, found, rest = doc.partition(begin)
        _, found_end, tail = rest.partition(end)
        if not (found and found_end):
            raise SystemExit(f"{path}: no {begin} ... {end} block")
        doc = head + begin + "\n" + "\n\n".join(body).strip() + "\n" + end + tail
    path.write_text(doc)
    print(f"updated the tables in {path}")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = result["memory_sizes"]
    mb = [m["memory_mb"] for m in ms]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    ax.plot(mb, [m["non_streamed"]["wall_ms_mean"] for m in ms], "o-", label="back to back (mean)")
    iso = [m.get("non_streamed_isolated", {}).get("wall_ms_p50") for m in ms]
    if all(v is not None for v in iso):
        ax.plot(mb, iso, "s-", label="after idle (p50)")
    ax.set_xlabel("memory (MB)")
    ax.set_ylabel("ms per non-streamed request")
    ax.set_yscale("log")
    ax.set_title("duration, one request in flight")
    ax.legend()
    ax = axes[1]
    for name in ("paced", "paced_fast"):
        if all(name in m for m in ms):
            rate = 1000 / ms[0][name]["pace_ms"]
            used = [m[name]["cpu_share_used"] / m["cgroup"]["cpu_share"] * 100 for m in ms]
            ax.plot(mb, used, "o-", label=f"{rate:.0f} tokens/s")
    ax.axhline(100, color="red", ls="--", label="the whole quota")
    ax.axhline(50, color="grey", ls=":", label="half of it")
    ax.set_xlabel("memory (MB)")
    ax.set_ylabel("% of the CPU quota")
    ax.set_yscale("log")
    ax.set_title("CPU quota a paced stream uses")
    ax.legend()
    ax = axes[2]
    cost = result["cost"]
    for col in ["non_streamed"] + [f"stream_{n}" for n in cost["assumptions"]["stream_lengths"]]:
        ax.plot(
            [r["memory_mb"] for r in cost["table"]],
            [r["usd_per_million"]["arm64"][col] for r in cost["table"]],
            "o-",
            label=col.replace("_", " "),
        )
    ax.set_xlabel("memory (MB)")
    ax.set_ylabel("$ per million requests (arm64)")
    ax.set_yscale("log")
    ax.set_title("Lambda cost")
    ax.legend()
    fig.suptitle(f"Hardcap on an emulated Lambda CPU share ({result['machine']['cpu_model']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def publish(result: dict[str, Any], out: Path, ns: argparse.Namespace) -> None:
    """What a run or ``--report`` ends with: the summary, and the markdown, docs/cost.md and
    the plot when asked."""
    print_summary(result, out)
    if ns.markdown:
        print(markdown(result))
    if ns.write_doc:
        write_doc(result)
    if ns.plot:
        plot(result, out.with_suffix(".png"))
