"""The ASGI response for a budgeted stream: sends the relay's bytes, watches for the client
leaving, and always ends the relay, shielded from cancellation.

Starlette's StreamingResponse cancels the body iterator when the client disconnects but can
leave it unclosed until garbage collection, and anyio re-cancels every await in a cancelled
scope; settlement would be skipped or late. Here the relay ends in a shielded scope, once.
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from hardcap_core.gateway.relay import Relay
from hardcap_core.outcome import Outcome


class RelayResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, relay: Relay, headers: Mapping[str, str]) -> None:
        self.relay = relay
        self.status_code = 200
        self.background = None
        self.init_headers({**headers, "cache-control": "no-cache", "x-accel-buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks = self.relay.chunks()
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        try:
            async with anyio.create_task_group() as tg:

                async def watch_disconnect() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(watch_disconnect)
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()
        finally:
            # A stream that ended by itself has its outcome already; this one was left.
            with anyio.CancelScope(shield=True):
                await chunks.aclose()
                await self.relay.end(Outcome.CLIENT_GONE)
