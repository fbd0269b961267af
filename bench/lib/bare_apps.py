"""Reference ASGI apps for bench/speed/wrk_overhead.py: what a Python server costs with nothing of
the
gateway in it.

* ``fixed``: a bare Starlette app that reads the POST and answers a fixed 1-token completion.
* ``httpx``, ``httpx_aiohttp``, ``aiohttp``, ``httpx2``, ``transport`` (the gateway's own,
  ``make_transport()``):
  bare Starlette proxies that forward
  the POST to ``BARE_UPSTREAM`` (the mock's ``/v1/chat/completions``) over one HTTP client
  and relay the answer: read whole when the request is not streamed, chunk by chunk (as the
  client hands them over) when ``"stream": true``. One client per process, made in the
  lifespan, so the pool stays warm as the gateway's does. ``httpx_aiohttp`` is httpx's
  interface over ``httpx_aiohttp.AiohttpTransport``.

The app is chosen by ``BARE_KIND``; only that client is imported. Run by uvicorn as the
gateway is (uvloop + httptools, one process), e.g.::

    BARE_KIND=aiohttp BARE_UPSTREAM=http://127.0.0.1:9001/v1/chat/completions \\
        python -m uvicorn --factory bench.lib.bare_apps:app --loop uvloop --http httptools
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

KINDS = ("fixed", "httpx", "httpx_aiohttp", "aiohttp", "httpx2", "transport")
HEADERS = {"content-type": "application/json"}
TIMEOUT_S = 60.0
FIXED = {
    "id": "chatcmpl-bare",
    "object": "chat.completion",
    "created": 0,
    "model": "mock-small",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": " are", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 16, "completion_tokens": 1, "total_tokens": 17},
}

Relay = Callable[[bytes, bool], Awaitable[Response]]


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


def _streamed(body: bytes) -> bool:
    return bool(json.loads(body).get("stream"))


def _httpx_like(client: Any, upstream: str) -> Relay:
    """Relay over an ``httpx.AsyncClient``-shaped client (httpx, httpx2, httpx + aiohttp)."""

    async def relay(body: bytes, stream: bool) -> Response:
        request = client.build_request("POST", upstream, content=body, headers=HEADERS)
        r = await client.send(request, stream=stream)
        media = r.headers.get("content-type")
        if not stream:
            return Response(r.content, r.status_code, media_type=media)
        return StreamingResponse(
            r.aiter_raw(), r.status_code, media_type=media, background=BackgroundTask(r.aclose)
        )

    return relay


def _aiohttp(session: Any, upstream: str) -> Relay:
    async def relay(body: bytes, stream: bool) -> Response:
        r = await session.post(upstream, data=body, headers=HEADERS)
        media = r.headers.get("content-type")
        if not stream:
            content = await r.read()
            r.release()
            return Response(content, r.status, media_type=media)
        return StreamingResponse(
            r.content.iter_any(), r.status, media_type=media, background=BackgroundTask(r.release)
        )

    return relay


def _transport(transport: Any, upstream: str) -> Relay:
    """Relay over the gateway's own transport (aiohttp with the gateway's policy on top)."""
    from hardcap_core.providers.transport import UpstreamRequest

    async def relay(body: bytes, stream: bool) -> Response:
        request = UpstreamRequest(upstream, HEADERS, body, TIMEOUT_S)
        if not stream:
            reply = await transport.send(request)
            return Response(reply.body, reply.status, media_type=reply.headers.get("content-type"))
        opened = transport.stream(request)
        r = await opened.__aenter__()

        async def close() -> None:
            await opened.__aexit__(None, None, None)

        media = r.headers.get("content-type")
        return StreamingResponse(r.reads(), r.status, media_type=media,
                                 background=BackgroundTask(close))  # fmt: skip

    return relay


@asynccontextmanager
async def _client(kind: str, upstream: str) -> AsyncIterator[Relay]:
    """The client ``kind`` names, open for the app's lifetime, as a relay function."""
    if kind == "transport":
        from hardcap_core.providers.http import make_transport

        own = make_transport()
        yield _transport(own, upstream)
        await own.aclose()
        return
    if kind == "aiohttp":
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
            yield _aiohttp(session, upstream)
        return
    if kind == "httpx2":
        import httpx2

        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client2:
            yield _httpx_like(client2, upstream)
        return
    import httpx

    transport = None
    if kind == "httpx_aiohttp":
        from httpx_aiohttp import AiohttpTransport

        transport = AiohttpTransport()
    async with httpx.AsyncClient(timeout=TIMEOUT_S, transport=transport) as client:
        yield _httpx_like(client, upstream)


def app() -> Starlette:
    """The app ``BARE_KIND`` names (uvicorn ``--factory``)."""
    kind = os.environ.get("BARE_KIND", "fixed")
    if kind not in KINDS:
        raise SystemExit(f"BARE_KIND={kind!r}: one of {KINDS}")
    if kind == "fixed":

        async def fixed(request: Request) -> Response:
            await request.body()
            return JSONResponse(FIXED)

        routes = [Route("/v1/chat/completions", fixed, methods=["POST"])]
        return Starlette(routes=[*routes, Route("/healthz", healthz)])

    upstream = os.environ["BARE_UPSTREAM"]
    relays: list[Relay] = []

    async def proxy(request: Request) -> Response:
        body = await request.body()
        return await relays[0](body, _streamed(body))

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with _client(kind, upstream) as relay:
            relays.append(relay)
            yield

    routes = [Route("/v1/chat/completions", proxy, methods=["POST"]), Route("/healthz", healthz)]
    return Starlette(routes=routes, lifespan=lifespan)
