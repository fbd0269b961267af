"""The speed tables of bench/report.py: what the gateway adds beside the direct call and bare
apps (bench/results/wrk-overhead.json), the speed goals met or missed, and the
smaller levers (bench/results/levers.json). Each output depends only on its JSON."""

from __future__ import annotations

from typing import Any

from bench.lib.report_format import num

WRK_LABELS = {
    "direct": "the mock, called directly",
    "bare": "bare Starlette app, fixed JSON",
    "httpx": "bare proxy over httpx 0.28",
    "httpx_aiohttp": "bare proxy over httpx + aiohttp transport",
    "aiohttp": "bare proxy over aiohttp",
    "httpx2": "bare proxy over httpx2",
    "transport": "bare proxy over the gateway's transport (aiohttp + policy)",
    "gateway": "**the gateway** (one worker)",
}


def wrk_tables(data: dict[str, Any], source: str) -> str:
    """What the gateway adds, beside the direct call and bare apps in the same run (wrk)."""
    summary = data["summary"]
    p = data["parameters"]
    m = data["machine"]
    rows = [
        "| target | req/s, " + str(p["connections"]) + " connections | x bare app | CPU µs per "
        "request | added p50 / p99, 1 connection | " + str(p["stream_tokens"]) + "-token stream: "
        "added p50 | CPU µs per streamed token |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in (t for t in WRK_LABELS if t in summary):
        r = summary[name]
        added = "—"
        if r.get("added_p50_ms") is not None and name not in ("direct", "bare"):
            added = f"+{r['added_p50_ms']:.2f} / +{r['added_p99_ms']:.2f} ms"
        stream = "—"
        if r.get("stream_added_p50_ms") is not None and name != "direct":
            stream = f"{r['stream_added_p50_ms']:+.2f} ms"
        per_token = r.get("stream_target_cpu_us_per_token")
        rows.append(
            f"| {WRK_LABELS[name]} | {num(r.get('sat_requests_per_second'), 0)} "
            f"| {num(r.get('sat_ratio_to_bare'), 3)} "
            f"| {num(r.get('sat_target_cpu_us_per_request'), 0)} | {added} | {stream} "
            f"| {num(per_token, 1)} |"
        )
    rows += [
        "",
        f"From {source} (`{data['command']}`, {p['rounds']} rounds of {p['block_seconds']:g} s "
        f"blocks, medians; gateway at commit `{str(_gateway_commit(data))[:10]}`), "
        f"{m.get('cpu_model', '?')}, {m.get('cpu_count', '?')} cores shared by wrk, the mock, "
        "Valkey and the target: CPU µs per request (the target process's own CPU time over the "
        "requests it served) is the figure that travels; req/s is bounded by the machine. An "
        "added figure below zero is noise: that round's direct calls were slowed by more "
        "than the target's (every target calls the same mock).",
    ]
    return "\n".join(rows)


def _stream_added(added: float) -> tuple[str, bool | None]:
    """The stream's added p50 and whether it meets the goal; below zero it tells nothing (the
    gateway calls the same mock: the run's direct streams were slowed by something else)."""
    if added < 0:
        return f"{added:+.2f} ms (below zero: noise in the direct call, no verdict)", None
    return f"{added:+.2f} ms", added <= 1.5


def speed_goals_table(data: dict[str, Any]) -> str:
    """Issue 13's speed goals against the wrk run."""
    g = data["summary"].get("gateway", {})
    bare = data["summary"].get("bare", {})
    needed = ("added_p50_ms", "added_p99_ms", "stream_added_p50_ms", "sat_ratio_to_bare",
              "stream_target_cpu_us_per_token", "sat_requests_per_second")  # fmt: skip
    if any(g.get(k) is None for k in needed):
        return "(the run holds no complete gateway figures yet)"
    cpu = g.get("sat_target_cpu_us_per_request")
    per_worker = 1e6 / cpu if cpu else None
    rows_in: list[tuple[str, str, str, bool | None]] = [
        ("Added p50, not streamed, 1 connection", "<= 0.6 ms",
         f"+{g['added_p50_ms']:.2f} ms", g["added_p50_ms"] <= 0.6),
        ("Added p99, not streamed, 1 connection", "<= 1.0 ms",
         f"+{g['added_p99_ms']:.2f} ms", g["added_p99_ms"] <= 1.0),
        ("200-token stream, added p50", "<= 1.5 ms", *_stream_added(g["stream_added_p50_ms"])),
        ("Gateway CPU per relayed token", "<= 7 µs",
         f"{g['stream_target_cpu_us_per_token']:.1f} µs", g["stream_target_cpu_us_per_token"] <= 7),
        ("One worker, not streamed (1 s of CPU / CPU per request)", ">= 2,000 req/s",
         f"{num(per_worker, 0)} req/s ({num(cpu, 0)} µs each)",
         per_worker is not None and per_worker >= 2000),
        ("One worker against the bare app, same run", ">= 0.16x",
         f"{g['sat_ratio_to_bare']:.3f}x ({num(g['sat_requests_per_second'], 0)} vs "
         f"{num(bare.get('sat_requests_per_second'), 0)} req/s)", g["sat_ratio_to_bare"] >= 0.16),
    ]  # fmt: skip
    rows = ["| Goal | Target | Measured | |", "|---|---|---|---|"]
    for goal, target, measured, ok in rows_in:
        verdict = "inconclusive" if ok is None else ("met" if ok else "**missed**")
        rows.append(f"| {goal} | {target} | {measured} | {verdict} |")
    return "\n".join(rows)


LEVER_ROWS = (
    ("chunk", "json_us", "orjson_us", "decode + re-encode a provider chunk", "json", "orjson",
     "orjson"),
    ("log", "powertools_log_line_us", "emf_line_with_log_fields_us", "the request's log line",
     "a Powertools Logger line", "the EMF line carrying the log fields", "the EMF line"),
    ("asgi", "starlette_with_middleware_us", "direct_endpoint_us", "routing a request",
     "Starlette + middleware", "calling the endpoint", "Starlette: ~20 µs of ~2 ms"),
    ("client", "aiohttp_cpu_us", "hardcap_transport_cpu_us", "client CPU per upstream POST",
     "a bare aiohttp session (httpx {httpx_cpu_us}, httpx2 {httpx2_cpu_us})",
     "the gateway's transport (aiohttp + its checks)", "the gateway's transport (aiohttp)"),
)  # fmt: skip


def levers_table(data: dict[str, Any], source: str) -> str:
    """The smaller levers, as CPU µs per operation (bench/speed/levers.py)."""
    res = data["results"]
    rows = ["| lever | one way | µs | the other | µs | chosen |",
            "|---|---|---:|---|---:|---|"]  # fmt: skip
    for group, one, other, what, one_name, other_name, chosen in LEVER_ROWS:
        r = res.get(group, {})
        if one not in r or other not in r:
            continue
        named = one_name.format(**{k: num(v, 0) for k, v in r.items()})
        rows.append(f"| {what} | {named} | {num(r[one], 1)} | {other_name} | {num(r[other], 1)} "
                    f"| {chosen} |")  # fmt: skip
    m = data["machine"]
    rows += ["", f"CPU time per operation, best of three runs, from {source} (`{data['command']}`, "
                 f"{m.get('cpu_model', '?')}, {m.get('cpu_count', '?')} cores)."]  # fmt: skip
    return "\n".join(rows)


def _gateway_commit(data: dict[str, Any]) -> str | None:
    """The commit the gateway ran: its own tree's when the run was given one, else the run's."""
    tree = data.get("gateway_tree") or {}
    return tree.get("commit") or (data.get("machine") or {}).get("git_commit")
