"""Every benchmark, once: what it answers, where it lives, what it writes, what is published.

One row per benchmark. ``python -m bench --list``, ``bench/README.md`` (written by
``python -m bench report``) and the staleness marks in the generated tables all read this list, so
a benchmark that is not here cannot be run by name, and a result that is not here is not published.

``measures`` names the repository paths whose code the benchmark's figures describe: a result
measured at a commit before the last change to any of them is older than the code it measures
(see :mod:`bench.lib.freshness`).
"""

from __future__ import annotations

from dataclasses import dataclass

# The code a request passes through, which every end-to-end figure describes.
REQUEST_PATH = (
    "hardcap_core/gateway",
    "hardcap_core/ledger",
    "hardcap_core/lua",
    "hardcap_core/providers",
    "hardcap_core/wire",
    "hardcap_core/outcome.py",
    "hardcap_core/budgets.py",
)
LEDGER = ("hardcap_core/ledger", "hardcap_core/lua")
STARTUP = (*REQUEST_PATH, "hardcap_core/config", "functions/gateway")


@dataclass(frozen=True)
class Result:
    """One result file in bench/results/ and the run that writes it."""

    file: str
    args: str  # after ``python -m bench NAME``; relative paths only
    publishes: str  # where its numbers are read (README.md, docs/*.md)


@dataclass(frozen=True)
class Benchmark:
    """A runnable benchmark: ``python -m bench NAME`` runs ``bench/QUESTION/MODULE.py``."""

    name: str
    question: str  # budget, speed, coldstart, cost, failover
    module: str
    about: str
    measures: tuple[str, ...]
    results: tuple[Result, ...] = ()
    quick: bool = True  # takes --quick

    @property
    def path(self) -> str:
        return f"bench/{self.question}/{self.module}.py"

    @property
    def dotted(self) -> str:
        return f"bench.{self.question}.{self.module}"


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "overshoot",
        "budget",
        "overshoot",
        "how far past its budget a tenant gets, per admission mode and concurrency",
        REQUEST_PATH,
        (
            Result(
                "overshoot.json",
                "--runs 1 --out bench/results/overshoot.json",
                "README.md headline; docs/benchmarks.md overshoot and goals tables",
            ),
            Result(
                "overshoot-queue-5s.json",
                "--modes p95_truncate --concurrency 128 --tenants 8 --runs 1 --queue-wait 5 "
                "--out bench/results/overshoot-queue-5s.json",
                "docs/benchmarks.md (queue wait)",
            ),
            Result(
                "overshoot-starved-queue.json",
                "--modes p95_truncate --concurrency 64,8 --tenants 8 --runs 1 --starve 2 "
                "--out bench/results/overshoot-starved-queue.json",
                "docs/benchmarks.md (starved gateway)",
            ),
            Result(
                "overshoot-starved.json",
                "--modes p95_truncate --concurrency 8 --tenants 16 --runs 1 --max-streams 128 "
                "--busy-pause 1.0,1.2 --out bench/results/overshoot-starved.json",
                "docs/design.md (starved gateway)",
            ),
            Result(
                "overshoot-starved-time-only.json",
                "--modes p95_truncate --concurrency 8 --tenants 16 --runs 1 --max-streams 128 "
                "--busy-pause 1.0,1.2 --out bench/results/overshoot-starved-time-only.json",
                "docs/design.md (starved gateway, time-only bound)",
            ),
            Result(
                "overshoot-starved-before.json",
                "--modes p95_truncate --concurrency 8 --tenants 16 --runs 1 --max-streams 128 "
                "--busy-pause 1.0,1.2 --out bench/results/overshoot-starved-before.json",
                "docs/design.md (starved gateway, before the bound)",
            ),
        ),
    ),
    Benchmark(
        "overshoot_realistic",
        "budget",
        "overshoot_realistic",
        "the overshoot with real prompt sizes (chat, RAG, agents) and an exact tokenizer beside",
        (*REQUEST_PATH, "hardcap_core/tokenize"),
        (
            Result(
                "overshoot-realistic.json",
                "--tokenizer bound,cl100k_base --out bench/results/overshoot-realistic.json",
                "docs/benchmarks.md overshoot-realistic table",
            ),
        ),
    ),
    Benchmark(
        "cut_charge",
        "budget",
        "cut_charge",
        "what a stream cut at the budget is charged against what the provider made",
        REQUEST_PATH,
        (
            Result("cut-charge.json", "", "docs/design.md (cut streams)"),
            Result(
                "cut-charge-fanout.json",
                "--fanout --out bench/results/cut-charge-fanout.json",
                "docs/design.md (cut streams under fan-out)",
            ),
            Result(
                "cut-charge-fanout-before.json",
                "--fanout --out bench/results/cut-charge-fanout-before.json",
                "docs/design.md (cut streams under fan-out, before: on an export of 9d93000)",
            ),
            Result(
                "cut-charge-fanout-starved.json",
                "--fanout --starve 2 --out bench/results/cut-charge-fanout-starved.json",
                "docs/design.md (cut streams under fan-out, starved)",
            ),
            Result(
                "cut-charge-fanout-starved-before.json",
                "--fanout --starve 2 --out bench/results/cut-charge-fanout-starved-before.json",
                "docs/design.md (cut streams under fan-out, starved, before: on 9d93000)",
            ),
        ),
    ),
    Benchmark(
        "tpm_window",
        "budget",
        "tpm_window",
        "tokens per minute: how close a tenant runs to its tokens_per_minute limit",
        REQUEST_PATH,
        (
            Result("tpm-window.json", "", "README.md; docs/benchmarks.md (tokens per minute)"),
            Result(
                "tpm-window-before.json",
                "--gateway-root BASE_CHECKOUT --out bench/results/tpm-window-before.json",
                "docs/benchmarks.md (tokens per minute, before)",
            ),
        ),
    ),
    Benchmark(
        "flush_gap",
        "budget",
        "flush_gap",
        "what a cache loss right after spending grants, the flush at the worst moment for the "
        "Lambda's rollup and for hardcap serve's timer",
        (*LEDGER, "hardcap_core/rollup", "hardcap_core/local/rollup_timer.py"),
        (Result("flush-gap.json", "", "README.md; docs/design.md (cache loss)"),),
        quick=False,
    ),
    Benchmark(
        "input_estimate",
        "budget",
        "input_estimate",
        "the input estimate the gateway reserves against what a provider bills, per request shape",
        ("hardcap_core/wire", "hardcap_core/tokenize"),
        (Result("input-estimate.json", "", "README.md; docs/design.md (input estimate)"),),
        quick=False,
    ),
    Benchmark(
        "image_rules",
        "budget",
        "image_rules",
        "what the gateway holds for an image against what its model bills, per model family",
        (
            "hardcap_core/tokenize",
            "hardcap_core/wire/media.py",
            "hardcap_core/local/mock_billing.py",
        ),
        (Result("image-rules.json", "", "docs/design.md (images per model)"),),
    ),
    Benchmark(
        "document_counts",
        "budget",
        "document_counts",
        "what the gateway holds for a PDF (its pages' text and an image of each) against what "
        "its model bills, per model family, on the real-shaped document corpus",
        (
            "hardcap_core/wire/pdf.py",
            "hardcap_core/wire/openai_input.py",
            "hardcap_core/tokenize",
            "hardcap_core/local/mock_billing.py",
            "hardcap_core/local/mock_anthropic.py",
        ),
        (Result("document-counts.json", "", "docs/design.md (files; ways past the cap: PDFs)"),),
        quick=False,
    ),
    Benchmark(
        "tool_counts",
        "budget",
        "tool_counts",
        "tool definitions, tool calls and results counted against what the provider bills, "
        "per group and encoding",
        ("hardcap_core/wire", "hardcap_core/tokenize", "hardcap_core/local/mock_billing.py"),
        (Result("tool-counts.json", "", "docs/design.md (tools)"),),
        quick=False,
    ),
    Benchmark(
        "live_config_propagation",
        "budget",
        "live_config_propagation",
        "how soon a config edit (new key, tenant disabled and enabled, routes emptied and "
        "restored, lowered budget, revoked key) reaches the gateways",
        ("hardcap_core/control", "hardcap_core/gateway"),
        (
            Result(
                "live-config-propagation.json",
                "--rounds 20 --out bench/results/live-config-propagation.json",
                "docs/benchmarks.md (config changes reaching the gateways)",
            ),
        ),
        quick=False,
    ),
    Benchmark(
        "wrk_overhead",
        "speed",
        "wrk_overhead",
        "latency and CPU the gateway adds: one worker against the mock, bare apps and proxies",
        REQUEST_PATH,
        (
            Result(
                "wrk-overhead.json",
                "--rounds 3 --profile --out bench/results/wrk-overhead.json",
                "README.md; docs/benchmarks.md wrk and speed-goals tables; docs/architecture.md",
            ),
            Result(
                "wrk-transport-ab.json",
                "--rounds 5 --targets direct,bare,aiohttp,transport,gateway --gateway-tree HEAD "
                "--base-tree BASE --out bench/results/wrk-transport-ab.json",
                "bench/results/transport-ab.md (the HTTP-client change, A/B)",
            ),
            Result(
                "wrk-pipe-ab.json",
                "--rounds 5 --block-seconds 5 --targets direct,gateway --base-tree BASE "
                "--gateway-tree HEAD --out bench/results/wrk-pipe-ab.json",
                "docs/benchmarks.md (the ledger pipe, A/B)",
            ),
            Result(
                "wrk-ab-f7d74a8.json",
                "--targets direct,gateway --base-tree BASE --rounds 3 --block-seconds 5 "
                "--out bench/results/wrk-ab-f7d74a8.json",
                "docs/benchmarks.md (this wave's request path against f7d74a8, A/B)",
            ),
            Result(
                "wrk-ab-f89f620.json",
                "--targets direct,gateway --base-tree BASE --gateway-tree HEAD --rounds 3 "
                "--block-seconds 5 --out bench/results/wrk-ab-f89f620.json",
                "docs/benchmarks.md (the hosted, stored, images, trust, tools and tracing wave "
                "against f89f620, A/B)",
            ),
            Result(
                "wrk-ab-dc83fb9.json",
                "--targets direct,gateway --base-tree BASE --gateway-tree HEAD --rounds 3 "
                "--block-seconds 5 --out bench/results/wrk-ab-dc83fb9.json",
                "docs/benchmarks.md (this session's request path against dc83fb9, A/B)",
            ),
            Result(
                "wrk-ab-hot-path-trims.json",
                "--targets direct,gateway --base-tree BASE --rounds 3 --block-seconds 5 "
                "--out bench/results/wrk-ab-hot-path-trims.json",
                "docs/benchmarks.md (the hot-path trims against the commit before them, A/B)",
            ),
            Result(
                "profile-gateway.svg",
                "--rounds 0 --profile --targets gateway",
                "README.md; docs/benchmarks.md (flame graph)",
            ),
            Result(
                "profile-gateway-stream.svg",
                "--rounds 0 --profile --targets gateway",
                "README.md (flame graph, streaming)",
            ),
        ),
    ),
    Benchmark(
        "overhead",
        "speed",
        "overhead",
        "added latency open-loop at fixed rates, one worker's saturation point, round trips",
        REQUEST_PATH,
        (
            Result(
                "overhead.json",
                "--rates 20,40,80 --stream-rates 10,20,40 --sat-rates 40,60,80,100,130,160,200,250 "
                "--block-seconds 4 --rounds 2 --out bench/results/overhead.json",
                "docs/benchmarks.md overhead and goals tables; docs/deploy.md; docs/coldstart.md",
            ),
        ),
    ),
    Benchmark(
        "hot_path",
        "speed",
        "hot_path",
        "where a request's CPU goes: the gateway's hot path per stage, beside the bare proxy",
        REQUEST_PATH,
        (
            Result(
                "hot-path.json",
                "--out bench/results/hot-path.json",
                "docs/benchmarks.md (the hot path per stage)",
            ),
        ),
    ),
    Benchmark(
        "tracing_cost",
        "speed",
        "tracing_cost",
        "gateway CPU per request with tracing off against the tree before it, and with it on",
        (*REQUEST_PATH, "hardcap_core/config"),
        (
            Result(
                "tracing-cost.json",
                "--rounds 6 --requests 800 --stream-tokens 20 "
                "--out bench/results/tracing-cost.json",
                "docs/benchmarks.md (tracing); docs/tracing.md",
            ),
        ),
    ),
    Benchmark(
        "lambda_share",
        "speed",
        "lambda_share",
        "added latency and CPU per request under Lambda's CPU share, the cache 0.5 ms away",
        REQUEST_PATH,
        (
            Result(
                "lambda-share.json",
                "--out bench/results/lambda-share.json",
                "README.md headline; docs/benchmarks.md (Lambda CPU share)",
            ),
        ),
    ),
    Benchmark(
        "live_config_ab",
        "speed",
        "live_config_ab",
        "what reading the live config table costs a request (wrk_overhead, two trees, A/B)",
        ("hardcap_core/control", "hardcap_core/gateway"),
        (
            Result(
                "wrk-live-config-ab.json",
                "--base-tree BASE --gateway-tree HEAD --rounds 3 "
                "--out bench/results/wrk-live-config-ab.json",
                "README.md (live config cost)",
            ),
        ),
    ),
    Benchmark(
        "ledger",
        "speed",
        "ledger",
        "admit+settle pairs per second from one process, and the server's µs per script call",
        LEDGER,
        (
            Result("ledger.json", "--out bench/results/ledger.json", "docs/benchmarks.md ledger"),
            Result(
                "ledger-lease.json",
                "--lease --out bench/results/ledger-lease.json",
                "docs/benchmarks.md (leases)",
            ),
            Result(
                "ledger-upstream.json",
                "--upstream-limit 100000000 --out bench/results/ledger-upstream.json",
                "docs/benchmarks.md (upstream limit)",
            ),
            Result(
                "ledger-lease-upstream.json",
                "--lease --upstream-limit 100000000 --out bench/results/ledger-lease-upstream.json",
                "docs/benchmarks.md (leases, upstream limit)",
            ),
        ),
    ),
    Benchmark(
        "lua_ab",
        "speed",
        "lua_ab",
        "the ledger's scripts of two trees against one server, alternating (A/B)",
        ("hardcap_core/lua",),
    ),
    Benchmark(
        "redis_clients",
        "speed",
        "redis_clients",
        "the ledger's calls through redis-py, pipes and other clients",
        LEDGER,
        (
            Result(
                "redis-clients.json",
                "--duration 2 --rounds 2",
                "README.md; docs/benchmarks.md (Redis clients)",
            ),
        ),
    ),
    Benchmark(
        "levers",
        "speed",
        "levers",
        "the speed levers (JSON codec, HTTP client, loop), each measured on its own",
        ("hardcap_core/json_codec.py", "hardcap_core/providers", "hardcap_core/sse.py"),
        (Result("levers.json", "", "README.md; docs/benchmarks.md levers table"),),
    ),
    Benchmark(
        "loop_lag",
        "speed",
        "loop_lag",
        "event-loop lag of gateways under load, with and without shedding",
        ("hardcap_core/gateway",),
        (
            Result("loop-lag.json", "", "docs/design.md (shedding default)"),
            Result(
                "loop-lag-shed-500.json",
                "--shed-ms 500 --out bench/results/loop-lag-shed-500.json",
                "docs/design.md (shedding at 500 ms)",
            ),
            Result(
                "loop-lag-shed-1000.json",
                "--shed-ms 1000 --out bench/results/loop-lag-shed-1000.json",
                "docs/design.md (shedding at 1000 ms)",
            ),
        ),
        quick=False,
    ),
    Benchmark(
        "tokenizer_cost",
        "speed",
        "tokenizer_cost",
        "what counting input tokens costs per request, per tokenizer",
        ("hardcap_core/tokenize", "hardcap_core/wire"),
        (
            Result(
                "tokenizer-cost.json",
                "--out bench/results/tokenizer-cost.json",
                "docs/benchmarks.md; docs/config.md (tokenizer)",
            ),
        ),
        quick=False,
    ),
    Benchmark(
        "transport_ab",
        "speed",
        "report_transport_ab",
        "the HTTP-client change's A/B tables, from the wrk, cold-start and Lambda-share results",
        ("hardcap_core/providers",),
        (
            Result(
                "transport-ab.md",
                "--out bench/results/transport-ab.md",
                "README.md (the HTTP-client change)",
            ),
        ),
        quick=False,
    ),
    Benchmark(
        "coldstart",
        "coldstart",
        "coldstart",
        "a Lambda cold start: init and first answer, per artifact and interpreter",
        STARTUP,
        (
            Result(
                "coldstart-server.json",
                "--runs 30 --artifact build/coldstart "
                "--targets artifact,artifact-no-bytecode --entries uvicorn "
                "--servers asyncio-h11,uvloop-httptools --out bench/results/coldstart-server.json",
                "docs/deploy.md; functions/gateway/run.sh",
            ),
            Result(
                "coldstart-artifact.json",
                "--runs 10 --artifact build/coldstart "
                "--targets artifact --out bench/results/coldstart-artifact.json",
                "docs/coldstart.md",
            ),
            Result(
                "coldstart-artifact-head.json",
                "--runs 10 --artifact build/coldstart "
                "--targets artifact --out bench/results/coldstart-artifact-head.json",
                "docs/coldstart.md (Now: the first response)",
            ),
            Result(
                "coldstart-artifact-before.json",
                "--runs 10 --artifact BEFORE_ARTIFACT --python python3.13 --targets artifact "
                "--out bench/results/coldstart-artifact-before.json",
                "docs/coldstart.md (before)",
            ),
            Result(
                "coldstart-artifact-breakers.json",
                "--runs 10 --artifact build/coldstart "
                "--targets artifact --out bench/results/coldstart-artifact-breakers.json",
                "docs/coldstart.md (breakers)",
            ),
            Result(
                "coldstart-transport-ab.json",
                "--artifact NEW_ARTIFACT --base-artifact BASE_ARTIFACT --python python3.13 "
                "--targets artifact,artifact-base --runs 40 "
                "--out bench/results/coldstart-transport-ab.json",
                "bench/results/transport-ab.md",
            ),
        ),
    ),
    Benchmark(
        "coldstart_phases",
        "coldstart",
        "coldstart_phases",
        "a cold start split into phases (imports, config, first answer)",
        STARTUP,
        (
            Result(
                "coldstart-phases.json",
                "--runs 8 --artifact build/coldstart "
                "--servers uvloop-httptools,asyncio-h11 --out bench/results/coldstart-phases.json",
                "docs/coldstart.md",
            ),
            Result(
                "coldstart-phases-before.json",
                "--runs 8 --artifact BEFORE_ARTIFACT --python python3.13 "
                "--servers uvloop-httptools,asyncio-h11 "
                "--out bench/results/coldstart-phases-before.json",
                "docs/coldstart.md (before)",
            ),
        ),
    ),
    Benchmark(
        "coldstart_transports",
        "coldstart",
        "coldstart_transports",
        "what importing each HTTP client costs a fresh interpreter",
        ("hardcap_core/providers",),
        (
            Result(
                "coldstart-transports.json",
                "--python python3.13 --path TRANSPORTS:NEW_ARTIFACT "
                "--base-path TRANSPORTS:BASE_ARTIFACT --runs 20 "
                "--out bench/results/coldstart-transports.json",
                "docs/coldstart.md; bench/results/transport-ab.md",
            ),
        ),
    ),
    Benchmark(
        "lambda_cost",
        "cost",
        "lambda_cost",
        "$ per request on Lambda: the gateway's CPU under each memory size's CPU share",
        REQUEST_PATH,
        (
            Result(
                "lambda-cost.json",
                "--plot --write-doc",
                "README.md; docs/cost.md; infra/template.yaml (memory size)",
            ),
            Result(
                "lambda-cost-quick.json",
                "--quick --out bench/results/lambda-cost-quick.json",
                "docs/cost.md",
            ),
            Result(
                "lambda-cost-period20ms.json",
                "--memory 128,256,512 --period-us 20000 "
                "--out bench/results/lambda-cost-period20ms.json",
                "docs/cost.md (cgroup period)",
            ),
            Result(
                "lambda-share-transport-ab.json",
                "--memory 256 --gateway-tree HEAD --base-tree BASE --rounds 5 --wrk-seconds 10 "
                "--out bench/results/lambda-share-transport-ab.json",
                "bench/results/transport-ab.md",
            ),
        ),
    ),
    Benchmark(
        "failover",
        "failover",
        "failover",
        "an upstream dying under load: errors, latency and the share moved to the other",
        (
            "hardcap_core/gateway/failover.py",
            "hardcap_core/ledger/breakers.py",
            "hardcap_core/providers",
        ),
        (
            Result(
                "failover.json",
                "--plot",
                "README.md; docs/benchmarks.md (failover)",
            ),
            Result("failover.png", "--plot", "docs/benchmarks.md (failover plot)"),
        ),
    ),
    Benchmark(
        "soak",
        "failover",
        "soak",
        "two gateways for minutes under mixed traffic and faults: memory, descriptors, crashes, "
        "the ledger against the mock's truth",
        (*REQUEST_PATH, "hardcap_core/rollup"),
        (
            Result(
                "soak.json",
                "--minutes 60 --check --out bench/results/soak.json",
                "docs/benchmarks.md (soak)",
            ),
        ),
    ),
    Benchmark(
        "live_providers",
        "failover",
        "live_providers",
        "the ledger against a provider's own reported usage (real keys, or --mock)",
        ("hardcap_core/providers", "hardcap_core/wire", "hardcap_core/gateway"),
        (
            Result(
                "live-providers-mock.json",
                "--mock --out bench/results/live-providers-mock.json",
                "README.md",
            ),
        ),
        quick=False,
    ),
)


def by_name(name: str) -> Benchmark:
    """The benchmark called ``name``; KeyError names the ones there are."""
    for b in BENCHMARKS:
        if b.name == name:
            return b
    raise KeyError(f"no benchmark {name!r}; there are: {', '.join(b.name for b in BENCHMARKS)}")


def published() -> dict[str, Benchmark]:
    """Every published result file, with the benchmark that writes it."""
    return {r.file: b for b in BENCHMARKS for r in b.results}
