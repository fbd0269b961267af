"""Relay a provider's SSE stream to the client, counting every billed delta as it passes.

The budget decides, chunk by chunk, whether output may go on (see :mod:`meter`). When it may
not, the relay ends the stream cleanly (a final chunk with ``finish_reason: "length"``, the
usage chunk if the client asked, ``data: [DONE]``) and closes the provider connection so the
provider stops generating. Every ending settles BEFORE the last bytes go out: once a Lambda
response ends, the environment may freeze.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx

from hardcap_core import sse
from hardcap_core.errors import GatewayError, UpstreamFailed, UpstreamTimeout
from hardcap_core.gateway.meter import Meter
from hardcap_core.logs import logger
from hardcap_core.tokens import delta_tokens


class StreamRelay:
    """One streamed completion: :meth:`open`, iterate :meth:`chunks`, always :meth:`close`."""

    def __init__(
        self,
        opened: AbstractAsyncContextManager[httpx.Response],
        meter: Meter,
        *,
        public_model: str,
        include_usage: bool,
        chars_per_token: float,
        deadline: float | None = None,
        log_completion: bool = False,
    ) -> None:
        self._opened = opened
        self.meter = meter
        self.public_model = public_model
        self.include_usage = include_usage
        self.chars_per_token = chars_per_token
        # Event-loop time (monotonic) by which the stream must have ended and been settled.
        self.deadline = deadline
        self.outcome = "open"  # completed | truncated | deadline | client_gone | upstream_error
        self._usage: dict[str, Any] | None = None
        self._last: dict[str, Any] = {}
        self._gen: AsyncIterator[bytes] | None = None
        self._response: httpx.Response | None = None
        self._head = b""
        self._text: list[str] | None = [] if log_completion else None
        self._stop = False

    async def open(self) -> None:
        """Connect to the provider and read up to the first chunk.

        Done before the gateway answers 200, so a provider that refuses or cannot be reached
        becomes a proper error status rather than a broken stream.
        """
        self._gen = self._run()
        self._head = await anext(self._gen, b"")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The bytes for the client, starting with the chunk :meth:`open` read."""
        if self._head:
            yield self._head
        if self._gen is not None:
            async for chunk in self._gen:
                yield chunk

    async def _run(self) -> AsyncIterator[bytes]:
        async with self._opened as response:
            self._response = response
            parser = sse.SSEParser()
            async for piece in self._pieces(response):
                # Count the whole read first: the meter decides knowing what is in hand.
                events = [self._decode(data) for data in parser.feed(piece)]
                self.meter.note_read(sum(tokens for _, tokens in events))
                for event, tokens in events:
                    out = await self._on_event(event, tokens)
                    if self._stop:
                        async for tail in self._finish():
                            yield tail
                        return
                    if out:
                        yield out
            for data in parser.flush():
                event, tokens = self._decode(data)
                self.meter.note_read(tokens)
                out = await self._on_event(event, tokens)
                if out and not self._stop:
                    yield out
        # The provider closed without [DONE], or the deadline came: settle what we saw.
        async for tail in self._finish():
            yield tail

    async def _pieces(self, response: httpx.Response) -> AsyncIterator[bytes]:
        """The provider's bytes, until they end or the Lambda deadline comes (then stop)."""
        pieces = response.aiter_raw()
        while True:
            try:
                if self.deadline is None:
                    piece = await anext(pieces)
                else:
                    async with asyncio.timeout_at(self.deadline):
                        piece = await anext(pieces)
            except StopAsyncIteration:
                return
            except TimeoutError:
                self.outcome = "deadline"
                self._stop = True
                return
            yield piece

    def _decode(self, data: str) -> tuple[dict[str, Any] | str, int]:
        """An event as (chunk, billed tokens), or (the raw text, 0) for [DONE] and bad JSON."""
        if data == sse.DONE:
            return data, 0
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            return data, 0
        if not isinstance(chunk, dict):
            return {}, 0
        if not chunk.get("choices") or "error" in chunk:
            return chunk, 0
        return chunk, delta_tokens(chunk, self.chars_per_token)

    async def _on_event(self, chunk: dict[str, Any] | str, tokens: int) -> bytes | None:
        if chunk == sse.DONE:
            self._stop = True
            return None
        if isinstance(chunk, str):
            raise UpstreamFailed("The provider sent a malformed stream event.")
        if "error" in chunk:
            message = (chunk["error"] or {}).get("message", "provider error")
            raise UpstreamFailed(f"The provider failed mid-stream: {message}")
        usage = chunk.get("usage")
        if usage:
            self._usage = usage
        if not self.include_usage:
            chunk.pop("usage", None)
        if not chunk.get("choices"):
            # A usage-only chunk: held back until the stream is settled.
            return None
        if self.deadline is not None and asyncio.get_running_loop().time() > self.deadline:
            self.outcome = "deadline"
            self._stop = True
            return None
        if tokens and not await self.meter.make_room(tokens):
            self.outcome = "truncated"
            self._stop = True
            return None
        chunk["model"] = self.public_model
        self._last = chunk
        if self._text is not None:
            for choice in chunk["choices"]:
                self._text.append((choice.get("delta") or {}).get("content") or "")
        return sse.encode(chunk)

    async def _finish(self) -> AsyncIterator[bytes]:
        """Close the provider if we cut it, settle, then send the closing events."""
        if self.meter.settled:
            return
        cut = self.outcome in ("truncated", "deadline")
        if self.outcome == "open":
            self.outcome = "completed"
        if cut:
            if self._response is not None:
                await self._response.aclose()  # the provider stops generating now
            await self.meter.settle(
                input_tokens=None, output_tokens=self.meter.cut_charge(), truncated=True
            )
            yield sse.encode(self._closing_chunk("length"))
        else:
            usage = self._usage or {}
            await self.meter.settle(
                input_tokens=_int(usage.get("prompt_tokens")),
                output_tokens=_int(usage.get("completion_tokens")) or self.meter.seen,
                truncated=False,
            )
        if self._text is not None:
            logger.info("completion", extra={"content": "".join(self._text)})
        if self.include_usage:
            yield sse.encode(self._usage_chunk())
        yield sse.encode(sse.DONE)

    async def close(self, *, client_gone: bool = False, upstream_failed: bool = False) -> None:
        """End the stream however it stands: close the provider, settle if not yet settled.

        Runs when the client disconnects, on errors, and after a normal end (then it only
        closes). The caller shields it from cancellation. A provider that failed before
        sending anything generated nothing: then nothing is charged.
        """
        if client_gone and self.outcome == "open":
            self.outcome = "client_gone"
        await self._close_upstream()
        if not self.meter.settled:
            nothing = upstream_failed and self.meter.seen == 0
            await self.meter.settle(
                input_tokens=0 if nothing else None,
                output_tokens=0 if nothing else self.meter.cut_charge(),
                truncated=True,
            )

    def error_event(self, error: GatewayError) -> bytes:
        """What the client gets when the provider fails after bytes were sent."""
        self.outcome = "upstream_error"
        return sse.encode(error.body())

    async def _close_upstream(self) -> None:
        if self._gen is not None:
            gen, self._gen = self._gen, None
            await gen.aclose()  # type: ignore[attr-defined]

    def _closing_chunk(self, reason: str) -> dict[str, Any]:
        return {
            "id": self._last.get("id", "chatcmpl-hardcap"),
            "object": "chat.completion.chunk",
            "created": self._last.get("created", int(time.time())),
            "model": self.public_model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": reason}],
        }

    def _usage_chunk(self) -> dict[str, Any]:
        m = self.meter
        usage = dict(self._usage or {}) if self.outcome == "completed" else {}
        usage.setdefault("prompt_tokens", m.charged_input)
        usage.setdefault("completion_tokens", m.charged_output)
        usage.setdefault("total_tokens", usage["prompt_tokens"] + usage["completion_tokens"])
        chunk = self._closing_chunk("")
        chunk["choices"] = []
        chunk["usage"] = usage
        return chunk


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def translate_stream_error(e: Exception) -> GatewayError:
    """The error event for a failure while streaming."""
    if isinstance(e, GatewayError):
        return e
    if isinstance(e, httpx.TimeoutException):
        return UpstreamTimeout("The provider stopped sending in time.")
    logger.warning("stream failed", extra={"error": type(e).__name__})
    return UpstreamFailed("The provider connection failed mid-stream.")
