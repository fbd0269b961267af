"""A tenant's clients sending a workload's requests (:mod:`bench.budget.prompts`), each a
different body, as the official openai SDK sends and retries them.

:func:`tests.load.harness.drive_tenant` alone sends one short body over and over; here every
logical request takes the next body of the tenant's share of a pool (its ``next_body``), and a
retry sends the same body again, as the SDK does. The loop, its tallies, the lean HTTP/1.1
client and the SDK's retry rules are the harness's. At the first refusal of any kind, the
mock's prompt and completion tokens for the tenant are fetched apart, so that a cost budget can
price them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from bench.budget.prompts import MAX_TOKENS
from tests.load import sdk_retry
from tests.load.harness import TenantRun, drive_tenant


def payloads(bodies: Sequence[dict[str, Any]]) -> list[bytes]:
    """Each body's JSON without its braces, to be spliced after a request's own fields."""
    return [json.dumps(b, separators=(",", ":")).encode()[1:-1] for b in bodies]


def request_bytes(tenant: str, model: str, payload: bytes) -> bytes:
    """A streamed request of ``tenant`` to ``model`` carrying ``payload`` (:func:`payloads`)."""
    head = {
        "model": model,
        "user": tenant,  # the mock's ground truth is kept per user
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return json.dumps(head, separators=(",", ":")).encode()[:-1] + b"," + payload + b"}"


async def drive_workload(
    urls: list[str],
    key: str,
    tenant: str,
    *,
    concurrency: int,
    model: str,
    pool: Sequence[bytes],
    start: int,
    time_limit_s: float,
    seed: int,
    truth_url: str,
    max_retries: int = sdk_retry.DEFAULT_MAX_RETRIES,
) -> TenantRun:
    """Spend ``tenant``'s budget with ``concurrency`` SDK-like clients until it is exceeded.

    Logical requests take ``pool``'s payloads in turn from ``start``; each is retried as the
    SDK retries (at most ``max_retries`` times), then counted failed. Stops starting requests
    at the first ``budget_exceeded`` or after ``time_limit_s``; streams running finish.
    """
    taken = [start]

    def next_body() -> bytes:
        taken[0] += 1
        return request_bytes(tenant, model, pool[(taken[0] - 1) % len(pool)])

    return await drive_tenant(
        urls,
        key,
        tenant,
        concurrency=concurrency,
        model=model,
        max_tokens=MAX_TOKENS,
        time_limit_s=time_limit_s,
        seed=seed,
        retries="sdk",
        max_retries=max_retries,
        truth_url=truth_url,
        next_body=next_body,
    )
