"""The hot path's smaller levers, each measured in-process as CPU time per operation: what a
choice costs, so the choice is made by a number (issue 13). The big ones have their own
benchmarks: the whole gateway against bare apps and proxies (bench/speed/wrk_overhead.py), the
Redis clients (bench/speed/redis_clients.py), cold start (bench/coldstart/coldstart*.py).

* ``chunk``: decode a provider's ``chat.completion.chunk`` and encode it again, with ``json``
  and with ``orjson`` (what the relay does per event).
* ``log``: one request's log line through Powertools' Logger (with the fields the settle logs)
  against the one EMF line that carries the same fields (gateway/metrics.py), to /dev/null.
* ``asgi``: one request through a Starlette app with the gateway's middleware against calling
  the endpoint directly (what a hand-written router would save).
* ``client``: one non-streamed POST to the mock upstream (its own process, pace 0), one at a
  time on a uvloop loop, with the gateway's transport, a bare aiohttp session, httpx and
  httpx2 (those installed), client CPU per request (the mock's work is not in it).

    python -m bench levers            # ~1 min
    python -m bench levers --quick    # seconds
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

from bench.lib import stack
from bench.lib.machine import machine_info, write_json

RESULTS = Path(__file__).resolve().parents[1] / "results"
CHUNK = {
    "id": "chatcmpl-AbC123dEf456",
    "object": "chat.completion.chunk",
    "created": 1796134302,
    "model": "gpt-4o-mini-2024-07-18",
    "system_fingerprint": "fp_0ba0d124f1",
    "choices": [{"index": 0, "delta": {"content": " budgets"}, "logprobs": None,
                 "finish_reason": None}],
}  # fmt: skip


def cpu_us(fn: Callable[[], Any], n: int) -> float:
    """CPU microseconds per call of ``fn`` (the best of three runs of ``n``)."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - start) / n * 1e6)
    return round(best, 2)


async def acpu_us(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        for _ in range(n):
            await fn()
        best = min(best, (time.process_time() - start) / n * 1e6)
    return round(best, 2)


def chunk_lever(n: int) -> dict[str, float]:
    import orjson

    text = json.dumps(CHUNK)

    def with_json() -> None:
        chunk = json.loads(text)
        chunk["model"] = "small"
        json.dumps(chunk, separators=(",", ":")).encode()

    def with_orjson() -> None:
        chunk = orjson.loads(text)
        chunk["model"] = "small"
        orjson.dumps(chunk)

    return {"json_us": cpu_us(with_json, n), "orjson_us": cpu_us(with_orjson, n)}


def log_lever(n: int) -> dict[str, float]:
    from hardcap_core.gateway.metrics import record_request
    from hardcap_core.logs import logger

    context = {"route": "small", "request_id": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
               "tenant": "acme", "key_id": "acme-k1", "outcome": "completed",
               "input_tokens": 512, "output_tokens": 200, "expiry_charged": False}  # fmt: skip
    sink = open(os.devnull, "w")  # noqa: SIM115 - closed below
    handlers = logger._logger.handlers  # the Powertools handler writes to a stream it holds
    streams = [h.stream for h in handlers if hasattr(h, "stream")]
    for h in handlers:
        if hasattr(h, "stream"):
            h.stream = sink

    def powertools_line() -> None:
        logger.info("request settled", extra=context)

    def emf_line() -> None:
        record_request(outcome="completed", upstream="openai", added_latency_ms=0.42,
                       context=context)  # fmt: skip

    try:
        with contextlib.redirect_stdout(sink):
            result = {
                "powertools_log_line_us": cpu_us(powertools_line, n),
                "emf_line_with_log_fields_us": cpu_us(emf_line, n),
            }
    finally:
        for h, s in zip([h for h in handlers if hasattr(h, "stream")], streams, strict=True):
            h.stream = s
        sink.close()
    return result


def asgi_lever(n: int) -> dict[str, float]:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from hardcap_core.gateway.request_id import RequestIdMiddleware

    async def endpoint(request: Request) -> Response:
        return Response(b"{}", media_type="application/json")

    app = Starlette(
        routes=[Route("/v1/chat/completions", endpoint, methods=["POST"])],
        middleware=[Middleware(RequestIdMiddleware)],
    )

    async def direct(scope: Any, receive: Any, send: Any) -> None:
        scope.setdefault("state", {})["request_id"] = "x"
        response = await endpoint(Request(scope, receive))
        await response(scope, receive, send)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": [(b"authorization", b"Bearer k")], "query_string": b"",
             "root_path": "", "scheme": "http", "server": ("h", 1), "client": ("c", 2),
             "http_version": "1.1"}  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        return None

    async def measure() -> dict[str, float]:
        through = await acpu_us(lambda: app(dict(scope), receive, send), n)
        called = await acpu_us(lambda: direct(dict(scope), receive, send), n)
        return {"starlette_with_middleware_us": through, "direct_endpoint_us": called}

    return run_on_uvloop(measure())


def run_on_uvloop(coro: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    import uvloop

    async def main() -> dict[str, Any]:
        return await coro

    return uvloop.run(main())


def client_lever(n: int) -> dict[str, Any]:
    """Client CPU per request against the mock, per HTTP client installed."""
    with tempfile.TemporaryDirectory(prefix="hardcap-levers-") as tmp:
        mock = stack.start_mock(Path(tmp), pace_ms=0, seed=1)
        try:
            return run_on_uvloop(_clients(mock.url + "/v1/chat/completions", n))
        finally:
            mock.stop()


async def _clients(url: str, n: int) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Hi [mock:tokens=1]"}]
    body = json.dumps({"model": "mock-small", "max_tokens": 5, "user": "levers",
                       "messages": messages}).encode()  # fmt: skip
    headers = {"content-type": "application/json"}
    calls: dict[str, Callable[[], Awaitable[Any]]] = {}
    closers: list[Callable[[], Awaitable[Any]]] = []

    from hardcap_core.providers.http import make_transport
    from hardcap_core.providers.transport import UpstreamRequest

    own = make_transport()
    request = UpstreamRequest(url, headers, body, 10.0)

    async def transport() -> None:
        assert (await own.send(request)).status == 200

    calls["hardcap_transport"] = transport
    closers.append(own.aclose)
    with contextlib.suppress(ImportError):
        import aiohttp

        session = aiohttp.ClientSession()

        async def with_aiohttp() -> None:
            async with session.post(url, data=body, headers=headers) as r:
                await r.read()
                assert r.status == 200

        calls["aiohttp"] = with_aiohttp
        closers.append(session.close)
    for module in ("httpx", "httpx2"):
        with contextlib.suppress(ImportError):
            lib: Any = __import__(module)
            client = lib.AsyncClient()

            async def with_httpx(client: Any = client) -> None:
                r = await client.post(url, content=body, headers=headers)
                assert r.status_code == 200

            calls[module] = with_httpx
            closers.append(client.aclose)
    out: dict[str, Any] = {}
    for name, call in calls.items():
        for _ in range(20):
            await call()
        wall = time.perf_counter()
        out[f"{name}_cpu_us"] = await acpu_us(call, n)
        out[f"{name}_wall_us"] = round((time.perf_counter() - wall) / (3 * n) * 1e6, 1)
    for close in closers:
        await close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path)
    ns = p.parse_args(argv)
    scale = 1 if ns.quick else 10
    levers: dict[str, Callable[[], dict[str, Any]]] = {
        "chunk": lambda: chunk_lever(5_000 * scale),
        "log": lambda: log_lever(500 * scale),
        "asgi": lambda: asgi_lever(1_000 * scale),
        "client": lambda: client_lever(40 * scale),
    }
    results: dict[str, Any] = {}
    for name, run in tqdm(levers.items(), desc="levers", file=sys.stderr):
        results[name] = run()
    out = ns.out or RESULTS / ("levers-quick.json" if ns.quick else "levers.json")
    command = " ".join(["python -m bench levers", *(argv or sys.argv[1:])])
    result = {"benchmark": "levers", "command": command, "machine": machine_info(),
              "parameters": {"quick": ns.quick, "scale": scale}, "results": results}  # fmt: skip
    write_json(out, result)
    buf = io.StringIO()
    for name, values in results.items():
        buf.write(f"{name}: " + ", ".join(f"{k}={v}" for k, v in values.items()) + "\n")
    print(buf.getvalue(), end="")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
