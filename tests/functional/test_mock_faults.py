"""The mock upstream's fault injection (`POST /mock/fault` and the per-request directives), on a
real server: what a client sees while a fault is set, and what the ground truth bills."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hardcap_core.local.mock_faults import DISCONNECT_AFTER
from hardcap_core.local.mock_upstream import MockSettings
from tests.stack import Mock


@pytest.fixture(scope="module")
def mock() -> Iterator[Mock]:
    m = Mock(MockSettings(pace_ms=0, seed=3))
    yield m
    m.stop()


@pytest.fixture(autouse=True)
def _clean(mock: Mock) -> None:
    mock.reset()


def body(text: str = "hello [mock:tokens=20]", *, stream: bool = False, user: str = "t") -> Any:
    return {
        "model": "mock-small",
        "messages": [{"role": "user", "content": text}],
        "stream": stream,
        "user": user,
    }


def fault(mock: Mock, **spec: Any) -> dict[str, Any]:
    r = mock.http.post("/mock/fault", json=spec)
    r.raise_for_status()
    result: dict[str, Any] = r.json()
    return result


def chat(mock: Mock, payload: Any, timeout: float = 5.0) -> httpx.Response:
    return mock.http.post("/v1/chat/completions", json=payload, timeout=timeout)


def read_contents(mock: Mock, payload: Any, contents: list[str]) -> None:
    """Stream ``payload``, appending each content delta to ``contents`` as it arrives."""
    with mock.http.stream("POST", "/v1/chat/completions", json=payload) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"]
                contents += [delta["content"]] if delta.get("content") else []


def test_a_status_fault_answers_every_request_until_it_runs_out(mock: Mock) -> None:
    shown = fault(mock, status=503, seconds=0.6)
    assert shown["fault"]["mode"] == "status" and shown["fault"]["status"] == 503
    assert chat(mock, body()).status_code == 503
    r = chat(mock, body(stream=True))
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "server_error"
    assert mock.truth("t") == {
        "requests": 2, "errors": 2, "prompt_tokens": 0, "completion_tokens": 0,
        "completed": 0, "aborted": 0, "in_flight": 0, "total_tokens": 0,
    }  # fmt: skip
    time.sleep(0.7)
    assert mock.http.get("/mock/fault").json() == {"fault": None}
    assert chat(mock, body()).status_code == 200


def test_a_429_fault_carries_retry_after(mock: Mock) -> None:
    fault(mock, status=429, seconds=5, retry_after=3)
    r = chat(mock, body())
    assert r.status_code == 429 and r.headers["retry-after"] == "3"
    assert r.json()["error"]["type"] == "rate_limit_error"
    fault(mock, status=429, seconds=5)  # a 429 without retry_after: 1 s, as providers send
    assert chat(mock, body()).headers["retry-after"] == "1"
    fault(mock, status=429, seconds=5, retry_after=0.2)  # the header has no fractions
    assert chat(mock, body()).headers["retry-after"] == "1"


def test_an_empty_fault_or_a_reset_clears_it(mock: Mock) -> None:
    fault(mock, status=500, seconds=60)
    assert fault(mock) == {"ok": True, "fault": None}
    assert chat(mock, body()).status_code == 200
    fault(mock, mode="hang", seconds=60)
    mock.reset()
    assert chat(mock, body()).status_code == 200


@pytest.mark.parametrize(
    "spec",
    [
        {"mode": "explode", "seconds": 1},
        {"status": 200, "seconds": 1},
        {"status": 503},
        {"status": 503, "seconds": -1},
        {"status": 429, "seconds": 1, "retry_after": "soon"},
        {"status": 503, "seconds": 1, "colour": "red"},
    ],
)
def test_a_bad_fault_is_a_400_naming_the_field(mock: Mock, spec: dict[str, Any]) -> None:
    r = mock.http.post("/mock/fault", json=spec)
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("invalid fault:")
    assert mock.http.get("/mock/fault").json() == {"fault": None}


@pytest.mark.parametrize("stream", [False, True])
def test_a_hang_fault_sends_nothing_until_the_client_gives_up(mock: Mock, stream: bool) -> None:
    fault(mock, mode="hang", seconds=5)
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        chat(mock, body(stream=stream), timeout=0.4)  # not even the status line came
    assert time.monotonic() - started >= 0.4
    truth = mock.truth("t")
    assert truth["errors"] == 1 and truth["completion_tokens"] == 0 == truth["prompt_tokens"]


def test_a_disconnect_fault_drops_a_stream_after_a_few_steps_and_bills_them(mock: Mock) -> None:
    fault(mock, mode="disconnect", seconds=5)
    payload = body("hi [mock:tokens=50]", stream=True)
    payload["metadata"] = {"hardcap_bench_id": "dropped-1"}
    contents: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError):  # mid-body, after the 200
        read_contents(mock, payload, contents)
    assert len(contents) == DISCONNECT_AFTER
    record = mock.http.get("/mock/requests").json()["dropped-1"]
    assert record["state"] == "aborted" and record["completion_tokens"] == DISCONNECT_AFTER
    truth = mock.truth("t")
    assert truth["aborted"] == 1 and truth["completion_tokens"] == DISCONNECT_AFTER


def test_a_disconnect_fault_drops_a_whole_reply_mid_body_and_bills_nothing(mock: Mock) -> None:
    fault(mock, mode="disconnect", seconds=5)
    with pytest.raises(httpx.RemoteProtocolError):
        chat(mock, body())
    truth = mock.truth("t")
    assert truth["aborted"] == 1 and truth["completion_tokens"] == 0


def test_per_request_retry_after_and_hang_directives(mock: Mock) -> None:
    r = chat(mock, body("hi [mock:retry_after=2]"))
    assert r.status_code == 429 and r.headers["retry-after"] == "2"
    r = chat(mock, body("hi [mock:status=503] [mock:retry_after=4]"))
    assert r.status_code == 503 and r.headers["retry-after"] == "4"
    assert "retry-after" not in chat(mock, body("hi [mock:status=502]")).headers
    with pytest.raises(httpx.ReadTimeout):
        chat(mock, body("hi [mock:hang=1]", stream=True), timeout=0.3)
    assert chat(mock, body("hi")).status_code == 200  # only that request hung
    assert mock.truth("t")["errors"] == 4
