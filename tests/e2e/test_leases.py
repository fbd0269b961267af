"""Leases end to end: a lease opened over HTTP, 100 concurrent streams through the official
openai SDK carrying it (``extra_headers``), against the mock upstream in its own process; the
spend by the mock's ground truth stays within the lease, and closing it returns the rest."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from hardcap_core.local.valkey import LocalValkey
from tests.load.mock import start_mock
from tests.stack import KEYS, Mock, config_data, gateway_thread

LEASE_TOKENS = 20_000
STREAMS = 100


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mock]:
    # Its own process, as in test_gateway_concurrency: sharing this process's GIL with 100
    # clients it would notice a closed stream late and keep generating (counted as truth).
    service = start_mock(tmp_path_factory.mktemp("mock"), pace_ms=2.0, seed=11)
    m = Mock(url=service.url)
    yield m
    m.stop()
    service.stop()


def auth(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


async def stream_one(client: openai.AsyncOpenAI, lease: str) -> str:
    try:
        stream = await client.chat.completions.create(
            model="small",
            messages=[{"role": "user", "content": "tell me a long story"}],
            max_tokens=600,
            user="alpha",  # the mock counts its ground truth per `user`
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"x-hardcap-lease": lease},
        )
        async for _ in stream:
            pass
        return "ok"
    except openai.RateLimitError as e:
        return str(e.code)


async def run_streams(base: str, lease: str) -> list[str]:
    client = openai.AsyncOpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=4)
    try:
        return await asyncio.gather(*(stream_one(client, lease) for _ in range(STREAMS)))
    finally:
        await client.close()


def test_100_streams_on_one_lease_never_spend_past_it(
    base: str, mock: Mock, tmp_path: Path
) -> None:
    with httpx.Client(base_url=base, timeout=30) as http:
        opened = http.post(
            "/hardcap/leases",
            json={"tokens": LEASE_TOKENS, "ttl_seconds": 300},
            headers=auth("alpha"),
        )
        assert opened.status_code == 201, opened.text
        lease = opened.json()["id"]
        assert opened.json()["tokens"] == LEASE_TOKENS
        # Another tenant (same org, same slot) neither sees nor uses it.
        assert http.get(f"/hardcap/leases/{lease}", headers=auth("beta")).status_code == 404
        assert http.delete(f"/hardcap/leases/{lease}", headers=auth("beta")).status_code == 404

        outcomes = asyncio.run(run_streams(base, lease))
        truth = mock.truth("alpha", settle_s=10)
        state = http.get(f"/hardcap/leases/{lease}", headers=auth("alpha")).json()
        print(f"\nground truth {truth} lease {state} outcomes {sorted(set(outcomes))}")
        assert outcomes.count("ok") >= 10
        assert truth["in_flight"] == 0
        assert truth["total_tokens"] <= LEASE_TOKENS  # the mock's count, not the gateway's
        assert state["spent"]["tokens"] <= LEASE_TOKENS
        assert state["held"]["tokens"] == 0
        assert state["spent"]["tokens"] >= truth["total_tokens"] * 0.99  # it charged the truth
        # The lease ran out: the rest were refused by it, not by the tenant's budget.
        assert set(outcomes) <= {"ok", "budget_busy", "budget_exceeded"}

        closed = http.delete(f"/hardcap/leases/{lease}", headers=auth("alpha"))
        assert closed.status_code == 200 and closed.json()["closed"]
        assert http.get(f"/hardcap/leases/{lease}", headers=auth("alpha")).status_code == 404
        # What the lease held unspent went back: nothing is left reserved on the tenant.
        usage = http.get("/hardcap/usage", headers=auth("alpha")).json()
        assert [b["reserved"] for b in usage["budgets"]] == [0, 0]
        assert usage["budgets"][0]["used"] == state["spent"]["tokens"]


def test_no_lease_without_the_budget_server_even_failing_open(mock: Mock) -> None:
    """A fail-open tenant goes ahead unguarded without the budget server, but not under a
    lease (an envelope nobody holds bounds nothing), and no lease opens: 503."""
    server = LocalValkey().start()
    url = server.url
    server.stop()  # nothing listens there now
    with gateway_thread(config_data(mock.url, url)) as base:
        client = openai.OpenAI(base_url=base, api_key=KEYS["open"], max_retries=0)
        hi = [{"role": "user", "content": "hi"}]
        done = client.chat.completions.create(model="small", messages=hi, user="open")
        assert done.choices[0].message.content  # unguarded, as the tenant asked
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(
                model="small", messages=hi, user="open", extra_headers={"x-hardcap-lease": "x1"}
            )
        assert e.value.status_code == 503
        with httpx.Client(base_url=base, timeout=30) as http:
            opened = http.post(
                "/hardcap/leases", json={"tokens": 100, "ttl_seconds": 60}, headers=auth("open")
            )
            assert opened.status_code == 503
            assert http.get("/hardcap/leases/x1", headers=auth("open")).status_code == 503


def test_lease_requests_are_checked(base: str) -> None:
    """Bad bodies are 400s naming the field; an unknown lease is a 404 to a chat request too."""
    with httpx.Client(base_url=base, timeout=30) as http:
        for body, field in (
            ({"ttl_seconds": 60}, "tokens"),
            ({"tokens": 10}, "ttl_seconds"),
            ({"tokens": -1, "ttl_seconds": 60}, "tokens"),
            ({"tokens": 10, "ttl_seconds": 10**9}, "ttl_seconds"),
            ({"tokens": 10, "ttl_seconds": 60, "budget": 1}, "budget"),
        ):
            answer = http.post("/hardcap/leases", json=body, headers=auth("alpha"))
            assert answer.status_code == 400, body
            assert answer.json()["error"]["param"] == field
        usd = http.post(
            "/hardcap/leases", json={"usd": 0.5, "ttl_seconds": 60}, headers=auth("alpha")
        ).json()
        assert (usd["usd"], usd["tokens"]) == (0.5, None)
    client = openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(
            model="small",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-hardcap-lease": "no-such-lease"},
        )
    assert e.value.code == "lease_not_found"
