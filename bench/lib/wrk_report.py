"""The summary of a bench/speed/wrk_overhead.py run (medians over rounds, figures against the direct
call and the bare app of the same round), its table and its plot."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return round(statistics.median(got), 3) if got else None


def summarise(rows: list[dict[str, Any]], targets: list[str]) -> dict[str, dict[str, Any]]:
    """Per target: medians over rounds; added = target minus direct in the same round."""
    by = {(r["round"], r["kind"], r["target"]): r for r in rows}
    rounds = sorted({r["round"] for r in rows})
    out: dict[str, dict[str, Any]] = {}
    for t in targets:
        s: dict[str, Any] = {"problems": {}}
        for kind, prefix in (("latency", ""), ("saturation", "sat_"), ("stream", "stream_")):
            mine = [by[(rnd, kind, t)] for rnd in rounds if (rnd, kind, t) in by]
            if not mine:
                continue
            fields = ["p50_ms", "p90_ms", "p99_ms", "mean_ms", "requests_per_second"]
            fields += ["target_cpu_us_per_request", "mock_cpu_us_per_request"]
            fields += ["wrk_cpu_us_per_request", "target_cpu_us_per_token"]
            for f in fields:
                s[prefix + f] = _median([r.get(f) for r in mine])
            for q in ("p50_ms", "p90_ms", "p99_ms", "mean_ms"):
                diffs = []
                for r in mine:
                    base = by.get((r["round"], kind, "direct"))
                    if base and r.get(q) is not None and base.get(q) is not None:
                        diffs.append(r[q] - base[q])
                s[f"{prefix}added_{q}"] = _median(diffs)
            if kind == "saturation":
                ratios = []
                for r in mine:
                    bare = by.get((r["round"], kind, "bare"))
                    if bare and bare["requests_per_second"]:
                        ratios.append(r["requests_per_second"] / bare["requests_per_second"])
                s["sat_ratio_to_bare"] = _median(ratios)
            for r in mine:
                for k, v in r["problems"].items():
                    s["problems"][f"{kind}:{k}"] = s["problems"].get(f"{kind}:{k}", 0) + v
        lat, strm = s.get("target_cpu_us_per_request"), s.get("stream_target_cpu_us_per_request")
        tokens = next((r["reply_tokens"] for r in rows if r["kind"] == "stream"), None)
        if lat is not None and strm is not None and tokens:
            # The stream's CPU beyond a 1-token request's, both at one connection: per token.
            s["stream_marginal_cpu_us_per_token"] = round((strm - lat) / (tokens - 1), 2)
        out[t] = s
    return out


def _fmt(v: Any, spec: str = ".2f", signed: bool = False) -> str:
    if v is None:
        return "-"
    return format(v, ("+" if signed else "") + spec)


def print_table(result: dict[str, Any], out: Path) -> None:
    print(f"\nwrote {out} in {result['seconds']} s")
    summary = result.get("summary") or {}
    d = summary.get("direct", {})
    print(
        f"direct call: p50 {_fmt(d.get('p50_ms'), '.3f')} ms, p99 {_fmt(d.get('p99_ms'), '.3f')} "
        f"ms; {_fmt(d.get('sat_requests_per_second'), '.0f')} req/s; 200-token stream p50 "
        f"{_fmt(d.get('stream_p50_ms'), '.2f')} ms"
    )
    head = (
        f"{'target':<14}{'req/s':>8}{'x bare':>8}{'CPU us/req':>11}{'+p50 ms':>9}"
        f"{'+p99 ms':>9}{'str +p50':>9}{'us/token':>9}{'marg/tok':>9}  problems"
    )
    print(head)
    for name, s in summary.items():
        print(
            f"{name:<14}{_fmt(s.get('sat_requests_per_second'), '.0f'):>8}"
            f"{_fmt(s.get('sat_ratio_to_bare'), '.3f'):>8}"
            f"{_fmt(s.get('sat_target_cpu_us_per_request'), '.0f'):>11}"
            f"{_fmt(s.get('added_p50_ms'), '.3f', True):>9}"
            f"{_fmt(s.get('added_p99_ms'), '.3f', True):>9}"
            f"{_fmt(s.get('stream_added_p50_ms'), '.2f', True):>9}"
            f"{_fmt(s.get('stream_target_cpu_us_per_token'), '.1f'):>9}"
            f"{_fmt(s.get('stream_marginal_cpu_us_per_token'), '.1f'):>9}"
            f"  {s['problems'] or 'none'}"
        )
    for p in result.get("profiles") or []:
        print(
            f"profile {p['kind']}: {p['svg']} (py-spy exit {p['py_spy_returncode']}, "
            f"{p['wrk_requests_per_second']} req/s while sampled)"
        )


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result["summary"]
    names = list(summary)
    tokens = result["parameters"]["stream_tokens"]
    panels = [
        ("sat_requests_per_second", f"req/s, {result['parameters']['connections']} connections"),
        ("sat_target_cpu_us_per_request", "CPU us per request (the target's process)"),
        ("added_p50_ms", "added p50 ms, 1 connection, vs direct"),
        ("stream_added_p50_ms", f"added p50 ms, {tokens}-token stream, 1 connection"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        shown = [n for n in names if summary[n].get(key) is not None]
        ax.bar(shown, [summary[n][key] for n in shown], color="#4c72b0")
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.suptitle(f"wrk: gateway vs bare apps ({result['machine']['cpu_model']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")
