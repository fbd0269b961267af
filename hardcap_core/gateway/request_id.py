"""The request's id on every response, the gateway's own routes and its 404s and 405s alike,
under two names: ``x-request-id`` (which a client may send, and the OpenAI SDKs read) and
``request-id`` (which the Anthropic SDKs read: ``Message._request_id``,
``APIStatusError.request_id``). Both on every route rather than ``request-id`` on the Anthropic
paths alone: the middleware runs before routing and needs no list of paths (a 404 under
``/v1/messages`` or Anthropic's ``models.list`` on ``/v1/models`` get it too), and the same
value under both names cannot disagree.

A client's id is kept when it is a short plain token (so a client can correlate its logs with
ours); anything else, e.g. a megabyte of text, is replaced by a fresh id, so it never reaches
a response header or the log.
"""

from __future__ import annotations

import os
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"
ANTHROPIC_HEADER = "request-id"
MAX_LENGTH = 128
_NAMES = (HEADER.encode(), ANTHROPIC_HEADER.encode())
_SAFE = re.compile(rf"^[A-Za-z0-9._:\-]{{1,{MAX_LENGTH}}}$")


def request_id(scope: Scope) -> str:
    """The id :class:`RequestIdMiddleware` gave this request."""
    rid: str = scope["state"]["request_id"]
    return rid


def choose(presented: str | None) -> str:
    """The client's id if it is safe to echo, else a new one."""
    if presented and _SAFE.match(presented):
        return presented
    return new_id()


def new_id() -> str:
    """32 random hex digits, as ``uuid.uuid4().hex`` gives but in a third of its time (no
    UUID object; the version bits are not wanted)."""
    return os.urandom(16).hex()


class RequestIdMiddleware:
    """Pure ASGI (not BaseHTTPMiddleware, which would buffer streamed responses)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        presented = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                presented = value.decode("latin-1")
                break
        rid = choose(presented)
        scope.setdefault("state", {})["request_id"] = rid
        ids = [(name, rid.encode()) for name in _NAMES]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() not in _NAMES]
                message = {**message, "headers": [*headers, *ids]}
            await send(message)

        await self.app(scope, receive, send_with_id)
