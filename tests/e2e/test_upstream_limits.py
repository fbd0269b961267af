"""Two tenants on one upstream whose own budget is small: together, through the gateway and
against the mock's ground truth, they never spend past it; the refusal names the upstream."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from hardcap_core.local.valkey import LocalValkey
from tests.load.harness import TenantRun, drive_tenant
from tests.stack import KEYS, Mock, config_data, gateway_thread

UPSTREAM_BUDGET = 6_000


def test_two_tenants_never_spend_past_the_upstream_budget(flushed: LocalValkey, mock: Mock) -> None:
    budgets = [{"dimension": "total_tokens", "limit": UPSTREAM_BUDGET, "window": "day"}]
    data = config_data(mock.url, flushed.url, **{"upstreams.0.budgets": budgets})
    with gateway_thread(data) as url:

        async def both() -> list[TenantRun]:
            drives = [
                drive_tenant([url], KEYS[t], t, concurrency=12, model="small", max_tokens=200,
                             time_limit_s=30, seed=i)
                for i, t in enumerate(("alpha", "beta"))
            ]  # fmt: skip
            return list(await asyncio.gather(*drives))

        runs = asyncio.run(both())
        # A driver stops at its first refusal, which streams still holding reservations can
        # cause; what they did not use comes back when they settle. So ask until the upstream
        # refuses: every answer spends from the same 6,000, so that comes within a few asks.
        client = openai.OpenAI(base_url=url, api_key=KEYS["alpha"], max_retries=0)

        def ask_until_refused() -> None:
            for _ in range(UPSTREAM_BUDGET // 10):
                client.chat.completions.create(
                    model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=200
                )

        with pytest.raises(openai.RateLimitError) as refused:
            ask_until_refused()
    time.sleep(0.1)
    truth = {t: mock.truth(t, settle_s=10) for t in ("alpha", "beta")}
    total = sum(row.get("total_tokens", 0) for row in truth.values())
    print(f"\nground truth {truth} runs {runs}")
    assert all(run.errors == 0 for run in runs), runs
    assert total <= UPSTREAM_BUDGET, truth
    assert total >= UPSTREAM_BUDGET // 2  # and the budget was usable by both
    assert all(row.get("total_tokens", 0) > 0 for row in truth.values())
    assert "upstream:mock" in str(refused.value)
    assert refused.value.code == "budget_exceeded"
