"""What a Lambda user sees (bench/speed/lambda_share.py's result): the latency and CPU the gateway
adds under the CPU share of the template's default memory size, the cache 0.5 ms away,
generated so docs/benchmarks.md cannot drift from the result file."""

from __future__ import annotations

from typing import Any

from bench.lib.report_format import ms, num


def _kinds(p: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return (
        ("non_stream", "not streamed, back to back (a busy environment)"),
        ("stream", f"streamed ({p.get('stream_tokens', '?')} tokens), back to back"),
        (
            "non_stream_after_idle",
            f"not streamed, {p.get('idle_ms', '?')} ms after the previous answer "
            "(an environment that is not busy)",
        ),
    )


def _cache(data: dict[str, Any]) -> str:
    """The round trip the gateway really had to the cache, and how the delay was made."""
    cache = data.get("cache") or {}
    rtt = (data.get("cache_rtt_before") or {}).get("rtt") or {}
    after = (data.get("cache_rtt_after") or {}).get("rtt") or {}
    text = (
        f"Cache round trip measured ({num(rtt.get('count'), 0)} PINGs; before / after the load): "
        f"p50 "
        f"{num(rtt.get('p50_us'), 0)} / {num(after.get('p50_us'), 0)} µs, p99 "
        f"{num(rtt.get('p99_us'), 0)} / {num(after.get('p99_us'), 0)} µs. "
    )
    if cache.get("mode") == "relay":
        error = cache.get("netem_unavailable_error") or "no netem"
        text += (
            f"The delay is a userspace relay ({num(cache.get('delay_us_each_way'), 0)} µs each "
            f"way), not `tc netem`: this machine's kernel has no netem (`tc` answered "
            f'"{error.strip()}").'
        )
    else:
        text += "The delay is `tc netem` on the veth pair to the cache's network namespace."
    return text


def lambda_share_table(data: dict[str, Any]) -> str:
    p, summary = data["parameters"], data["summary"]
    rows = [
        f"One gateway worker at {p['memory_mb']} MB's CPU share "
        f"({p['cpu_share'] * 100:.1f}% of one vCPU: {p['cpu_quota_us']:,} µs per "
        f"{p['period_us']:,} µs period), one request in flight, {p['rounds']} rounds "
        "(medians over rounds; added = through the gateway minus straight to the mock):",
        "",
        "| Load | Added p50 | Added p99 | Gateway CPU per request | Throttled periods |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, label in _kinds(p):
        s = summary.get(kind)
        if not s:
            continue
        rows.append(
            f"| {label} | {ms(s['added_p50_ms'])} | {ms(s['added_p99_ms'])} "
            f"| {num(s['gateway_cpu_ms_per_request'], 2)} ms | {num(s['throttled_periods'], 0)} |"
        )
    rows += ["", _cache(data)]
    return "\n".join(rows)
