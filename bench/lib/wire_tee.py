"""What the provider said, read off the wire between the gateway and the provider, for
bench/failover/live_providers.py: a transport wrapping the gateway's own (``make_transport()``) that
keeps the last reply's body, and the usage that body reports (OpenAI's or Anthropic's shape, JSON or
SSE)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from hardcap_core.providers.http import make_transport
from hardcap_core.providers.transport import Reply, UpstreamRequest


class Tee:
    """The gateway's transport to providers, keeping the body of the last reply it relayed, as
    the provider sent it (after any content decoding)."""

    def __init__(self) -> None:
        self.inner = make_transport()
        self.last = b""

    async def send(self, request: UpstreamRequest) -> Reply:
        reply = await self.inner.send(request)
        self.last = reply.body
        return reply

    @asynccontextmanager
    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Any]:
        self.last = b""
        async with self.inner.stream(request) as reply:
            yield _Teed(reply, self)

    def prepare(self) -> None:
        self.inner.prepare()

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Teed:
    def __init__(self, reply: Any, tee: Tee) -> None:
        self.status, self.headers = reply.status, reply.headers
        self._reply, self._tee = reply, tee

    async def reads(self) -> AsyncIterator[bytes]:
        async for piece in self._reply.reads():
            self._tee.last += piece
            yield piece

    async def aread(self) -> bytes:
        body: bytes = await self._reply.aread()
        self._tee.last += body
        return body


def reported_usage(raw: bytes) -> dict[str, int] | None:
    """(input, output) tokens a provider reported in a reply body (JSON or SSE), OpenAI's or
    Anthropic's shape; None if the body holds none (a stream cut before its usage)."""
    events: list[Any] = []
    text = raw.decode("utf-8", "replace")
    if text.lstrip().startswith("{"):
        events = [json.loads(text)]
    else:
        for line in text.splitlines():
            if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                try:
                    events.append(json.loads(line[5:]))
                except ValueError:
                    continue
    found: dict[str, int] = {}
    for e in events:
        u = e.get("usage") if isinstance(e, dict) else None
        if isinstance(e, dict) and e.get("type") == "message_start":
            u = e["message"].get("usage")
        if not isinstance(u, dict):
            continue
        if "prompt_tokens" in u:
            found = {"input": u["prompt_tokens"], "output": u.get("completion_tokens", 0)}
        else:  # Anthropic: input counts cache reads and writes; output is cumulative
            ins = sum(
                u.get(k) or 0
                for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
            )
            if "input_tokens" in u:
                found["input"] = ins
            found["output"] = u.get("output_tokens", found.get("output", 0))
    return found or None
