"""Per-request operational metrics of the gateway, as one CloudWatch EMF line on stdout.

Two dimension sets, both low-cardinality (an outcome has a handful of values, an upstream is a
name from the config): [Outcome] gets Requests and QueueWait (how long the request waited in
its tenant's admission queue, 0 when it did not); [Upstream] gets Requests and AddedLatency.
Tenants, keys, users and models are never dimensions here: per-tenant spend comes from the rollup
(:mod:`hardcap_core.rollup.metrics`), which aggregates first and so costs a fraction of this.

The line is formatted by hand rather than through Powertools Metrics: it runs on every request,
and Powertools needs ~97 µs for the two providers this takes (it writes one metric directive
per object, and the two sets carry different metrics) against ~2 µs for the f-string below,
measured with ``timeit`` on the development machine. The shape is the one Powertools writes
(namespace, ``Timestamp`` in epoch ms, values at the root), with no ``service`` dimension; a
test parses it as the dashboard reads it. ``POWERTOOLS_METRICS_DISABLED`` (and
``POWERTOOLS_DEV``) silence it as they silence Powertools.

The same line is the request's log line: its ``context`` (route, request id, key, tokens, ...)
rides in it as properties, which CloudWatch Logs Insights reads like any JSON log field and
the metrics ignore. A request's user (``user``: its level's id, ``<tenant>~<user>``) and cost
(``cost_nusd``) are such properties, never dimensions: a User dimension would be a custom
metric per user ($0.30 a month each); the dashboard's "top users by cost" widget is a Logs
Insights query over these lines (billed per GB it scans) instead.
One line per request, not a log line and a metrics line: each is a write
to the Lambda log pipe, and Powertools' Logger spends ~50 µs formatting one. With metrics off,
the context is logged through the logger as before.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Mapping
from typing import Any

from aws_lambda_powertools.metrics.functions import is_metrics_disabled

from hardcap_core import json_codec
from hardcap_core.logs import logger

NAMESPACE = "Hardcap"
# What a dimension holds when the caller has no value: CloudWatch rejects an empty one, and a
# request without an upstream (refused before one was chosen) is still counted.
NO_VALUE = "none"

_DIRECTIVES = json.dumps(
    [
        {
            "Namespace": NAMESPACE,
            "Dimensions": [["Outcome"]],
            "Metrics": [
                {"Name": "Requests", "Unit": "Count"},
                {"Name": "QueueWait", "Unit": "Milliseconds"},
            ],
        },
        {
            "Namespace": NAMESPACE,
            "Dimensions": [["Upstream"]],
            "Metrics": [
                {"Name": "Requests", "Unit": "Count"},
                {"Name": "AddedLatency", "Unit": "Milliseconds"},
            ],
        },
    ],
    separators=(",", ":"),
)
_PREFIX = '{"_aws":{"CloudWatchMetrics":' + _DIRECTIVES + ',"Timestamp":'
_quote = json.encoder.encode_basestring_ascii


def record_request(
    *,
    outcome: str,
    upstream: str,
    added_latency_ms: float,
    queue_wait_ms: float = 0.0,
    message: str = "request settled",
    context: Mapping[str, Any] | None = None,
) -> None:
    """Write one request's metrics: its outcome, the upstream that served it, and the time the
    gateway added to it (everything but the upstream's own time) and the time it waited to be
    admitted, in milliseconds; with
    ``message`` and the ``context`` fields of its log line (lower-case names, so they never
    meet a metric's or dimension's).

    Raises ValueError for a latency that is not a finite number (JSON cannot carry it)."""
    if not (math.isfinite(added_latency_ms) and math.isfinite(queue_wait_ms)):
        raise ValueError(f"a latency ({added_latency_ms!r}, {queue_wait_ms!r}) is not finite")
    if is_metrics_disabled():
        logger.info(message, extra=dict(context or {}))
        return
    now_ms = time.time_ns() // 1_000_000
    fields = json_codec.dumps(context)[1:-1].decode() if context else ""
    line = (
        f"{_PREFIX}{now_ms}}}"
        f',"Outcome":{_quote(outcome or NO_VALUE)},"Upstream":{_quote(upstream or NO_VALUE)}'
        f',"Requests":1,"AddedLatency":{float(added_latency_ms)!r}'
        f',"QueueWait":{float(queue_wait_ms)!r}'
        f',"level":"INFO","message":{_quote(message)},"timestamp":{now_ms}'
        f"{',' if fields else ''}{fields}}}\n"
    )
    sys.stdout.write(line)


_REJECTED_DIRECTIVES = json.dumps(
    [
        {
            "Namespace": NAMESPACE,
            "Dimensions": [["Upstream"]],
            "Metrics": [{"Name": "UpstreamUsageRejected", "Unit": "Count"}],
        }
    ],
    separators=(",", ":"),
)
_REJECTED_PREFIX = '{"_aws":{"CloudWatchMetrics":' + _REJECTED_DIRECTIVES + ',"Timestamp":'


def record_usage_rejected(*, upstream: str, field: str, value: int, most: int) -> None:
    """Write one ``UpstreamUsageRejected`` (dimension Upstream): a provider reported a count
    it could not have billed (``field`` at ``value``, the most it could have been ``most``;
    :func:`hardcap_core.gateway.money.implausible`), so the request was charged as if it had
    reported nothing. Rare by nature, so one line of its own; the raw value rides as a string
    (it may be past what a JSON number carries exactly)."""
    if is_metrics_disabled():
        return
    now_ms = time.time_ns() // 1_000_000
    sys.stdout.write(
        f"{_REJECTED_PREFIX}{now_ms}}}"
        f',"Upstream":{_quote(upstream or NO_VALUE)},"UpstreamUsageRejected":1'
        f',"level":"WARNING","message":"upstream usage rejected","timestamp":{now_ms}'
        f',"field":{_quote(field)},"raw_value":{_quote(str(value))},"most":{int(most)}}}\n'
    )
