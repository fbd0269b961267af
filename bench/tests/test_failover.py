"""The failover benchmark's and the live check's verdicts: how a streamed reply is classified,
which windows the kill phase's requests fall in, what fails the check, and the usage a
provider reported, read off its own reply."""

from __future__ import annotations

import argparse
import json
from typing import Any

from bench.failover import failover_load as load
from bench.failover.failover_report import check, phase_b_report
from bench.failover.live_providers import reported_usage


def sse(*events: Any) -> bytes:
    out = b""
    for e in events:
        out += b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n"
    return out


CHUNK = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
FINISH = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
ERROR = {"error": {"message": "gone", "type": "server_error", "code": "upstream_error"}}


def test_a_whole_stream_is_ok_and_carries_its_charge() -> None:
    body = sse(CHUNK, FINISH, USAGE, "[DONE]")
    assert load.classify(200, body, complete=True) == ("ok", None, 7)


def test_a_stream_ended_by_an_error_event_is_not_a_dropped_one() -> None:
    assert load.classify(200, sse(CHUNK, ERROR), complete=True) == (
        "error_event",
        "upstream_error",
        None,
    )


def test_a_stream_without_done_or_an_error_event_was_dropped() -> None:
    assert load.classify(200, sse(CHUNK), complete=True)[0] == "dropped"
    # Even with [DONE] in hand, a transfer that did not end cleanly is dropped.
    assert load.classify(200, sse(CHUNK, FINISH, "[DONE]"), complete=False)[0] == "dropped"


def test_an_error_status_is_named_with_its_code() -> None:
    body = json.dumps(ERROR).encode()
    assert load.classify(503, body, complete=True) == ("http_503", "upstream_error", None)


def shot(i: int, sent: float, done: float, outcome: str, served: str | None) -> load.Shot:
    s = load.Shot(f"k-{i}", 0, sent, sent=sent, first_byte=sent + 0.01, done=done)
    s.outcome, s.served_by = outcome, served
    return s


def kill_phase(shots: list[load.Shot], kill_at: float) -> dict[str, Any]:
    ns = argparse.Namespace(phase_seconds=10.0)
    watch = load.BreakerWatch("redis://unused", "hc:{brk:primary}")
    return phase_b_report(shots, 0.0, kill_at, ns, watch)


def result_with(phase_kill: dict[str, Any], failed_503: int = 0, left: int = 0) -> dict[str, Any]:
    a = load.summarize([shot(0, 0.0, 0.2, "ok", "primary")])
    a["failed"] = failed_503
    return {
        "phase_503": {"all": a},
        "phase_kill": phase_kill,
        "settled": {"phase_kill": {"live_reservations": left}},
    }


def test_the_kill_phase_splits_requests_at_the_kill_and_passes_when_only_in_flight_failed() -> None:
    shots = [
        shot(0, 1.0, 1.2, "ok", "primary"),  # done before the kill at 5 s
        shot(1, 4.9, 5.05, "error_event", "primary"),  # in flight on the primary
        shot(2, 4.95, 5.2, "ok", "secondary"),  # in flight, but not on the primary
        shot(3, 5.1, 5.4, "ok", "secondary"),  # sent after the kill
    ]
    b = kill_phase(shots, 5.0)
    assert b["done_before_kill"]["requests"] == 1
    assert b["in_flight_at_kill"]["requests"] == 2
    assert b["in_flight_failed"]["count"] == 1
    assert b["sent_after_kill"]["requests"] == 1 and b["sent_after_kill"]["failed"] == 0
    assert check(result_with(b))["passed"]


def test_the_check_fails_on_a_request_sent_after_the_kill_that_failed() -> None:
    b = kill_phase([shot(0, 5.1, 5.2, "http_502", None)], 5.0)
    verdict = check(result_with(b))
    assert verdict["failed_sent_after_kill"] == 1 and not verdict["passed"]


def test_the_check_fails_on_a_dropped_stream_a_503_phase_failure_or_a_reservation_left() -> None:
    dropped = kill_phase([shot(0, 4.9, 5.1, "dropped", "primary")], 5.0)
    verdict = check(result_with(dropped))
    assert verdict["dropped_streams"] == 1 and not verdict["passed"]
    clean = kill_phase([shot(0, 1.0, 1.2, "ok", "primary")], 5.0)
    assert not check(result_with(clean, failed_503=1))["passed"]
    assert not check(result_with(clean, left=1))["passed"]


def test_the_breaker_timeline_starts_with_the_state_in_force() -> None:
    watch = load.BreakerWatch("redis://unused", "k")
    watch.changes = [(1.0, "closed", 0), (2.0, "closed", 3), (12.0, "open", 5), (30.0, "closed", 0)]
    assert watch.timeline(10.0, 20.0) == [
        {"t": 0.0, "state": "closed", "failures": 3},
        {"t": 2.0, "state": "open", "failures": 5},
    ]


def test_usage_a_provider_reported_openai_and_anthropic_shapes() -> None:
    whole = {"usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}}
    assert reported_usage(json.dumps(whole).encode()) == {"input": 11, "output": 4}
    assert reported_usage(sse(CHUNK, USAGE, "[DONE]")) == {"input": 5, "output": 2}
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 3,
             "cache_read_input_tokens": 10, "cache_creation_input_tokens": 2,
             "output_tokens": 1}}}  # fmt: skip
    delta = {"type": "message_delta", "usage": {"output_tokens": 9}}
    assert reported_usage(sse(start, delta)) == {"input": 15, "output": 9}
    assert reported_usage(sse(CHUNK)) is None
