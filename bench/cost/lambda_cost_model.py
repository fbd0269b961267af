"""The cost side of bench/cost/lambda_cost.py: Lambda's and the models' prices, the $ per request
by memory size and stream length, the default memory the measurements support, and the
gateway's share of a model's price. Pure functions of a result file (``--report`` recomputes
them without a run)."""

from __future__ import annotations

import argparse
import math
from typing import Any

# Prices, US East (N. Virginia), first pricing tier; sources in docs/cost.md.
PRICES = {
    "lambda_request_per_million": 0.20,
    "lambda_gb_second": {"arm64": 0.0000133334, "x86_64": 0.0000166667},
    "function_url_per_million": 0.0,
    "api_gateway_rest_per_million": 3.50,
    "api_gateway_http_per_million": 1.00,
}
MODELS = {
    # USD per million tokens, (input, output); sources in docs/cost.md.
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "claude-sonnet-5.5": (2.00, 10.00),
    "claude-opus-5.5": (4.00, 20.00),
}


def lambda_cost(memory_mb: int, seconds: float, arch: str) -> float:
    """USD for one invocation: the request plus duration rounded up to 1 ms, times GB."""
    billed = math.ceil(seconds * 1000 - 1e-9) / 1000
    gb_s = billed * memory_mb / 1024
    return PRICES["lambda_request_per_million"] / 1e6 + gb_s * PRICES["lambda_gb_second"][arch]


def cost_model(result: dict[str, Any], ns: argparse.Namespace) -> dict[str, Any]:
    """$ per million requests by memory size and stream length, the memory default, and the
    gateway's cost beside the model's, from a run's measurements."""
    direct = result["direct"]
    rate = ns.stream_rate
    lengths = [int(x) for x in ns.stream_lengths.split(",")]
    rows, verdicts = [], []
    for m in result["memory_sizes"]:
        mb = m["memory_mb"]
        paced, d = m["paced"], direct["paced"]
        added_ttlb_ms = (paced["ttlb_s_median"] - d["ttlb_s_median"]) * 1e3
        added_ttfb_ms = paced["ttfb_ms_median"] - d["ttfb_ms_median"]
        added_gap_ms = paced["gap_ms_p99"] - d["gap_ms_p99"]
        hwm_mb = max(m["rss_kb_after_load"]["VmHWM"], m["rss_kb_after_warm"]["VmHWM"]) / 1024
        fits = hwm_mb + ns.headroom_mb <= mb
        slowed = (
            added_ttlb_ms > ns.slow_ttlb_ms
            or added_gap_ms > ns.slow_gap_ms
            or added_ttfb_ms > ns.slow_ttfb_ms
            or paced["failures"] > 0
        )
        # A stream's billed duration: its tokens at the model's rate plus what the gateway
        # added to the last byte at this memory size (never less than nothing).
        added_s = max(added_ttlb_ms, 0.0) / 1e3
        durations = {"non_streamed": m["non_streamed"]["wall_ms_mean"] / 1e3}
        durations |= {f"stream_{n}": n / rate + added_s for n in lengths}
        per_million = {
            arch: {k: round(lambda_cost(mb, s, arch) * 1e6, 2) for k, s in durations.items()}
            for arch in PRICES["lambda_gb_second"]
        }
        rows.append(
            {
                "memory_mb": mb,
                "duration_s": {k: round(v, 4) for k, v in durations.items()},
                "usd_per_million": per_million,
                "added_ttlb_ms": round(added_ttlb_ms, 1),
                "added_ttfb_ms": round(added_ttfb_ms, 2),
                "added_gap_p99_ms": round(added_gap_ms, 2),
                "vmhwm_mb": round(hwm_mb, 1),
                "quota_used_by_stream": round(
                    paced["cpu_share_used"] / m["cgroup"]["cpu_share"], 3
                ),
                "fits_memory": fits,
                "slows_stream": slowed,
            }
        )
        if "paced_fast" in m and "paced_fast" in direct:
            f, df = m["paced_fast"], direct["paced_fast"]
            rows[-1]["fast_stream"] = {
                "tokens_per_s": round(1000 / f["pace_ms"]),
                "added_ttlb_ms": round((f["ttlb_s_median"] - df["ttlb_s_median"]) * 1e3, 1),
                "added_ttfb_ms": round(f["ttfb_ms_median"] - df["ttfb_ms_median"], 2),
                "added_gap_p99_ms": round(f["gap_ms_p99"] - df["gap_ms_p99"], 2),
            }
            fast = rows[-1]["fast_stream"]
            rows[-1]["slows_fast_stream"] = (
                fast["added_ttlb_ms"] > ns.slow_ttlb_ms
                or fast["added_gap_p99_ms"] > ns.slow_gap_ms
                or fast["added_ttfb_ms"] > ns.slow_ttfb_ms
                or f["failures"] > 0
            )
        verdicts.append((mb, fits and not slowed))
    ok = [mb for mb, good in verdicts if good]
    default = min(ok) if ok else None
    # Headroom: twice the rate holds too, and the stream leaves half the quota unused.
    roomy = [
        r["memory_mb"]
        for r in rows
        if r["memory_mb"] in ok
        and not r.get("slows_fast_stream")
        and r["quota_used_by_stream"] <= ns.max_quota_used
    ]
    share = model_share(rows, default, ns)
    return {
        "assumptions": {
            "stream_rate_tokens_per_s": rate,
            "stream_lengths": lengths,
            "region": "us-east-1, first pricing tier",
            "prices": PRICES,
            "memory_headroom_mb": ns.headroom_mb,
            "headroom_if": {
                "twice_the_rate_not_slowed": True,
                "quota_used_by_stream_at_most": ns.max_quota_used,
            },
            "slowed_if": {
                "added_ttlb_ms_over": ns.slow_ttlb_ms,
                "added_gap_p99_ms_over": ns.slow_gap_ms,
                "added_ttfb_ms_over": ns.slow_ttfb_ms,
            },
            "not_included": "the model's time to first token (billed too: seconds x GB), "
            "ElastiCache, NAT and data transfer",
        },
        "table": rows,
        "default_memory_mb": default,
        "default_with_headroom_mb": min(roomy) if roomy else None,
        "model_share": share,
    }


def model_share(rows: list[dict[str, Any]], default: int | None, ns: argparse.Namespace) -> dict:
    """The gateway's Lambda cost for one streamed request beside what the model charges."""
    out: dict[str, Any] = {
        "input_tokens": ns.share_in,
        "output_tokens": ns.share_out,
        "stream_rate": ns.stream_rate,
        "models": {},
    }
    for name, (pin, pout) in MODELS.items():
        model_usd = (ns.share_in * pin + ns.share_out * pout) / 1e6
        per_mem = {}
        for r in rows:
            seconds = ns.share_out / ns.stream_rate + max(r["added_ttlb_ms"], 0) / 1e3
            per_mem[r["memory_mb"]] = {
                arch: {
                    "gateway_usd": lambda_cost(r["memory_mb"], seconds, arch),
                    "share_of_model": round(
                        lambda_cost(r["memory_mb"], seconds, arch) / model_usd, 4
                    ),
                    "share_with_rest_api": round(
                        (
                            lambda_cost(r["memory_mb"], seconds, arch)
                            + PRICES["api_gateway_rest_per_million"] / 1e6
                        )
                        / model_usd,
                        4,
                    ),
                }
                for arch in PRICES["lambda_gb_second"]
            }
        out["models"][name] = {
            "usd_per_million_in_out": [pin, pout],
            "model_usd": model_usd,
            "by_memory": per_mem,
        }
    out["default_memory_mb"] = default
    return out


# --- printing and plotting ----------------------------------------------------------------
