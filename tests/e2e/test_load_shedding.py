"""Shedding load through the real gateway: while its event loop lags, a new chat request is
refused 503 ``overloaded`` with retry headers and charges nothing, a stream already running
completes, and once the loop keeps up again requests are served."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import redis

from hardcap_core.config import parse_config
from hardcap_core.gateway.app import create_app
from hardcap_core.gateway.loop_lag import LoopLag
from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.servers import ThreadServer
from hardcap_core.local.valkey import LocalValkey, free_port
from tests.stack import KEYS, Mock, config_data

HI = [{"role": "user", "content": "hello"}]


@pytest.fixture
def slow_mock() -> Iterator[Mock]:
    """Replies of about 150 tokens at 20 ms each: a stream lasts seconds."""
    m = Mock(MockSettings(pace_ms=20.0, median_tokens=150, sigma=0.0, seed=3))
    yield m
    m.stop()


@pytest.fixture
def gateway(valkey: LocalValkey, slow_mock: Mock) -> Iterator[tuple[str, LoopLag]]:
    """A gateway shedding above 100 ms of loop lag: its /v1 URL and its monitor."""
    with redis.Redis.from_url(valkey.url) as r:
        r.flushall()
    data = config_data(slow_mock.url, valkey.url, **{"gateway.shed_when_loop_lag_ms": 100})
    app = create_app(parse_config(data))
    server = ThreadServer(app, free_port()).start()
    try:
        yield f"{server.url}/v1", app.state.loop_lag
    finally:
        server.stop()


def block_loop(lag: LoopLag, steps: int, step_s: float) -> threading.Event:
    """Block the gateway's loop ``steps`` times for ``step_s`` each, 10 ms apart (as a CPU-bound
    burst would); the event is set after the last step."""
    loop = lag.loop
    assert loop is not None
    done = threading.Event()
    left = [steps]

    def step() -> None:
        time.sleep(step_s)
        left[0] -= 1
        if left[0]:
            loop.call_later(0.01, step)
        else:
            done.set()

    loop.call_soon_threadsafe(step)
    return done


def wait_for(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def usage(base: str, key: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {key}"})
    return dict(r.json())


def test_a_lagging_gateway_sheds_new_requests_and_finishes_the_running_stream(
    gateway: tuple[str, LoopLag], slow_mock: Mock
) -> None:
    base, lag = gateway
    assert lag.running
    lines: list[str] = []
    first_chunk = threading.Event()

    def stream() -> None:
        body = {"model": "small", "messages": HI, "stream": True, "max_tokens": 200}
        headers = {"authorization": f"Bearer {KEYS['open']}"}  # no org shared with beta
        with httpx.stream(
            "POST", f"{base}/chat/completions", json=body, headers=headers, timeout=60
        ) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    first_chunk.set()

    running = threading.Thread(target=stream)
    running.start()
    assert first_chunk.wait(10)
    blocked = block_loop(lag, steps=12, step_s=0.25)
    wait_for(lag.shedding)

    # A new request, of another tenant, in OpenAI's format.
    r = httpx.post(
        f"{base}/chat/completions",
        json={"model": "small", "messages": HI, "user": "beta"},
        headers={"authorization": f"Bearer {KEYS['beta']}"},
        timeout=30,
    )
    assert r.status_code == 503
    assert r.json() == {
        "error": {
            "message": "This gateway is overloaded; retry the request shortly.",
            "type": "overloaded_error",
            "param": None,
            "code": "overloaded",
        }
    }
    assert int(r.headers["retry-after"]) >= 1
    assert int(r.headers["retry-after-ms"]) >= 1
    assert r.headers["x-should-retry"] == "true"
    assert running.is_alive()  # the admitted stream is still going

    # The same in Anthropic's format, which its SDKs read.
    r = httpx.post(
        f"{base.removesuffix('/v1')}/v1/messages",
        json={"model": "small", "messages": HI, "max_tokens": 10},
        headers={"x-api-key": KEYS["beta"], "anthropic-version": "2023-06-01"},
        timeout=30,
    )
    assert r.status_code == 503
    assert r.json()["type"] == "error"
    assert (r.json()["error"]["type"], r.json()["error"]["code"]) == (
        "overloaded_error",
        "overloaded",
    )
    assert r.headers["x-should-retry"] == "true"
    assert r.headers["request-id"] == r.headers["x-request-id"]

    # The official SDK sees a retryable server error.
    with openai.OpenAI(base_url=base, api_key=KEYS["beta"], max_retries=0) as client:
        with pytest.raises(openai.InternalServerError) as refused:
            client.chat.completions.create(model="small", messages=HI)  # type: ignore[arg-type]
        assert refused.value.status_code == 503

    # The stream admitted before the lag runs to its end, untouched.
    running.join(60)
    assert not running.is_alive()
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1] if line.startswith("data: ")]
    assert not any("error" in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"

    # The shed requests cost their tenant nothing and never reached the provider.
    assert blocked.wait(30)
    beta = usage(base, KEYS["beta"])
    assert beta["live_reservations"] == 0
    for row in beta["budgets"]:
        assert (row["used"], row["reserved"]) == (0, 0), row
    assert slow_mock.truth("beta").get("requests", 0) == 0

    # Once the loop keeps up again, new requests are served.
    wait_for(lambda: not lag.shedding())
    r = httpx.post(
        f"{base}/chat/completions",
        json={"model": "small", "messages": HI, "max_tokens": 5},
        headers={"authorization": f"Bearer {KEYS['beta']}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
