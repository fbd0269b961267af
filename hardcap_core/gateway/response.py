"""The ASGI response for a budgeted stream: sends the relay's bytes, watches for the client
leaving, and always closes and settles the relay, shielded from cancellation.

Starlette's StreamingResponse cancels the body iterator when the client disconnects but can
leave it unclosed until garbage collection, and anyio re-cancels every await in a cancelled
scope; settlement would be skipped or late. Here it runs in a shielded scope, once.
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from hardcap_core.errors import GatewayError
from hardcap_core.gateway.relay import StreamRelay, translate_stream_error
from hardcap_core.logs import logger


class RelayResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, relay: StreamRelay, headers: Mapping[str, str]) -> None:
        self.relay = relay
        self.status_code = 200
        self.background = None
        self.init_headers({**headers, "cache-control": "no-cache", "x-accel-buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        relay = self.relay
        client_gone = False
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        try:
            async with anyio.create_task_group() as tg:

                async def watch_disconnect() -> None:
                    nonlocal client_gone
                    while True:
                        message = await receive()
                        if message["type"] == "http.disconnect":
                            client_gone = True
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(watch_disconnect)
                try:
                    async for chunk in relay.chunks():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except (GatewayError, httpx.HTTPError, OSError) as e:
                    # Bytes are out already: the status is sent, so the error is an SSE event.
                    with anyio.CancelScope(shield=True):
                        await relay.close()
                    error = translate_stream_error(e)
                    await send(
                        {
                            "type": "http.response.body",
                            "body": relay.error_event(error),
                            "more_body": True,
                        }
                    )
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await relay.close(client_gone=client_gone)
            meter = relay.meter
            logger.info(
                "stream ended",
                extra={
                    "route": meter.route,
                    "request_id": self.headers.get("x-request-id"),
                    "outcome": relay.outcome,
                    "input_tokens": meter.charged_input,
                    "output_tokens": meter.charged_output,
                },
            )
