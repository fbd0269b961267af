"""The upstream HTTP client's before and after (issue: aiohttp in place of the hand-written
HTTP/1.1 client) as one markdown table, generated from the A/B result files, each figure with
its file and command:

* bench/results/wrk-transport-ab.json (bench/speed/wrk_overhead.py --base-tree): gateway CPU per
  request, added p50 / p99 at one connection, a 200-token stream's added p50, CPU per token;
* bench/results/coldstart-transport-ab.json (bench/coldstart/coldstart.py --base-artifact): the
built
  artifacts' start to first response; bench/results/coldstart-transports.json: the clients'
  import and construction alone;
* bench/results/lambda-share-transport-ab.json (bench/cost/lambda_cost.py --base-tree): added
  latency under Lambda's CPU share at the template's default memory.

    python -m bench transport_ab --out bench/results/transport-ab.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
WRK, COLD = "wrk-transport-ab.json", "coldstart-transport-ab.json"
LAMBDA, CLIENTS = "lambda-share-transport-ab.json", "coldstart-transports.json"


def load(results: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((results / name).read_text())
    return data


def fmt(v: float | None, spec: str = ".2f", signed: bool = False) -> str:
    return "—" if v is None else format(v, ("+" if signed else "") + spec)


def change(before: float | None, after: float | None, spec: str) -> str:
    if before is None or after is None:
        return "—"
    pct = f" ({(after - before) / before * 100:+.0f} %)" if before > 0 else ""
    return format(after - before, "+" + spec) + pct


def paired(
    blocks: list[dict[str, Any]], kind: str, key: str, target: str = "gateway"
) -> list[float]:
    """``target`` minus ``target``_base, round by round (each round measured both)."""
    by = {(b["round"], b["kind"], b["target"]): b for b in blocks}
    out = []
    for rnd in sorted({b["round"] for b in blocks}):
        a, b = by.get((rnd, kind, target)), by.get((rnd, kind, f"{target}_base"))
        if a and b and a.get(key) is not None and b.get(key) is not None:
            out.append(round(a[key] - b[key], 2))
    return out


def spread(values: list[float], spec: str) -> str:
    if not values:
        return "—"
    return f"{format(statistics.median(values), '+' + spec)} [{', '.join(format(v, '+' + spec) for v in values)}]"  # noqa: E501


def cold_paired(cold: dict[str, Any], entry: str) -> list[float]:
    a = cold["targets"]["artifact-py3.13"]["entries"][entry]["samples"]
    b = cold["targets"]["artifact-base-py3.13"]["entries"][entry]["samples"]
    return [x["first_response_ms"] - y["first_response_ms"] for x, y in zip(a, b, strict=True)]


# Lambda share rows: label, key in the result's "ab", format, path into a round's row (for the
# per-round differences; the direct call's figure cancels in them).
LAMBDA_ROWS: list[tuple[str, str, str, str]] = [
    (
        "non-streamed, back to back, added p50 ms (wrk -c1)",
        "wrk_non_stream_added_p50_ms",
        ".2f",
        "wrk.non_stream.p50_ms",
    ),
    (
        "non-streamed, back to back, added p99 ms (wrk -c1)",
        "wrk_non_stream_added_p99_ms",
        ".1f",
        "wrk.non_stream.p99_ms",
    ),
    (
        "non-streamed, back to back, added mean ms (wrk -c1)",
        "wrk_non_stream_added_mean_ms",
        ".1f",
        "wrk.non_stream.mean_ms",
    ),
    (
        "non-streamed, each after 0.3 s idle, added p50 ms (raw-socket client)",
        "non_streamed_after_idle_added_p50_ms",
        ".2f",
        "non_streamed_isolated.wall_ms_p50",
    ),
    (
        "200-token stream, added first byte p50 ms (raw-socket client)",
        "stream_short_added_first_byte_p50_ms",
        ".2f",
        "stream_short.ttfb_ms_p50",
    ),
    (
        "200-token stream, added last byte p50 ms (raw-socket client)",
        "stream_short_added_last_byte_p50_ms",
        ".2f",
        "stream_short.wall_ms_p50",
    ),
    (
        "200-token stream, back to back, added last byte mean ms (wrk -c1)",
        "wrk_stream_added_mean_ms",
        ".1f",
        "wrk.stream.mean_ms",
    ),
    (
        "500 tokens at 100 tok/s, added first byte ms (raw-socket client)",
        "paced_added_first_byte_ms",
        ".2f",
        "paced.ttfb_ms_median",
    ),
    (
        "500 tokens at 100 tok/s, added last byte ms (raw-socket client)",
        "paced_added_last_byte_ms",
        ".1f",
        "paced.ttlb_s_median",
    ),
    (
        "gateway CPU ms per non-streamed request",
        "cpu_ms_per_request",
        ".2f",
        "non_streamed.cpu_ms_per_request",
    ),
    (
        "gateway CPU µs per relayed token (1,000- minus 200-token streams)",
        "cpu_us_per_relayed_token",
        ".1f",
        "cpu_us_per_relayed_token",
    ),
]


def _get(row: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        row = row[key]
    return row


def lambda_paired(lam: dict[str, Any], path: str) -> list[float]:
    scale = 1e3 if path.endswith("_s_median") else 1.0
    by = {(m["round"], m["variant"]): m for m in lam["memory_sizes"]}
    out = []
    for rnd in sorted({m["round"] for m in lam["memory_sizes"]}):
        a, b = by.get((rnd, "gateway")), by.get((rnd, "gateway_base"))
        if a and b:
            out.append(round((_get(a, path) - _get(b, path)) * scale, 3))
    return out


def rows(results: Path) -> tuple[list[list[str]], dict[str, Any]]:
    wrk, cold = load(results, WRK), load(results, COLD)
    lam, clients = load(results, LAMBDA), load(results, CLIENTS)
    g, b = wrk["summary"]["gateway"], wrk["summary"]["gateway_base"]
    out: list[list[str]] = []

    def add(label: str, before: Any, after: Any, spec: str, source: str,
            rounds: str = "") -> None:  # fmt: skip
        out.append([label, fmt(before, spec), fmt(after, spec), change(before, after, spec),
                    rounds, source])  # fmt: skip

    blocks = wrk["blocks"]
    wrk_rows = [
        ("Gateway CPU µs per request, non-streamed, 16 connections", "saturation",
         "sat_target_cpu_us_per_request", "target_cpu_us_per_request", ".0f"),
        ("Gateway CPU µs per request, non-streamed, 1 connection", "latency",
         "target_cpu_us_per_request", "target_cpu_us_per_request", ".0f"),
        ("Added p50 ms, non-streamed, 1 connection (vs the direct call, same round)", "latency",
         "added_p50_ms", "p50_ms", ".2f"),
        ("Added p99 ms, non-streamed, 1 connection", "latency", "added_p99_ms", "p99_ms", ".2f"),
        ("200-token stream, added p50 ms to the last byte, 1 connection", "stream",
         "stream_added_p50_ms", "p50_ms", ".2f"),
        ("CPU µs per streamed token (a 200-token stream's CPU / 200)", "stream",
         "stream_target_cpu_us_per_token", "target_cpu_us_per_token", ".1f"),
    ]  # fmt: skip
    for label, kind, key, block_key, spec in wrk_rows:
        add(label, b[key], g[key], spec, "[W]", spread(paired(blocks, kind, block_key), spec))
    add("CPU µs per streamed token, marginal ((stream - 1-token reply) / 199, 1 connection)",
        b.get("stream_marginal_cpu_us_per_token"), g.get("stream_marginal_cpu_us_per_token"),
        ".1f", "[W]")  # fmt: skip
    t0, t1 = wrk["summary"].get("transport_base"), wrk["summary"].get("transport")
    if t0 and t1:  # the client alone: bare proxies over each commit's make_transport()
        client_rows = [
            (
                "proxy CPU µs per request, non-streamed, 16 connections",
                "saturation",
                "sat_target_cpu_us_per_request",
                "target_cpu_us_per_request",
                ".0f",
            ),
            (
                "proxy CPU µs per request, non-streamed, 1 connection",
                "latency",
                "target_cpu_us_per_request",
                "target_cpu_us_per_request",
                ".0f",
            ),
            (
                "added p50 ms, non-streamed, 1 connection",
                "latency",
                "added_p50_ms",
                "p50_ms",
                ".2f",
            ),
            (
                "added p99 ms, non-streamed, 1 connection",
                "latency",
                "added_p99_ms",
                "p99_ms",
                ".2f",
            ),
            (
                "200-token stream, added p50 ms to the last byte",
                "stream",
                "stream_added_p50_ms",
                "p50_ms",
                ".2f",
            ),
            (
                "proxy CPU µs per streamed token",
                "stream",
                "stream_target_cpu_us_per_token",
                "target_cpu_us_per_token",
                ".1f",
            ),
        ]
        for label, kind, key, block_key, spec in client_rows:
            add(
                f"The client alone (a bare proxy over each commit's make_transport()): {label}",
                t0[key],
                t1[key],
                spec,
                "[W]",
                spread(paired(blocks, kind, block_key, "transport"), spec),
            )
    t = cold["targets"]
    for entry, label in (("uvicorn", "run.sh (uvicorn, the function's handler)"),
                         ("mangum", "buffered.py (Mangum)")):  # fmt: skip
        before = t["artifact-base-py3.13"]["entries"][entry]["summary"]["first_response_ms"]
        after = t["artifact-py3.13"]["entries"][entry]["summary"]["first_response_ms"]
        runs = len(t["artifact-py3.13"]["entries"][entry]["samples"])
        add(f"Cold start of the x86_64 artifact, {label}: start to first response, median ms",
            before["median"], after["median"], ".0f", "[C]",
            f"median of {runs} paired starts: {fmt(statistics.median(cold_paired(cold, entry)), '.0f', True)}")  # fmt: skip  # noqa: E501
    cand = clients["candidates"]
    for what, key in (
        ("import", "import_ms"),
        ("construction (TLS context included)", "client_ms"),
    ):
        add(f"The client alone (http11.py / aiohttp_transport.py), {what}, median ms",
            cand["hardcap_http11"]["median_ms"][key], cand["hardcap_transport"]["median_ms"][key],
            ".1f", "[K]")  # fmt: skip
    ab = lam["ab"]
    mb = lam["memory_sizes"][0]["memory_mb"]
    la, lb = ab[f"gateway@{mb}MB"], ab[f"gateway_base@{mb}MB"]
    share = lam["memory_sizes"][0]["cgroup"]["cpu_share"]
    for label, key, spec, path in LAMBDA_ROWS:
        add(
            f"Lambda CPU share at {mb} MB ({share:.3f} of a core): {label}",
            lb.get(key),
            la.get(key),
            spec,
            "[L]",
            spread(lambda_paired(lam, path), spec),
        )
    meta = {"wrk": wrk, "cold": cold, "lambda": lam, "clients": clients}
    return out, meta


def load_line(name: str, m: dict[str, Any], extra: str = "") -> str:
    mach = m["machine"]
    dirty = " (dirty)" if mach.get("git_dirty") else ""
    loads = ", ".join(f"{x:.2f}" for x in mach["load_average"])
    return (f"- `{name}`: {mach['date_utc']}, run from the checkout at "
            f"`{(mach.get('git_commit') or '?')[:10]}`{dirty}; load average at start "
            f"{loads}{extra}")  # fmt: skip


def contention(wrk: dict[str, Any]) -> str:
    blocks = wrk["blocks"]
    shares = sorted(b["cpu"]["other_share"] or 0.0 for b in blocks)
    over = sum(1 for s in shares if s > 0.25)
    retried = sum(b["contended_retries"] for b in blocks)
    median = statistics.median(shares)
    return (f"; other processes' share of the machine per block: median {median:.2f}, "
            f"max {shares[-1]:.2f}; {retried} block runs repeated for contention, {over} of "
            f"{len(blocks)} blocks still over 0.25 after 3 repeats")  # fmt: skip


NOTES = (
    "Medians over rounds (or starts); the per-round column is after minus before within one "
    "round (both measured within minutes of each other): where the two disagree, the spread "
    "is noise.",
    "[L] back to back under the quota is throttle-bound: a request that meets an exhausted "
    "quota waits out the rest of the period (the p99), and the mean follows CPU per request "
    "over the share. A 200-token stream back to back either fits in a period or straddles a "
    "throttle, so wrk's p50 for it is about 9 or about 80 ms depending on the round: only its "
    "mean is shown.",
    "First bytes in [L] come from tests/load/http1.py (raw sockets, one request in flight, outside "
    "the cgroup; its own direct-call blocks are the baseline), since wrk cannot time a first "
    "byte. The non-streamed p50/p99/mean and the stream mean of [L] are wrk's.",
    "An added figure below zero is noise: that round's direct call was slowed more than the "
    "target's.",
)


def markdown(results: Path) -> str:
    table, m = rows(results)
    wrk, cold, lam, clients = m["wrk"], m["cold"], m["lambda"], m["clients"]
    after = {wrk["gateway_tree"]["commit"], lam["trees"]["gateway"]["commit"]}
    mach = wrk["machine"]
    head = ["Figure", "Before", "After", "After - before",
            "After - before, median [each round]", "Source"]  # fmt: skip
    lines = [
        "# The upstream HTTP client, before and after (aiohttp in place of http11.py)",
        "",
        f"Before: `0579720` (the hand-written HTTP/1.1 client, `providers/http11.py`; same "
        f"dependency lock, aiohttp installed but unused). After: "
        f"`{'`, `'.join(sorted(c[:10] for c in after))}` (HEAD when the A/B runs began; runs "
        f"made later were pinned to it). The commits between also changed the ledger pipe, "
        f"SDK retry headers, SSE limits and charging, so the gateway rows are that commit "
        f"against the base; the client-alone rows isolate the HTTP client. Generated by "
        f"`python -m bench transport_ab --out bench/results/transport-ab.md`.",
        "",
        f"Machine: {mach['cpu_model']}, {mach['cpu_count']} cores shared with other engineers' "
        f"test runs (every process of a run on them: load generator, mock, Valkey, targets), "
        f"{mach['memory_gib']} GiB, Python {mach['python']} for the gateways, CPython 3.13.0 for "
        f"the artifacts. Each run alternates before and after (blocks, rounds or starts), so "
        f"both saw the same machine.",
        "",
        f"Artifacts (cold start): `{cold['parameters']['artifact']}` (after) and "
        f"`{cold['parameters']['base_artifact']}` (before), each built by `make -f "
        f"infra/Makefile build-GatewayFunction LAMBDA_ARCH=x86_64` in a worktree of the commit "
        f"its folder is named after (the same lock: aiohttp is in both), bytecode compiled by "
        f"CPython 3.13.0 as the build ships it. The gateways of [W] and [L] run from `git "
        f"archive` exports of the two commits; [W]'s `transport` / `transport_base` proxies "
        f"use each export's `make_transport()` (aiohttp, http11.py) under the same bare app.",
        "",
        load_line("wrk-transport-ab.json", wrk, contention(wrk)),
        load_line("coldstart-transport-ab.json", {"machine": {**cold["machine"],
                  "load_average": cold["load_average_before"]}},
                  f", after {', '.join(f'{x:.2f}' for x in cold['load_average_after'])}"),
        load_line("lambda-share-transport-ab.json", lam),
        load_line("coldstart-transports.json", {"machine": {**clients["machine"],
                  "load_average": clients["load_average_before"]}}),
        "",
        "| " + " | ".join(head) + " |",
        "|---|---:|---:|---:|---|---|",
    ]  # fmt: skip
    lines += ["| " + " | ".join(r) + " |" for r in table]
    lines += ["", "Sources (result file, and the command that made it, run from the repository "
              "root; each result file holds its machine info, parameters and per-block or "
              "per-run figures):", ""]  # fmt: skip
    for tag, name, data in (("W", WRK, wrk), ("C", COLD, cold), ("K", CLIENTS, clients),
                            ("L", LAMBDA, lam)):  # fmt: skip
        lines.append(f"- [{tag}] `bench/results/{name}`: `{data['command']}`")
    lines += ["", "Reading the table:", ""] + [f"- {n}" for n in NOTES]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--out", type=Path)
    ns = p.parse_args(argv)
    text = markdown(ns.results)
    if ns.out:
        ns.out.write_text(text)
        print(f"wrote {ns.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
