"""The load clients' retry rules (the official openai SDK's) and the per-cell summaries the
overshoot benchmark reports: queue-wait percentiles, budget spent before the first refusal."""

from __future__ import annotations

import random
from typing import Any

from bench.budget.budget_runs import BUDGET, before_first_refusal, summarize
from tests.load import sdk_retry
from tests.load.harness import TenantRun, percentile, queue_wait_ms


def test_a_server_delay_up_to_two_minutes_is_waited_as_given_milliseconds_first() -> None:
    assert sdk_retry.retry_delay_s(0, {"retry-after-ms": "250", "retry-after": "1"}) == 0.25
    assert sdk_retry.retry_delay_s(1, {"retry-after": "3"}) == 3.0
    assert sdk_retry.retry_delay_s(0, {"retry-after": "120"}) == 120.0


def test_without_a_usable_server_delay_the_backoff_doubles_from_half_a_second_to_eight() -> None:
    rng = random.Random(5)
    for headers in ({}, {"retry-after": "0"}, {"retry-after": "121"}, {"retry-after": "soon"}):
        for taken, full in ((0, 0.5), (1, 1.0), (2, 2.0), (4, 8.0), (9, 8.0)):
            delay = sdk_retry.retry_delay_s(taken, headers, rng)
            assert 0.75 * full <= delay <= full  # less a random 0-25 %


def test_busy_rate_limited_overloaded_and_lost_connections_are_retried() -> None:
    assert sdk_retry.should_retry(429, {"retry-after": "1"})
    assert sdk_retry.should_retry(503, {"x-should-retry": "true", "retry-after": "1"})
    assert sdk_retry.should_retry(500, {})
    assert sdk_retry.should_retry(408, {}) and sdk_retry.should_retry(409, {})
    assert sdk_retry.should_retry(None, {})  # no answer: a connection error or timeout


def test_the_server_can_forbid_a_retry_and_other_client_errors_are_not_retried() -> None:
    assert not sdk_retry.should_retry(429, {"x-should-retry": "false"})  # budget_exceeded
    assert sdk_retry.should_retry(400, {"x-should-retry": "true"})
    assert not sdk_retry.should_retry(400, {})
    assert not sdk_retry.should_retry(429, {"retry-after": "121"})  # longer than 2 minutes


def test_percentiles_are_nearest_rank_and_absent_queue_headers_count_as_no_wait() -> None:
    assert percentile([], 0.5) is None
    waits = [0] * 98 + [40, 900]
    assert percentile(waits, 0.5) == 0
    assert percentile(waits, 0.99) == 40
    assert percentile(waits, 1.0) == 900
    assert queue_wait_ms({}) == 0
    assert queue_wait_ms({"x-hardcap-queue-wait-ms": "1250"}) == 1250
    assert queue_wait_ms({"x-hardcap-queue-wait-ms": "junk"}) == 0


def test_a_runs_json_summarizes_its_queue_waits_instead_of_listing_them() -> None:
    run = TenantRun("t0", queue_waits_ms=[0, 0, 30])
    out = run.as_json()
    assert "queue_waits_ms" not in out
    assert out["queue_wait_ms"] == {"answers": 3, "waited": 1, "p50": 0.0, "p99": 30.0, "max": 30}


def test_budget_spent_before_the_first_refusal_is_what_the_mock_had_generated_then() -> None:
    first = {"outcome": "budget_busy", "at_s": 1.2, "ground_truth_tokens": BUDGET // 2}
    assert before_first_refusal(first, BUDGET) == 0.5
    assert before_first_refusal(None, BUDGET - 100) == round((BUDGET - 100) / BUDGET, 6)
    assert before_first_refusal({"outcome": "overloaded", "fetch_error": "x"}, BUDGET) is None


def _tenant_run(before: float | None, failed: int) -> dict[str, Any]:
    client = TenantRun("t", busy=3, failed=failed, completed=10, seconds=2.0).as_json()
    return {
        "budget": BUDGET,
        "ground_truth": {"total_tokens": BUDGET - 10, "aborted": 1, "requests": 14},
        "ledger": {"used": BUDGET - 10, "reserved": 0},
        "client": client,
        "overshoot_ground_truth": -0.0005,
        "overshoot_ledger": -0.0005,
        "usable": 0.9995,
        "usable_before_first_refusal": before,
        "ledger_minus_truth": 0,
    }


def test_a_cell_summary_reports_the_new_columns_over_its_tenant_runs() -> None:
    runs = [_tenant_run(0.97, 1), _tenant_run(0.91, 3), _tenant_run(None, 0)]
    s = summarize(runs, [0] * 50 + [200] * 50)
    assert s["usable_before_refusal_mean"] == 0.94  # the run whose fetch failed is left out
    assert s["usable_before_refusal_min"] == 0.91
    assert s["failed_per_tenant"] == round(4 / 3, 6)
    assert (s["queue_wait_p50_ms"], s["queue_wait_p99_ms"]) == (0.0, 200.0)
    assert s["queue_waited_share"] == 0.5
    empty = summarize(runs)
    assert empty["queue_wait_p50_ms"] is None and empty["queue_waited_share"] is None
