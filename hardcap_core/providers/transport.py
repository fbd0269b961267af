"""How a provider's request reaches its upstream: the transport interface and its errors.

A provider builds an :class:`UpstreamRequest` and hands it to a :class:`Transport`; the gateway
ships :class:`~hardcap_core.providers.aiohttp_transport.AiohttpTransport`, and tests inject
:class:`CallbackTransport` (an answer computed in-process) instead of patching anything. A
transport raises only the :class:`TransportError` kinds below; what a client sees for each is
decided once, in :mod:`hardcap_core.providers.http`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

CONNECT_TIMEOUT_S = 10.0  # to open a connection; what comes after is the request's timeout
# The most decoded body a whole reply may have: a chat completion is kilobytes (megabytes with
# audio); past this it is a hostile or broken upstream (a decompression bomb, an endless body).
MAX_REPLY_BYTES = 32 << 20
# Response headers: aiohttp's default for the status line; a header (name and value) twice
# that, for providers' long rate-limit and tracing headers; and at most this many.
MAX_HEADER_LINE_BYTES = 8190
MAX_HEADER_FIELD_BYTES = 16384
MAX_HEADERS = 128
# Informational (1xx) replies before the final one: a server sends one 100 Continue, and a few
# 103 Early Hints at most. Past this many it is a flood (every one a parsed message aiohttp
# queues while the request waits: 145 MiB in 15 s), and the reply a BadResponse.
MAX_INFORMATIONAL = 16


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    """A request to an upstream: a POST (a provider's call) or a GET (an identity provider's key
    set). ``timeout_s``: the deadline of a whole reply (:meth:`Transport.send`), or of each wait
    for a stream's next bytes (:meth:`Transport.stream`); opening the connection has its own,
    shorter, timeout. ``head_timeout_s``: a stream's deadline for its status line and headers,
    1xx replies included (None: ``timeout_s``); a whole reply's head is within its deadline."""

    url: str
    headers: Mapping[str, str]
    body: bytes
    timeout_s: float
    method: str = "POST"
    head_timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole reply: status, headers (names lower-cased) and the decoded body."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class StreamReply(Protocol):
    """A reply whose body is read as it arrives."""

    status: int
    headers: Mapping[str, str]

    def reads(self) -> AsyncIterator[bytes]:
        """The body, decoded, in pieces: everything that had arrived by each wake-up."""
        ...

    async def aread(self) -> bytes:
        """The rest of the body at once (an error reply's)."""
        ...


class Transport(Protocol):
    async def send(self, request: UpstreamRequest) -> Reply:
        """Send ``request`` and read its whole reply (at most :data:`MAX_REPLY_BYTES`, all of
        it within ``timeout_s``)."""
        ...

    def stream(self, request: UpstreamRequest) -> AbstractAsyncContextManager[StreamReply]:
        """Send ``request``; entering returns once the status and headers arrived (within
        ``head_timeout_s``, else :class:`TimedOut`); leaving closes the connection unless the
        body was read to its end (then it is reused)."""
        ...

    def prepare(self) -> None:
        """Do now what the first request would otherwise do (a TLS context): before a
        SnapStart snapshot."""
        ...

    async def aclose(self) -> None: ...


class TransportError(Exception):
    """The upstream could not be reached, or its connection failed."""

    #: The upstream had answered a success status before this failure: its reply began, so it
    #: generated (and bills) what the request asked for; nothing may be sent again elsewhere.
    answered: bool = False


class ConnectFailed(TransportError):
    """No connection to the upstream (refused, unresolvable, TLS failed, connect timed out)."""


class TimedOut(TransportError):
    """Connected, but the upstream sent nothing within the request's timeout."""


class ConnectionLost(TransportError):
    """The connection closed or reset before the reply ended."""


class BadResponse(TransportError):
    """Bytes that are not HTTP/1.1, a reply past the size limits, or a body in an encoding the
    gateway cannot decode."""


Answer = Callable[[UpstreamRequest], Reply | tuple[int, Mapping[str, str], Sequence[bytes]]]


class CallbackTransport:
    """A transport that answers in-process: ``answer`` returns a :class:`Reply`, or a status,
    headers and the body's pieces (each piece is one read of a stream). It may raise a
    :class:`TransportError`. For tests, and for embedding an upstream in the same process."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.sent: list[UpstreamRequest] = []

    def _reply(self, request: UpstreamRequest) -> tuple[int, Mapping[str, str], Sequence[bytes]]:
        self.sent.append(request)
        out = self.answer(request)
        if isinstance(out, Reply):
            return out.status, out.headers, [out.body]
        return out

    async def send(self, request: UpstreamRequest) -> Reply:
        status, headers, pieces = self._reply(request)
        return Reply(status, dict(headers), b"".join(pieces))

    @asynccontextmanager
    async def stream(self, request: UpstreamRequest) -> AsyncIterator[StreamReply]:
        status, headers, pieces = self._reply(request)
        yield _Pieces(status, dict(headers), list(pieces))

    def prepare(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class _Pieces:
    def __init__(self, status: int, headers: Mapping[str, str], pieces: list[bytes]) -> None:
        self.status = status
        self.headers = headers
        self._pieces = pieces

    async def reads(self) -> AsyncIterator[bytes]:
        while self._pieces:
            piece = self._pieces.pop(0)
            if piece:
                yield piece

    async def aread(self) -> bytes:
        rest, self._pieces = b"".join(self._pieces), []
        return rest
