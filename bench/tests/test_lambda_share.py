"""bench/speed/lambda_share.py's pure parts: the memory size it reads from the template, the CPU
quota it derives, the relay's delay line and calibration, the summary, the recorded command.
Nothing here is timed: when a chunk leaves is checked against the clock values given."""

from __future__ import annotations

import socket

from bench.lib.delay_relay import DelayLine, _Direction
from bench.speed.lambda_share import (
    TEMPLATE,
    cpu_quota_us,
    distribution_us,
    next_delay_us,
    recorded_command,
    summarize,
    template_memory_mb,
)

PARAMETERS = """Parameters:
  Architecture:
    Type: String
    Default: arm64
  MemorySize:
    Type: Number
    # a comment
    Default: 384
    MinValue: 128
Resources:
  Rollup:
    Properties:
      MemorySize: 256
"""


def test_the_memory_size_is_the_templates_parameter_default() -> None:
    assert template_memory_mb(PARAMETERS) == 384
    assert 128 <= template_memory_mb(TEMPLATE.read_text()) <= 10240  # the real one parses


def test_the_quota_is_lambdas_share_of_one_vcpu() -> None:
    assert cpu_quota_us(1769, 100_000) == 100_000
    assert cpu_quota_us(256, 100_000) == 14_471
    assert cpu_quota_us(1, 100_000) == 1000  # the kernel's minimum


def test_a_chunk_leaves_at_its_time_in_order_and_chunks_due_together_leave_as_one() -> None:
    line = DelayLine(0.00025)
    line.push(1.0, b"a")
    line.push(1.0001, b"b")
    line.push(1.001, b"c")
    assert line.pop_due(1.0002) == (b"", None)  # nothing before its time
    assert line.next_due() == 1.00025
    data, first = line.pop_due(1.00036)
    assert (data, first) == (b"ab", 1.00025)
    assert len(line) == 1
    assert line.pop_due(1.00125) == (b"c", 1.00125)
    assert line.next_due() is None


def test_calibration_splits_the_excess_over_both_hops_and_never_goes_negative() -> None:
    assert next_delay_us(250, 616.0, 500) == 192
    assert next_delay_us(200, 450.0, 500) == 225
    assert next_delay_us(10, 2000.0, 500) == 0


def test_distribution_is_nearest_rank_in_microseconds() -> None:
    got = distribution_us([i / 1e6 for i in range(1, 101)])
    assert (got["count"], got["p50_us"], got["p99_us"], got["max_us"]) == (100, 50.0, 99.0, 100.0)
    assert distribution_us([]) == {"count": 0}


def _block(kind: str, target: str, rnd: int, p50: float, p99: float) -> dict[str, object]:
    row: dict[str, object] = {"kind": kind, "target": target, "round": rnd, "requests": 10}
    row.update({"p50_ms": p50, "p99_ms": p99, "mean_ms": p50, "problems": {}})
    if target == "gateway":
        row["gateway_cpu_ms_per_request"] = 1.0 + rnd
        row["throttling"] = {"nr_throttled": 2}
    return row


def test_added_latency_is_against_the_direct_call_of_the_same_round_median_over_rounds() -> None:
    blocks = [
        _block("stream", "direct", 0, 10.0, 20.0),
        _block("stream", "gateway", 0, 13.0, 30.0),
        _block("stream", "direct", 1, 50.0, 60.0),  # a busy round: its own baseline
        _block("stream", "gateway", 1, 54.0, 100.0),
        _block("stream", "direct", 2, 10.0, 20.0),
        _block("stream", "gateway", 2, 15.0, 25.0),
    ]
    s = summarize(blocks)["stream"]
    assert (s["added_p50_ms"], s["added_p99_ms"]) == (4.0, 10.0)
    assert s["gateway_cpu_ms_per_request"] == 2.0
    assert (s["requests"], s["throttled_periods"]) == (30, 6)


def test_the_recorded_command_has_no_absolute_path() -> None:
    inside = str(TEMPLATE.parents[1] / "bench" / "results" / "x.json")
    cmd = recorded_command(["--quick", "--out", "/tmp/x.json", "--rounds=2", f"--out={inside}"])
    assert cmd == "python -m bench lambda_share --quick --rounds=2 --out bench/results/x.json"


def test_the_relay_passes_every_byte_in_order_and_the_end_of_the_stream() -> None:
    client, relay_in = socket.socketpair()
    relay_out, upstream = socket.socketpair()
    late: list[float] = []
    _Direction(relay_in, relay_out, 0.0002, late).start()
    sent = [bytes([i]) * (i + 1) for i in range(50)]
    for piece in sent:
        client.sendall(piece)
    client.shutdown(socket.SHUT_WR)
    got = b""
    while piece := upstream.recv(65536):
        got += piece
    assert got == b"".join(sent)
    assert late and all(x >= 0 for x in late)  # none left before its time
    for s in (client, relay_in, relay_out, upstream):
        s.close()
