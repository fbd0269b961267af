"""The tables that were still typed by hand (tokens per minute, the Lambda CPU share, config
propagation, the cold start's current figure) come from their result JSON: a changed result
changes the rows, and ``python -m bench report`` writes each into its page's markers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import report
from bench.lib.report_coldstart import coldstart_now
from bench.lib.report_headline import headline_table
from bench.lib.report_lambda import lambda_share_table
from bench.lib.report_propagation import propagation_table
from bench.lib.report_tpm import tpm_table


def _tpm(commit: str, worst: int, over: float, used: int, limited: int, cut: int) -> dict[str, Any]:
    return {
        "command": "python -m bench tpm_window",
        "machine": {"git_commit": "6800dbe4bf40d7b6a7cc3ebc85b13661dc96c341"},
        "parameters": {"gateway_commit": commit, "tokens_per_minute": 20_000, "seconds": 180.0},
        "ground_truth": {
            "worst_60s_tokens": worst,
            "worst_60s_over_limit": over,
            "first_60s_tokens": worst - 30,
            "total_tokens": 54_000,
        },
        "ledger": {"used": used},
        "client": {"rate_limited": limited, "truncated": cut},
        "goal": {"max_over_limit": 0.01},
    }


BEFORE = _tpm("301fc86b1ac7", 38_253, 0.91265, 78_851, 15_304, 0)
NOW = _tpm("6800dbe4bf40", 19_604, -0.0198, 59_291, 2_514, 14)


def test_tpm_rows_are_the_results_figures_and_an_overshoot_is_bold() -> None:
    text = tpm_table({"tpm-window.json": NOW, "tpm-window-before.json": BEFORE})
    assert text.splitlines()[2:4] == [
        "| token bucket (`301fc86`, `bench/results/tpm-window-before.json`) | 38,253 "
        "| **+91.27%** | 38,223 | 78,851 | 15,304 | 0 |",
        "| sliding window over reservations (`6800dbe`, `bench/results/tpm-window.json`) "
        "| 19,604 | -1.98% | 19,574 | 59,291 | 2,514 | 14 |",
    ]
    # 54,000 tokens in 180 s is 18,000 a minute: 90% of a 20,000-token limit.
    assert "54,000 tokens: 90% of its limit on average." in text
    only_now = tpm_table({"tpm-window.json": NOW})
    assert "token bucket" not in only_now and "sliding window" in only_now


def _kind(p50: float, p99: float, cpu: float, throttled: int) -> dict[str, Any]:
    return {
        "added_p50_ms": p50,
        "added_p99_ms": p99,
        "gateway_cpu_ms_per_request": cpu,
        "throttled_periods": throttled,
    }


LAMBDA: dict[str, Any] = {
    "command": "python -m bench lambda_share",
    "machine": {"git_commit": "d39fbf8ab9ad891d339c9137bde1b238013316b4"},
    "parameters": {
        "memory_mb": 256,
        "cpu_share": 0.1447,
        "cpu_quota_us": 14471,
        "period_us": 100000,
        "rounds": 4,
        "stream_tokens": 200,
        "idle_ms": 100,
    },
    "cache": {
        "mode": "relay",
        "delay_us_each_way": 204,
        "netem_unavailable_error": "Error: Specified qdisc kind is unknown.\n",
    },
    "cache_rtt_before": {"rtt": {"count": 2000, "p50_us": 510.7, "p99_us": 9310.5}},
    "cache_rtt_after": {"rtt": {"count": 2000, "p50_us": 529.0, "p99_us": 3971.0}},
    "summary": {
        "non_stream": _kind(7.331, 55.928, 1.565, 378),
        "stream": _kind(18.23, 139.263, 5.781, 374),
        "non_stream_after_idle": _kind(5.555, 8.505, 2.115, 0),
    },
}


def test_lambda_share_has_a_row_per_load_and_says_how_the_cache_was_delayed() -> None:
    text = lambda_share_table(LAMBDA)
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    assert rows == [
        "| not streamed, back to back (a busy environment) | +7.33 ms | +55.93 ms | 1.56 ms "
        "| 378 |",
        "| streamed (200 tokens), back to back | +18.23 ms | +139.26 ms | 5.78 ms | 374 |",
        "| not streamed, 100 ms after the previous answer (an environment that is not busy) "
        "| +5.55 ms | +8.51 ms | 2.12 ms | 0 |",
    ]
    assert "256 MB's CPU share (14.5% of one vCPU" in text
    assert "p50 511 / 529 µs, p99 9,310 / 3,971 µs" in text
    assert "not `tc netem`: this machine's kernel has no netem (`tc` answered \"Error: " in text
    netem = {**LAMBDA, "cache": {"mode": "netem"}}
    assert "The delay is `tc netem`" in lambda_share_table(netem)


def test_the_headline_gives_the_idle_and_the_back_to_back_lambda_rows_each_named() -> None:
    rows = headline_table({"lambda-share.json": LAMBDA}).splitlines()[2:4]
    assert rows[0].startswith("| Added latency p50 / p99 under Lambda's CPU share (256 MB)")
    assert "an environment that is not busy | +5.55 / +8.51 ms, 2.12 ms CPU" in rows[0]
    assert "requests back to back | +7.33 / +55.93 ms, 1.56 ms CPU" in rows[1]


PROPAGATION: dict[str, Any] = {
    "command": "python -m bench live_config_propagation --rounds 20",
    "machine": {"git_commit": "840cf7f0a8124d1a366251ae1b6fcb8d275fbab4"},
    "parameters": {"rounds": 20, "instances": 2, "goal_s": 5.0},
    "summary": {
        "new_key": {"instances_x_rounds": 40, "median_ms": 89.4, "max_ms": 115.7},
        "lowered_budget": {"instances_x_rounds": 40, "median_ms": 70.4, "max_ms": 5095.7},
        "revoked_key": {"instances_x_rounds": 40, "median_ms": 77.7, "max_ms": 124.1},
    },
}


def test_propagation_rows_and_a_change_past_the_goal_is_marked() -> None:
    text = propagation_table(PROPAGATION)
    assert text.startswith("2 gateway instances, 20 rounds;")
    assert "(goal: 5 s)" in text
    rows = text.splitlines()[4:]
    assert rows == [
        "| a new key: until its first 200 | 89 ms | 116 ms | 40 | yes |",
        "| a lowered budget: until the first 429 | 70 ms | 5,096 ms | 40 | **no** |",
        "| a revoked key: until the first 401 | 78 ms | 124 ms | 40 | yes |",
    ]


def _entry(start: str, first: str, a: float, b: float, total: tuple[float, ...]) -> dict[str, Any]:
    return {
        "summary": {
            start: {"median": a},
            first: {"median": b},
            "first_response_ms": dict(zip(("median", "p90", "max"), total, strict=True)),
        }
    }


COLDSTART: dict[str, Any] = {
    "command": "python -m bench coldstart --runs 10 --artifact build/coldstart --targets artifact",
    "machine": {"git_commit": "5605f7829a2b0b1780700ef799a796b0d67d21b7"},
    "parameters": {"runs": 10},
    "targets": {
        "artifact-py3.13": {
            "interpreter": {"python": "3.13.0 (main, May  9 2026) [GCC 12.2.0]"},
            "entries": {
                "uvicorn": _entry(
                    "ready_ms", "first_request_ms", 446.95, 19.68, (470.75, 552.8, 710.7)
                ),
                "mangum": _entry(
                    "init_ms", "first_invoke_ms", 332.59, 18.88, (435.81, 450.5, 466.9)
                ),
            },
        }
    },
}


def test_coldstart_now_is_each_entry_s_first_response() -> None:
    rows = coldstart_now(COLDSTART).splitlines()[4:]
    assert rows == [
        "| artifact-py3.13 (CPython 3.13.0) | uvicorn (`run.sh`, streaming) | 447 | 20 | **471** "
        "| 553 | 711 |",
        "| artifact-py3.13 (CPython 3.13.0) | Mangum (`buffered.handler`) | 333 | 19 | **436** "
        "| 450 | 467 |",
    ]


def test_report_writes_each_block_into_its_page_and_leaves_a_missing_one_as_is(
    tmp_path: Path,
) -> None:
    for name, data in (
        ("tpm-window.json", NOW),
        ("tpm-window-before.json", BEFORE),
        ("lambda-share.json", LAMBDA),
        ("coldstart-artifact-head.json", COLDSTART),
    ):
        (tmp_path / name).write_text(json.dumps(data))
    doc, cold = tmp_path / "benchmarks.md", tmp_path / "coldstart.md"
    doc.write_text(
        "<!-- bench:tpm-window -->\nold\n<!-- /bench:tpm-window -->\n"
        "<!-- bench:lambda-share -->\nold\n<!-- /bench:lambda-share -->\n"
        "<!-- bench:live-config-propagation -->\nnot run yet\n"
        "<!-- /bench:live-config-propagation -->\n"
    )
    cold.write_text(
        "# Cold start\n\nNow:\n\n<!-- bench:coldstart-now -->\n<!-- /bench:coldstart-now -->\n"
    )
    args = ["--results", str(tmp_path), "--doc", str(doc), "--coldstart-doc", str(cold)]
    args += ["--readme", str(tmp_path / "R.md"), "--catalogue", str(tmp_path / "bench-README.md")]
    assert report.main(args) == 0
    text = doc.read_text()
    assert "| 19,604 | -1.98% |" in text and "| 38,253 | **+91.27%** |" in text
    assert "_`tpm-window-before.json`: measured at `6800dbe4bf`" in text
    assert "| +5.55 ms | +8.51 ms | 2.12 ms | 0 |" in text
    assert "_`lambda-share.json`: measured at `d39fbf8ab9`" in text
    assert "\nold\n" not in text
    # No propagation result: its block stays as the page had it.
    assert "<!-- bench:live-config-propagation -->\nnot run yet\n" in text
    now = cold.read_text()
    assert now.startswith("# Cold start\n\nNow:\n\n<!-- bench:coldstart-now -->\nProcess start")
    assert "| **471** | 553 | 711 |" in now
    assert "_`coldstart-artifact-head.json`: measured at `5605f7829a`" in now
