"""The gateway's upstream HTTP client: aiohttp behind the :class:`~.transport.Transport` interface.

Why a maintained client: the hand-written HTTP/1.1 client this replaced saved ~150 µs of CPU
per request and, tried with a hostile upstream, handed one tenant another tenant's reply (a
``103 Early Hints`` taken as the final answer; a pooled connection reused with bytes left on
it). aiohttp was chosen over httpx by measurement (a bare proxy moved ~6x the requests per
second over aiohttp on this VM; ``docs/architecture.md``). What this module adds to it is
policy, and it is the one place where aiohttp's errors become :class:`~.transport.TransportError`:

- a connection is reused only when its reply was read to the end and nothing else arrived on
  it (aiohttp's parser; a reused connection that holds bytes nobody asked for is dropped before
  the request is written: :class:`_Connector`), never after a stream was left early;
- a POST is never sent twice: aiohttp retries only idempotent methods, and a connection that
  fails after the request was written fails the request (:class:`~.transport.ConnectionLost`;
  the fallback chain may try another target, which is a new request the client asked for);
- ``1xx`` replies are skipped, at most :data:`~.transport.MAX_INFORMATIONAL` of them before a
  reply (past that, :class:`BadResponse`: :class:`_Handler`); ``101`` or a status outside
  100-599 is :class:`BadResponse`;
- a stream's head (its status line, headers and any 1xx before them) has a deadline of its
  own, ``head_timeout_s``: each 1xx restarts aiohttp's per-read timeout, so without one a
  ``103`` every 0.5 s held a request open for as long as the upstream liked;
- no cookie jar: a ``Set-Cookie`` in one tenant's reply is never sent with the next request,
  anyone's (aiohttp's default jar keeps cookies per session, and the session is the process's);
- no redirect is followed (``allow_redirects=False``): a 3xx reaches
  :mod:`~hardcap_core.providers.http` as its status, which makes it the provider's failure;
- response headers are bounded (:data:`~.transport.MAX_HEADER_LINE_BYTES`,
  :data:`~.transport.MAX_HEADER_FIELD_BYTES`, :data:`~.transport.MAX_HEADERS`);
- a whole reply (:meth:`AiohttpTransport.send`) has one deadline, ``timeout_s``, and at most
  :data:`~.transport.MAX_REPLY_BYTES` of decoded body; a stream's memory is bounded by
  aiohttp's flow control and decompression in bounded steps, so a gzip bomb inflates no
  further than what is read;
- proxies come from the environment (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``);
- an idle pooled connection expires after :data:`IDLE_EXPIRY_S` (providers' load balancers
  close idle connections; one closed under us would fail a request, since nothing is re-sent).
"""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
import urllib.request
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
from aiohttp import client_exceptions as ce
from aiohttp.client_proto import ResponseHandler
from aiohttp.http_exceptions import ContentLengthError, HttpProcessingError, TransferEncodingError
from aiohttp.streams import StreamReader

from hardcap_core.providers.transport import (
    CONNECT_TIMEOUT_S,
    MAX_HEADER_FIELD_BYTES,
    MAX_HEADER_LINE_BYTES,
    MAX_HEADERS,
    MAX_INFORMATIONAL,
    MAX_REPLY_BYTES,
    BadResponse,
    ConnectFailed,
    ConnectionLost,
    Reply,
    StreamReply,
    TimedOut,
    TransportError,
    UpstreamRequest,
)

# Below the idle timeouts providers' load balancers are known to use (60 s on AWS ALB, ~90 s
# on Cloudflare): the pool closes a connection before the upstream does.
IDLE_EXPIRY_S = 15.0
# Asked for by default: a compressed SSE stream is held back by the provider's compressor, and
# every coding is decoded anyway when a provider compresses regardless.
DEFAULT_HEADERS = {"user-agent": "hardcap", "accept-encoding": "identity"}
# The content codings aiohttp decodes without optional packages.
DECODED = frozenset({"", "identity", "gzip", "deflate"})


class _Handler(ResponseHandler):
    """aiohttp's protocol for one connection, refusing a flood of informational replies.

    aiohttp's response loop (``ClientResponse.start``) skips 1xx replies for as long as they
    come, and the protocol queues every parsed one until that loop takes it: a flood of
    ``100 Continue`` grew a gateway by 145 MiB. Past :data:`MAX_INFORMATIONAL` in a row, the
    connection is closed and the waiting request gets a parse error (a BadResponse)."""

    _informational = 0  # 1xx replies since the last final one

    def feed_data(self, data: tuple[Any, StreamReader], size: int = 0) -> None:
        code = data[0].code
        if 100 <= code <= 199 and code != 101:
            self._informational += 1
            if self._informational > MAX_INFORMATIONAL:
                if self.exception() is None:
                    message = f"more than {MAX_INFORMATIONAL} informational (1xx) replies"
                    self.set_exception(HttpProcessingError(message=message))
                    if self.transport is not None:
                        self.transport.close()
                return  # not queued: nothing more of this connection is read
        else:
            self._informational = 0
        super().feed_data(data, size)


class _Connector(aiohttp.TCPConnector):
    """A TCP connector that never hands out a pooled connection holding unread bytes, and
    whose connections refuse a flood of 1xx replies (:class:`_Handler`).

    Bytes that arrive on an idle connection (a reply to nothing, a late tail of the last reply)
    are parsed by aiohttp as the next reply and would be given to the next request on it: the
    next tenant's. aiohttp checks only that the socket is open; this checks that it is quiet.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # aiohttp makes each connection's protocol with this factory (TLS ones included);
        # mypy holds partial invariant, though a _Handler is a ResponseHandler.
        self._factory = functools.partial(_Handler, loop=self._loop)  # type: ignore[assignment]

    async def _get(self, key: Any, traces: Any) -> Any:
        while True:
            conn = await super()._get(key, traces)
            if conn is None:
                return None
            proto = conn.protocol
            if proto is not None and not _quiet(proto):
                conn.close()  # not released: closed, and the pool gives another or a new one
                continue
            return conn


def _quiet(proto: Any) -> bool:
    """Nothing arrived on an idle connection since its last reply ended."""
    return not proto.should_close and not proto._buffer and not proto._tail


class AiohttpTransport:
    """Pooled keep-alive connections to every upstream, over aiohttp. The session is made in
    the running event loop by the first request (aiohttp binds it to a loop)."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        tls: ssl.SSLContext | None = None,
        idle_expiry_s: float = IDLE_EXPIRY_S,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ) -> None:
        """``tls``: the context HTTPS upstreams are checked with (default: certifi's CAs, or
        the system's)."""
        self.connect_timeout_s = connect_timeout_s
        self.idle_expiry_s = idle_expiry_s
        self.max_reply_bytes = max_reply_bytes
        self._tls = tls
        self._session: aiohttp.ClientSession | None = None
        self._proxies = _Proxies()

    def _client(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None or session.closed:
            connector = _Connector(
                ssl=self._tls_context(),
                limit=0,  # the server bounds requests in flight; a pool limit would queue them
                keepalive_timeout=self.idle_expiry_s,
            )
            session = self._session = aiohttp.ClientSession(
                connector=connector,
                trust_env=False,  # proxies are read once (_Proxies); aiohttp would per request
                # One jar for the process would carry one tenant's cookies to the next request.
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=True,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                max_line_size=MAX_HEADER_LINE_BYTES,
                max_field_size=MAX_HEADER_FIELD_BYTES,
                max_headers=MAX_HEADERS,
            )
        return session

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = default_tls()
        return self._tls

    def prepare(self) -> None:
        """Make the TLS context now (loading the CA bundle, ~30 ms) rather than at the first
        HTTPS connection: before a SnapStart snapshot, so every restored environment has it."""
        self._tls_context()

    async def send(self, request: UpstreamRequest) -> Reply:
        timeout = aiohttp.ClientTimeout(total=request.timeout_s, connect=self.connect_timeout_s)
        status = 0
        try:
            async with self._request(request, timeout) as response:
                status, headers = _head(response)
                body = await _read_capped(response, self.max_reply_bytes)
        except (TransportError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
            error = e if isinstance(e, TransportError) else _translate(e)
            error.answered = 200 <= status < 400
            if error is e:
                raise
            raise error from e
        return Reply(status, headers, body)

    @asynccontextmanager
    async def stream(self, request: UpstreamRequest) -> AsyncIterator[StreamReply]:
        timeout = aiohttp.ClientTimeout(sock_read=request.timeout_s, connect=self.connect_timeout_s)
        head_s = request.timeout_s if request.head_timeout_s is None else request.head_timeout_s
        try:
            opened = self._request(request, timeout)
            # The whole head by one deadline: every byte of it (a 1xx, a status line sent a
            # byte at a time) restarts aiohttp's per-read timeout.
            async with asyncio.timeout(min(head_s, request.timeout_s)):
                response = await opened.__aenter__()
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
            raise _translate(e) from e
        try:
            yield _Stream(response)
        finally:
            if not response.content.is_eof():
                # Left before the end (a cut stream, a client gone): the connection goes, and
                # with it the provider's generation. Released, it would carry the rest.
                response.close()
            await opened.__aexit__(None, None, None)

    def _request(self, request: UpstreamRequest, timeout: aiohttp.ClientTimeout) -> Any:
        headers = {**DEFAULT_HEADERS, **{k.lower(): v for k, v in request.headers.items()}}
        proxy, proxy_auth = self._proxies.for_url(request.url)
        return self._client().request(
            request.method,
            request.url,
            data=request.body or None,  # a GET sends no body (a POST sends Content-Length: 0)
            headers=headers,
            timeout=timeout,
            allow_redirects=False,
            compress=None,
            proxy=proxy,
            proxy_auth=proxy_auth,
        )

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()


class _Proxies:
    """The proxy for each upstream, from ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY`` (any
    case), as curl and requests read them: read once per transport and per origin. aiohttp's
    ``trust_env`` reads them, and ``~/.netrc`` in a worker thread, on every request (~400 µs
    of CPU per request here: bench/speed/levers.py)."""

    def __init__(self) -> None:
        self._env = urllib.request.getproxies_environment()
        self._known: dict[tuple[str, str], tuple[str | None, aiohttp.BasicAuth | None]] = {}

    def for_url(self, url: str) -> tuple[str | None, aiohttp.BasicAuth | None]:
        parts = urlsplit(url)
        key = (parts.scheme, parts.netloc)
        known = self._known.get(key)
        if known is None:
            known = self._known[key] = self._lookup(parts.scheme, parts.hostname or "")
        return known

    def _lookup(self, scheme: str, host: str) -> tuple[str | None, aiohttp.BasicAuth | None]:
        proxy = self._env.get(scheme)
        # NO_PROXY as getproxies_environment read it; typeshed leaves this function out.
        bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
        if not proxy or bypass(host, self._env):
            return None, None
        parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        auth = None
        if parts.username is not None:
            user, password = unquote(parts.username), unquote(parts.password or "")
            auth = aiohttp.BasicAuth(user, password)
        netloc = parts.hostname or ""
        if parts.port is not None:
            netloc = f"{netloc}:{parts.port}"
        return f"{parts.scheme}://{netloc}", auth


class _Stream:
    """A :class:`~.transport.StreamReply` over an aiohttp response."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.status, self.headers = _head(response)
        self._response = response

    async def reads(self) -> AsyncIterator[bytes]:
        content = self._response.content
        try:
            async for piece in content.iter_any():
                yield piece
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
            raise _translate(e) from e

    async def aread(self) -> bytes:
        try:
            return await _read_capped(self._response, MAX_REPLY_BYTES)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
            raise _translate(e) from e


def _head(response: aiohttp.ClientResponse) -> tuple[int, Mapping[str, str]]:
    """The status and headers (names lower-cased; a repeated header's last value)."""
    status = response.status
    if status == 101 or not 100 <= status <= 599:
        raise BadResponse(f"the upstream answered with status {status}")
    headers = {k.lower(): v for k, v in response.headers.items()}
    coding = headers.get("content-encoding", "").strip().lower()
    if coding not in DECODED:
        # aiohttp passes a coding it does not decode through as if it were plain (x-gzip,
        # compress; br and zstd without their packages): the body would be read as garbage.
        raise BadResponse(f"the upstream sent a body in the {coding!r} encoding")
    return status, headers


async def _read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """The rest of the decoded body, refused past ``cap`` bytes."""
    pieces: list[bytes] = []
    size = 0
    async for piece in response.content.iter_any():
        size += len(piece)
        if size > cap:
            response.close()
            raise BadResponse(f"the upstream's reply is larger than {cap} bytes")
        pieces.append(piece)
    return b"".join(pieces)


def _translate(e: BaseException) -> TransportError:
    """The one place aiohttp's (and the socket's) errors become the transport's."""
    if isinstance(e, ce.ConnectionTimeoutError | ce.ClientConnectorError | ce.InvalidURL):
        return ConnectFailed(f"could not connect to the upstream: {e}")
    if isinstance(e, ce.ServerTimeoutError | TimeoutError):
        return TimedOut("the upstream sent nothing in time")
    if isinstance(e, ce.ClientPayloadError):
        cause = e.__cause__
        if isinstance(cause, ContentLengthError | TransferEncodingError) or cause is None:
            return ConnectionLost(f"the upstream's reply ended early: {e}")
        # A corrupt compressed body, a chunk size line past the limits: not a cut connection.
        return BadResponse(f"the upstream's body cannot be read: {e}")
    if isinstance(e, ce.ClientResponseError):
        # Raised while parsing the status line and headers: not HTTP, or over the limits.
        return BadResponse(f"invalid HTTP from the upstream: {e.message}")
    if isinstance(e, ValueError):
        return BadResponse(f"the upstream's reply cannot be read: {e}")
    return ConnectionLost(f"the upstream connection failed: {type(e).__name__}: {e}")


def default_tls() -> ssl.SSLContext:
    """What HTTPS upstreams are checked with: certifi's CAs, hostnames verified."""
    return ssl.create_default_context(cafile=_ca_file())


def _ca_file() -> str | None:
    """certifi's bundle where it is installed (the Lambda artifact carries it), else the
    system's store."""
    try:
        import certifi
    except ImportError:
        return None
    # The file beside the module: certifi.where() goes through importlib.resources, which
    # imports zipfile (~6 ms of a cold start) to find the same path.
    bundle = os.path.join(os.path.dirname(certifi.__file__), "cacert.pem")
    if os.path.isfile(bundle):
        return bundle
    where: str = certifi.where()
    return where
