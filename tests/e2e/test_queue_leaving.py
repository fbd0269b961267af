"""A client that disconnects while its request waits in the admission queue: the request leaves
the queue at once, is never sent upstream and costs nothing; its usage record is a refusal,
``client_gone``, at zero cost. Before, its ticket stayed until it was admitted (about 1.4 s
later here), the request went upstream and the tenant paid for a reply nobody read.

Real Valkey, the mock upstream, the gateway on a real port; the leaving client is a raw socket,
so when it closes is exact. One stream holds nearly all of a 300-token budget for about 2 s."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
import redis

from hardcap_core.local.valkey import LocalValkey
from hardcap_core.rollup.records import UsageRecord, parse_entry
from tests.stack import KEYS, Mock, config_data, gateway_thread

BUDGET = [{"dimension": "total_tokens", "limit": 300, "window": "day"}]


@pytest.fixture
def gateway(flushed: LocalValkey, mock: Mock) -> Iterator[str]:
    """A gateway whose tenant alpha has 300 tokens a day and waits in the default queue."""
    with gateway_thread(config_data(mock.url, flushed.url, **{"tenants.0.budgets": BUDGET})) as url:
        yield url


def hold_the_budget(base: str) -> threading.Thread:
    """A stream with max_tokens 280 (4 tokens, one per 500 ms): while it runs, a 100-token
    request must wait. Read to its end in a thread."""
    client = openai.OpenAI(base_url=base, api_key=KEYS["alpha"], max_retries=0)
    stream = client.chat.completions.create(
        model="small",
        messages=[{"role": "user", "content": "x [mock:tokens=4] [mock:pace_ms=500]"}],
        max_tokens=280,
        stream=True,
        user="alpha",
    )

    def read() -> None:
        with client:
            list(stream)

    reader = threading.Thread(target=read)
    reader.start()
    return reader


def raw_request(base: str, path: str, body: dict[str, Any]) -> socket.socket:
    """Send a whole request on a socket of its own, and leave its answer unread."""
    url = urlsplit(base)
    content = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {KEYS['alpha']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(content)}\r\n\r\n"
    )
    sock = socket.create_connection((url.hostname or "127.0.0.1", url.port or 80))
    sock.sendall(head.encode() + content)
    return sock


def until(what: Callable[[], Any], seconds: float = 5.0) -> Any:
    deadline = time.monotonic() + seconds
    while not (got := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
    return got


def waiting(r: redis.Redis) -> int:
    """Tickets in every admission queue."""
    return sum(int(r.zcard(k)) for k in r.keys("hc:*:q:*"))


def records(r: redis.Redis) -> list[UsageRecord]:
    entries: list[tuple[bytes, dict[bytes, bytes]]] = []
    for key in r.keys("hc:*:usage"):
        entries += r.xrange(key)  # type: ignore[arg-type]
    return [parse_entry(i, f) for i, f in entries]


def used(base: str) -> tuple[int, int, int]:
    got = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {KEYS['alpha']}"})
    row = next(b for b in got.json()["budgets"] if b["level"] == "tenant")
    return row["used"], row["reserved"], got.json()["live_reservations"]


def chat_body(stream: bool) -> dict[str, Any]:
    return {
        "model": "small",
        "messages": [{"role": "user", "content": "y [mock:tokens=5]"}],
        "max_tokens": 100,
        "stream": stream,
        "user": "alpha",
    }


def messages_body(stream: bool) -> dict[str, Any]:
    return {
        "model": "small",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "y [mock:tokens=5]"}],
        "stream": stream,
        "metadata": {"user_id": "alpha"},
    }


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/chat/completions", chat_body), ("/v1/messages", messages_body)],
    ids=["openai", "anthropic"],
)
def test_a_client_that_leaves_the_queue_is_never_sent_nor_charged(
    gateway: str,
    mock: Mock,
    valkey: LocalValkey,
    path: str,
    body: Callable[[bool], dict[str, Any]],
    stream: bool,
) -> None:
    with redis.Redis.from_url(valkey.url) as r:
        holder = hold_the_budget(gateway)
        until(lambda: used(gateway)[1] > 0)  # the stream holds its budget
        leaver = raw_request(gateway, path, body(stream))
        until(lambda: waiting(r) == 1)  # its request waits its turn
        leaver.close()
        left_at = time.monotonic()
        # It leaves at once, while the stream still holds the budget: no ticket, one record.
        until(lambda: waiting(r) == 0, seconds=0.5)
        gone = until(lambda: [x for x in records(r) if x.outcome == "client_gone"], seconds=0.5)
        assert holder.is_alive() and time.monotonic() - left_at < 0.5
        assert [(x.refused, x.cost_nusd, x.input_tokens, x.output_tokens) for x in gone] == [
            (True, 0, 0, 0)
        ]
        holder.join(timeout=30)
        # The mock saw only the stream: the request that left never went upstream ...
        truth = mock.truth("alpha")
        assert truth["requests"] == 1
        # ... and the ledger charged the stream alone, with nothing left held.
        time.sleep(0.3)  # the stream settles after its last byte
        assert used(gateway) == (truth["total_tokens"], 0, 0)
        assert waiting(r) == 0
        kinds = sorted((x.kind.value, x.outcome) for x in records(r))
        assert kinds == [("r", "client_gone"), ("s", "completed")]
