"""Fallback chains and shared breakers, end to end: the official `openai` SDK -> gateways ->
two mock upstreams (a primary that fails on command, a backup), real Valkey."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
import redis

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey, free_port
from tests.stack import KEYS, Mock, config_data, gateway_thread

HI = [{"role": "user", "content": "Say something about budgets. [mock:tokens=30]"}]
# The backup costs more: a request it serves must be charged at its prices.
BACKUP_PRICE = {"input_per_million": 3.0, "output_per_million": 6.0}


@pytest.fixture(scope="module")
def primary() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0.5, seed=31))
    yield m
    m.stop()


@pytest.fixture(scope="module")
def backup() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0.5, seed=32))
    yield m
    m.stop()


@pytest.fixture
def fresh(valkey: LocalValkey, primary: Mock, backup: Mock) -> LocalValkey:
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    for m in (primary, backup):
        m.reset()
    return valkey


def chain_config(
    primary_url: str, backup_url: str, redis_url: str, **gateway: Any
) -> dict[str, Any]:
    data = config_data(primary_url, redis_url)
    data["gateway"].update({"breaker": {"failures": 2, "cooldown_seconds": 1.0}, **gateway})
    data["upstreams"].append(
        {"name": "backup", "base_url": f"{backup_url}/v1", "timeout_seconds": 5}
    )
    data["routes"][0]["fallbacks"] = ["small-backup"]
    data["routes"].append({"name": "small-backup", "upstream": "backup", "model": "mock-small",
                           "price": BACKUP_PRICE, "max_output_tokens": 1024})  # fmt: skip
    data["tenants"][0]["budgets"].append({"dimension": "cost_usd", "limit": 100, "window": "day"})
    return data


def sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0)


def cost_used(base: str) -> float:
    r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {KEYS['alpha']}"})
    r.raise_for_status()
    rows = {(b["level"], b["dimension"]): b for b in r.json()["budgets"]}
    return float(rows[("tenant", "cost_usd")]["used"]) / 1e9  # the endpoint says nano-USD


def breakers(base: str) -> dict[str, dict[str, Any]]:
    r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {KEYS['alpha']}"})
    return {u["name"]: u for u in r.json()["upstreams"]}


def fault(mock: Mock, **body: Any) -> None:
    mock.http.post("/mock/fault", json=body).raise_for_status()


def requests_seen(mock: Mock) -> int:
    return int(
        mock.http.get("/mock/ground-truth").json()["tenants"].get("alpha", {}).get("requests", 0)
    )


def stream_text(base: str) -> tuple[str, str | None]:
    with sdk(base) as client:
        chunks = list(client.chat.completions.create(model="small", messages=HI, max_tokens=60,
                                                     stream=True, user="alpha"))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    return text, finishes[-1] if finishes else None


@pytest.mark.parametrize("trigger", ["503", "429", "timeout", "unreachable"])
@pytest.mark.parametrize("stream", [True, False])
def test_each_trigger_falls_back_and_is_priced_by_the_backup(
    fresh: LocalValkey, primary: Mock, backup: Mock, trigger: str, stream: bool
) -> None:
    primary_url = primary.url if trigger != "unreachable" else f"http://127.0.0.1:{free_port()}"
    data = chain_config(primary_url, backup.url, fresh.url)
    if trigger == "503":
        fault(primary, mode="status", status=503, seconds=30)
    elif trigger == "429":
        fault(primary, mode="status", status=429, retry_after=2, seconds=30)
    elif trigger == "timeout":
        data["upstreams"][0]["timeout_seconds"] = 0.5
        fault(primary, mode="hang", seconds=30)
    with gateway_thread(data) as base:
        if stream:
            text, finish = stream_text(base)
            assert text and finish == "stop"
        else:
            with sdk(base) as client:
                reply = client.chat.completions.create(model="small", messages=HI, max_tokens=60,
                                                       user="alpha")  # fmt: skip
            assert reply.choices[0].message.content and reply.model == "small"
        truth = backup.truth("alpha")
        assert truth["requests"] == 1  # the backup served it
        want = (truth["prompt_tokens"] * 3.0 + truth["completion_tokens"] * 6.0) / 1e6
        assert cost_used(base) == pytest.approx(want, abs=1e-9)


def test_no_retry_after_the_first_byte(fresh: LocalValkey, primary: Mock, backup: Mock) -> None:
    fault(primary, mode="disconnect", seconds=30)
    with gateway_thread(chain_config(primary.url, backup.url, fresh.url)) as base:
        with sdk(base) as client, pytest.raises(openai.APIError):
            for _ in client.chat.completions.create(model="small", messages=HI, max_tokens=60,
                                                    stream=True, user="alpha"):  # fmt: skip
                pass
        assert backup.truth("alpha").get("requests", 0) == 0  # never retried elsewhere
        # Settled at the primary's prices for what it generated.
        billed = primary.truth("alpha")
        assert billed["completion_tokens"] > 0
        assert (
            cost_used(base)
            >= (billed["prompt_tokens"] * 1.0 + billed["completion_tokens"] * 2.0) / 1e6
        )


def test_a_breaker_one_gateway_opened_is_skipped_by_another_then_probed(
    fresh: LocalValkey, primary: Mock, backup: Mock
) -> None:
    data = chain_config(primary.url, backup.url, fresh.url)
    fault(primary, mode="status", status=503, seconds=30)
    with gateway_thread(data) as a, gateway_thread(data) as b:
        for _ in range(2):  # two failures open it (failures: 2)
            assert stream_text(a)[1] == "stop"
        seen = requests_seen(primary)
        assert breakers(b)["mock"]["state"] == "open"
        # The other gateway never calls the primary while its breaker is open.
        assert stream_text(b)[1] == "stop"
        assert requests_seen(primary) == seen
        # The primary recovers; after the cooldown one probe goes to it and closes the breaker.
        fault(primary)
        time.sleep(1.1)
        before_backup = backup.truth("alpha")["requests"]
        assert stream_text(b)[1] == "stop"
        assert requests_seen(primary) == seen + 1
        assert backup.truth("alpha")["requests"] == before_backup
        assert breakers(a)["mock"] == {"name": "mock", "state": "closed", "consecutive_failures": 0}


def test_a_probe_that_fails_opens_the_breaker_again(
    fresh: LocalValkey, primary: Mock, backup: Mock
) -> None:
    data = chain_config(primary.url, backup.url, fresh.url)
    fault(primary, mode="status", status=502, seconds=30)
    with gateway_thread(data) as base:
        for _ in range(2):
            stream_text(base)
        time.sleep(1.1)
        seen = requests_seen(primary)
        assert stream_text(base)[1] == "stop"  # the probe failed; the backup served
        assert requests_seen(primary) == seen + 1
        assert breakers(base)["mock"]["state"] == "open"


def test_a_primary_that_dies_after_200_before_any_byte_falls_back(
    fresh: LocalValkey, primary: Mock, backup: Mock
) -> None:
    """It answered 200 and dropped the connection before its first event: no byte reached
    the client, so the backup serves. The primary had the request and may bill its input: the
    ledger charges that too (and the least a cut stream is charged)."""
    fault(primary, mode="disconnect", after=0, seconds=30)
    with gateway_thread(chain_config(primary.url, backup.url, fresh.url)) as base:
        text, finish = stream_text(base)
        assert text and finish == "stop"
        served = backup.truth("alpha")
        assert served["requests"] == 1
        primary_input = primary.truth("alpha")["prompt_tokens"]
        assert primary_input > 0  # it did take the request
        backup_cost = (served["prompt_tokens"] * 3.0 + served["completion_tokens"] * 6.0) / 1e6
        # At least the backup's bill plus the primary's input at its price.
        assert cost_used(base) >= backup_cost + primary_input * 1.0 / 1e6


# -- one tenant cannot open a breaker for the others ---------------------------------------------

# What tenant alpha sends, six times at once, against an upstream whose timeout is 1 s: a
# non-streamed reply that takes 5 s to generate because it asked for 1,000 tokens; a stream
# whose model "thinks" silently for 3 s before any output with the same cap; a request the
# provider refuses with 413; a provider that never answers a small request, whole or streamed
# (counted, but as alpha's alone).
SHAPES: dict[str, tuple[str, int, bool]] = {
    "long_reply_timeout": ("Tell me all. [mock:tokens=1000] [mock:pace_ms=5]", 1000, False),
    "long_thinking_timeout": ("Think hard. [mock:silent_ms=3000]", 1000, True),
    "413": ("Too much. [mock:status=413]", 20, False),
    "hang": ("Hello? [mock:hang=1]", 5, False),
    "hang_stream": ("Hello? [mock:hang=1]", 5, True),
}


def ask(base: str, tenant: str, content: str, max_tokens: int = 20, stream: bool = False) -> str:
    """What ``tenant`` gets: ``ok``, or the error's status and code."""
    messages: Any = [{"role": "user", "content": content}]
    with openai.OpenAI(base_url=base, api_key=KEYS[tenant], max_retries=0) as client:
        chat = client.chat.completions
        try:
            if stream:
                for _ in chat.create(model="small", messages=messages, max_tokens=max_tokens,
                                     stream=True, user=tenant):  # fmt: skip
                    pass
            else:
                chat.create(model="small", messages=messages, max_tokens=max_tokens, user=tenant)
        except openai.APIStatusError as e:
            return f"{e.status_code} {e.code}"
    return "ok"


def tenants_config(primary_url: str, redis_url: str, tenants: tuple[str, ...]) -> dict[str, Any]:
    """One route, no fallback, a 1 s upstream timeout; a breaker that two failures open and
    that stays open past the test."""
    data = config_data(primary_url, redis_url)
    data["gateway"]["breaker"] = {"failures": 2, "cooldown_seconds": 60}
    data["upstreams"][0]["timeout_seconds"] = 1.0
    data["tenants"] = [t for t in data["tenants"] if t["id"] in tenants]
    return data


def alpha_sends(base: str, shape: str, times: int = 6) -> list[str]:
    content, cap, stream = SHAPES[shape]
    with ThreadPoolExecutor(times) as pool:
        return list(pool.map(lambda _: ask(base, "alpha", content, cap, stream), range(times)))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_one_tenants_timeouts_and_413s_never_refuse_another(
    fresh: LocalValkey, primary: Mock, shape: str
) -> None:
    with gateway_thread(tenants_config(primary.url, fresh.url, ("alpha", "beta"))) as base:
        assert ask(base, "beta", "Hi.") == "ok"  # beta uses the upstream
        got = alpha_sends(base, shape)
        assert got == ["413 request_too_large" if shape == "413" else "504 upstream_timeout"] * 6
        served = primary.truth("beta")["requests"]
        assert ask(base, "beta", "Hi again.") == "ok"  # not 502 upstreams_unavailable
        assert primary.truth("beta")["requests"] == served + 1
        assert breakers(base)["mock"]["state"] == "closed"


@pytest.mark.parametrize("fallback", [False, True])
def test_a_real_outage_still_opens_the_breaker_for_every_tenant(
    fresh: LocalValkey, primary: Mock, backup: Mock, fallback: bool
) -> None:
    """Alpha's own failures first (413s: they open nothing), then the provider fails everyone:
    alpha's and beta's failures open the breaker, and the next request does not reach it."""
    if fallback:
        data = chain_config(primary.url, backup.url, fresh.url)
        data["gateway"]["breaker"] = {"failures": 2, "cooldown_seconds": 60}
    else:
        data = tenants_config(primary.url, fresh.url, ("alpha", "beta"))
    with gateway_thread(data) as base:
        assert ask(base, "beta", "Hi.") == "ok"
        assert alpha_sends(base, "413") == ["413 request_too_large"] * 6
        assert breakers(base)["mock"]["state"] == "closed"
        fault(primary, mode="status", status=503, seconds=30)
        failed = "ok" if fallback else "502 upstream_error"
        assert [ask(base, "alpha", "Hi."), ask(base, "beta", "Hi.")] == [failed, failed]
        assert breakers(base)["mock"]["state"] == "open"
        seen = primary.truth("beta").get("errors", 0)
        assert ask(base, "beta", "Hi.") == ("ok" if fallback else "502 upstreams_unavailable")
        assert primary.truth("beta").get("errors", 0) == seen  # the primary was skipped


def test_a_deployment_with_one_tenant_opens_its_breaker_on_a_real_outage(
    fresh: LocalValkey, primary: Mock
) -> None:
    with gateway_thread(tenants_config(primary.url, fresh.url, ("alpha",))) as base:
        assert alpha_sends(base, "413") == ["413 request_too_large"] * 6
        assert alpha_sends(base, "long_reply_timeout") == ["504 upstream_timeout"] * 6
        assert breakers(base)["mock"]["state"] == "closed"  # its own doing opens nothing
        fault(primary, mode="status", status=503, seconds=30)
        assert [ask(base, "alpha", "Hi.") for _ in range(2)] == ["502 upstream_error"] * 2
        assert breakers(base)["mock"]["state"] == "open"
        assert ask(base, "alpha", "Hi.") == "502 upstreams_unavailable"
