"""The official openai Python SDK's retry rules, for load clients that behave like an
application calling the gateway through it with the default ``max_retries=2``.

Read from openai 3.57 (``openai/_base_client.py``: ``_should_retry``,
``_calculate_retry_timeout``, ``_parse_retry_after_header``; ``openai/_constants.py``):

* a connection error or timeout is retried;
* a response is not retried when its Retry-After asks for more than ``MAX_RETRY_AFTER_DELAY``
  (2 minutes); otherwise ``x-should-retry: true`` / ``false`` decides when present; otherwise
  408, 409, 429 and every 5xx are retried, nothing else;
* the delay is the server's ``retry-after-ms`` (else ``retry-after``, seconds or an HTTP date)
  when it is in (0, 2 min], taken as is; otherwise ``0.5 s x 2^retries_taken`` capped at 8 s,
  less a random 0-25 %.

The SDK raises after ``1 + max_retries`` attempts: the application sees that request fail.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Mapping

DEFAULT_MAX_RETRIES = 2
INITIAL_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 8.0
MAX_RETRY_AFTER_DELAY = 2 * 60.0


def retry_after_header_s(headers: Mapping[str, str]) -> float | None:
    """Seconds the response asks to wait (``retry-after-ms`` first), or None if it does not."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            delay = float(value)
        except ValueError:
            continue
        return delay / divisor
    raw = headers.get("retry-after")
    try:
        parsed = email.utils.parsedate_tz(raw) if raw else None
        if parsed is None:
            return None
        return float(email.utils.mktime_tz(parsed) - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def should_retry(status: int | None, headers: Mapping[str, str]) -> bool:
    """Whether the SDK tries again after this answer; ``status`` None: no answer (a connection
    error or timeout)."""
    if status is None:
        return True
    after = retry_after_header_s(headers)
    if after is not None and math.isfinite(after) and after > MAX_RETRY_AFTER_DELAY:
        return False
    flag = headers.get("x-should-retry")
    if flag == "true":
        return True
    if flag == "false":
        return False
    return status in (408, 409, 429) or status >= 500


def retry_delay_s(
    retries_taken: int, headers: Mapping[str, str], rng: random.Random | None = None
) -> float:
    """Seconds the SDK sleeps before retry number ``retries_taken + 1``."""
    after = retry_after_header_s(headers)
    if after is not None and math.isfinite(after) and 0 < after <= MAX_RETRY_AFTER_DELAY:
        return after
    backoff = min(INITIAL_RETRY_DELAY * 2.0 ** min(retries_taken, 1000), MAX_RETRY_DELAY)
    jitter = 1 - 0.25 * (rng or random).random()
    return max(0.0, backoff * jitter)
