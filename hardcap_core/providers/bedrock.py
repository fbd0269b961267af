"""Amazon Bedrock upstreams, through the Converse and ConverseStream APIs.

Authenticated by the function's IAM role: botocore's default credential chain (the role's
credentials in Lambda's environment, a profile or environment variables elsewhere), never an
API key. botocore does the SigV4 signing and decodes AWS's event-stream framing; this module
only translates. The request is built by :mod:`.bedrock_request`; one botocore client per
upstream is created on first use (its region: the upstream's ``region``, else botocore's own
resolution, which in Lambda is the function's region; its endpoint: ``base_url`` if set) with
no retries of its own: a failed call goes back to the gateway, whose fallbacks decide.

botocore blocks, so calls run in this provider's worker threads. A stream's thread makes the
call and iterates the event stream, handing each event to the event loop through a queue; the
gateway gets one :data:`~hardcap_core.events.Read` per batch of events that arrived together.
Leaving the stream shuts the connection's socket down (which wakes the thread if it is waiting
for Bedrock) and the thread closes the event stream: the connection drops and Bedrock stops
generating.

Counted output (every delta kind Converse defines, and anything else by its length):
``text`` -> content; ``reasoningContent.text`` -> reasoning; ``reasoningContent.signature``
and ``redactedContent`` -> other, by length (see :func:`_reasoning`); ``toolUse.input`` -> tool
arguments and the tool's name at ``contentBlockStart`` -> tool name. Usage comes from the
``metadata`` event, after which the stream is complete. Bedrock reports ``inputTokens``
*without* the prompt-cache reads and writes (``cacheReadInputTokens``,
``cacheWriteInputTokens``), so billed input is their sum.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, suppress
from typing import Any

from hardcap_core.chat import BEDROCK_CONVERSE, ChatRequest
from hardcap_core.config import Route, Upstream
from hardcap_core.config.settings import DEFAULT_GATEWAY
from hardcap_core.events import Completion, Event, FinishReason, Output, OutputKind, Read, Usage
from hardcap_core.logs import logger
from hardcap_core.providers.base import no_embeddings
from hardcap_core.providers.bedrock_errors import call_error, event_error, transport_failure
from hardcap_core.providers.bedrock_request import converse_params
from hardcap_core.providers.transport import CONNECT_TIMEOUT_S
from hardcap_core.tokenize.heuristics import streamed_tokens, text_tokens

DIALECT = BEDROCK_CONVERSE
# Streams and calls in flight at once per process (each holds a thread and a connection).
MAX_CALLS = 512
# How long leaving a stream waits for its thread; past that the thread ends by itself.
CLOSE_WAIT_S = 5.0
FINISH = {
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "max_tokens": FinishReason.LENGTH,
    "model_context_window_exceeded": FinishReason.LENGTH,
    "tool_use": FinishReason.TOOL_CALLS,
    "guardrail_intervened": FinishReason.CONTENT_FILTER,
    "content_filtered": FinishReason.CONTENT_FILTER,
}
# Not output: the call's metrics, a guardrail's trace, and settings echoed back.
METADATA_NOT_BILLED = frozenset({"metrics", "trace", "performanceConfig", "serviceTier"})
_OPEN = object()  # the worker's first item once Bedrock answered 200
_END = object()  # the event stream ended


def make_client(upstream: Upstream) -> Any:
    """A bedrock-runtime client for ``upstream``: no retries, its timeout as the read timeout."""
    import botocore.config
    import botocore.session

    config = botocore.config.Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        read_timeout=upstream.timeout_seconds,
        connect_timeout=CONNECT_TIMEOUT_S,
        max_pool_connections=MAX_CALLS,
        user_agent_extra="hardcap",
    )
    return botocore.session.get_session().create_client(
        "bedrock-runtime",
        region_name=upstream.region,
        endpoint_url=upstream.base_url or None,
        config=config,
    )


class BedrockConverse:
    """A :class:`~hardcap_core.providers.base.Provider` for Amazon Bedrock (Converse)."""

    dialect = DIALECT

    def __init__(
        self,
        *,
        chars_per_token: float = DEFAULT_GATEWAY.chars_per_token,
        client_factory: Callable[[Upstream], Any] | None = None,
    ) -> None:
        self.chars_per_token = chars_per_token
        self._factory = client_factory or make_client
        self._clients: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()  # creating a client is not thread-safe
        self._executor = ThreadPoolExecutor(MAX_CALLS, thread_name_prefix="bedrock")

    def client(self, upstream: Upstream) -> Any:
        """The upstream's client, created on first use (in a worker thread: it takes a while)."""
        # Everything the client is built from: two configs may share an upstream's name.
        key = (upstream.name, upstream.base_url, upstream.region, upstream.timeout_seconds)
        with self._lock:
            found = self._clients.get(key)
            if found is None:
                found = self._clients[key] = self._factory(upstream)
            return found

    async def complete(self, route: Route, request: ChatRequest, max_tokens: int) -> Completion:
        no_embeddings(request)
        params = converse_params(route, request, max_tokens)

        def call() -> Any:
            return self.client(route.upstream).converse(**params)

        loop = asyncio.get_running_loop()
        try:
            data = await loop.run_in_executor(self._executor, call)
        except Exception as e:
            raise call_error(route, e) from e
        data.pop("ResponseMetadata", None)
        output = self._message_outputs(data.get("output"))
        return Completion(
            data,
            output,
            sum(o.tokens for o in output),
            bedrock_usage(data.get("usage")),
            _finish(data.get("stopReason")),
        )

    @asynccontextmanager
    async def stream(
        self, route: Route, request: ChatRequest, max_tokens: int
    ) -> AsyncIterator[AsyncIterator[Read]]:
        params = converse_params(route, request, max_tokens)
        loop = asyncio.get_running_loop()
        pump = _Pump(loop)
        worker = loop.run_in_executor(
            self._executor,
            pump.run,
            lambda: self.client(route.upstream).converse_stream(**params),
        )
        reads = self._reads(route, pump.queue)
        try:
            first = await pump.queue.get()
            if first is not _OPEN:
                raise call_error(route, first)
            yield reads
        finally:
            await reads.aclose()
            pump.stop()
            try:
                await asyncio.wait_for(asyncio.shield(worker), CLOSE_WAIT_S)
            except TimeoutError:
                logger.warning("bedrock stream thread still busy", extra={"route": route.name})

    async def _reads(self, route: Route, queue: asyncio.Queue[Any]) -> AsyncGenerator[Read, None]:
        """One batch per wake-up: every event the worker queued by then."""
        decoder = _Decoder(self.chars_per_token)
        while True:
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            events: list[Event] = []
            for item in items:
                if item is _END:
                    if events:
                        yield events
                    return
                if isinstance(item, BaseException):
                    error = event_error(item)
                    if error is None:
                        if events:
                            yield events
                        raise transport_failure(item) from item
                    events.append(Event(error=error))
                else:
                    events.append(decoder.event(item))
            yield events

    def _message_outputs(self, output: Any) -> list[Output]:
        """Every billed piece of a whole reply's message."""
        message = output.get("message") if isinstance(output, dict) else None
        blocks = message.get("content") if isinstance(message, dict) else None
        if not isinstance(blocks, list):
            return _other(output, self.chars_per_token)
        cpt = self.chars_per_token
        out: list[Output] = []
        calls = 0
        for block in blocks:
            if not isinstance(block, dict):
                out += _other(block, cpt)
                continue
            for kind, value in block.items():
                if kind == "text" and isinstance(value, str):
                    out.append(Output(OutputKind.CONTENT, value, text_tokens(value, cpt)))
                elif kind == "reasoningContent" and isinstance(value, dict):
                    text = value.get("reasoningText")
                    out += _reasoning(text if isinstance(text, dict) else {}, cpt)
                    out += _reasoning({k: v for k, v in value.items() if k != "reasoningText"}, cpt)
                elif kind == "toolUse" and isinstance(value, dict):
                    name = str(value.get("name") or "")
                    arguments = json.dumps(value.get("input"), separators=(",", ":"))
                    out.append(Output(OutputKind.TOOL_NAME, name, text_tokens(name, cpt), 0, calls))
                    tokens = text_tokens(arguments, cpt)
                    out.append(Output(OutputKind.TOOL_ARGUMENTS, arguments, tokens, 0, calls))
                    calls += 1
                else:
                    out += _other(value, cpt)
        return out


class _Pump:
    """One stream's worker: makes the call in a thread and queues what comes back (the call's
    exception, :data:`_OPEN`, each event, a failure, :data:`_END`) for the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self._lock = threading.Lock()
        self._stopped = False
        self._stream: Any = None

    def run(self, call: Callable[[], Any]) -> None:
        try:
            response = call()
        except Exception as e:
            self._put(e)
            return
        stream = response["stream"]
        with self._lock:
            self._stream = stream
            stopped = self._stopped
        try:
            if stopped:
                return
            self._put(_OPEN)
            for event in stream:
                if self._stopped:
                    return
                self._put(event)
        except Exception as e:
            if not self._stopped:
                self._put(e)
        finally:
            stream.close()
            self._put(_END)

    def stop(self) -> None:
        """Stop reading. A thread waiting for Bedrock is woken by shutting the socket down
        (closing it from here would not wake a blocked read)."""
        with self._lock:
            self._stopped = True
            stream = self._stream
        if stream is not None:
            _shutdown(stream)

    def _put(self, item: object) -> None:
        with suppress(RuntimeError):  # the loop is gone: nobody is reading
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


def _shutdown(stream: Any) -> None:
    """Shut down the socket under botocore's event stream (urllib3's response and
    connection), if it can be found; otherwise the thread stops at the next event."""
    raw = getattr(stream, "_raw_stream", None)
    sock = getattr(getattr(raw, "connection", None), "sock", None)
    if isinstance(sock, socket.socket):
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class _Decoder:
    """ConverseStream events of one stream as :class:`Event`; tool calls are numbered in the
    order they start, as OpenAI numbers them (Bedrock numbers every content block)."""

    def __init__(self, chars_per_token: float) -> None:
        self.cpt = chars_per_token
        self.tools: dict[Any, int] = {}

    def event(self, raw: Any) -> Event:
        if not isinstance(raw, dict):
            other = _other(raw, self.cpt)
            return Event(None, other, sum(o.tokens for o in other))
        out: list[Output] = []
        usage = None
        finish = None
        done = False
        for name, body in raw.items():
            body = body if isinstance(body, dict) else {}
            if name == "contentBlockStart":
                out += self._start(body)
            elif name == "contentBlockDelta":
                out += self._delta(body)
            elif name == "messageStop":
                finish = _finish(body.get("stopReason"))
                out += _other(body.get("additionalModelResponseFields"), self.cpt)
            elif name == "metadata":
                usage = bedrock_usage(body.get("usage"))
                done = True
                extra = {k: v for k, v in body.items() if k not in METADATA_NOT_BILLED}
                extra.pop("usage", None)
                out += _other(extra, self.cpt)
            elif name not in ("messageStart", "contentBlockStop"):
                out += _other(body or raw[name], self.cpt)  # an event this module does not know
        return Event(raw, out, sum(o.tokens for o in out), usage, finish, done=done)

    def _start(self, body: dict[str, Any]) -> list[Output]:
        start = body.get("start")
        if not isinstance(start, dict):
            return []
        out: list[Output] = []
        for kind, value in start.items():
            if kind == "toolUse" and isinstance(value, dict):
                call = self.tools.setdefault(body.get("contentBlockIndex"), len(self.tools))
                name = str(value.get("name") or "")
                tokens = streamed_tokens(name, self.cpt)
                out.append(Output(OutputKind.TOOL_NAME, name, tokens, 0, call))
            else:
                out += _other(value, self.cpt)
        return out

    def _delta(self, body: dict[str, Any]) -> list[Output]:
        delta = body.get("delta")
        if not isinstance(delta, dict):
            return _other(delta, self.cpt)
        cpt = self.cpt
        out: list[Output] = []
        for kind, value in delta.items():
            if kind == "text" and isinstance(value, str):
                if value:
                    out.append(Output(OutputKind.CONTENT, value, streamed_tokens(value, cpt)))
            elif kind == "reasoningContent" and isinstance(value, dict):
                out += _reasoning(value, cpt)
            elif kind == "toolUse" and isinstance(value, dict):
                call = self.tools.setdefault(body.get("contentBlockIndex"), len(self.tools))
                for field, piece in value.items():
                    if field == "input" and isinstance(piece, str):
                        tokens = streamed_tokens(piece, cpt)
                        if piece:
                            out.append(Output(OutputKind.TOOL_ARGUMENTS, piece, tokens, 0, call))
                    else:
                        out += _other(piece, cpt)
            else:
                out += _other(value, cpt)
        return out


def _reasoning(value: dict[str, Any], cpt: float) -> list[Output]:
    """Reasoning text as reasoning; the signature and redacted (encrypted) reasoning by their
    length, shown to nobody. Anthropic's models bill the full thinking while streaming only a
    summary of it (Claude 4); the signature carries the full thinking, encrypted, so its length
    stands in for reasoning that was billed but not shown. Whether the signature itself is
    billed is not documented: it counts, with no lower bound (``least`` 0), so the gateway's own
    cap never cuts a stream on it alone."""
    out: list[Output] = []
    for field, piece in value.items():
        if not piece:
            continue
        if field == "text" and isinstance(piece, str):
            out.append(Output(OutputKind.REASONING, piece, streamed_tokens(piece, cpt)))
        elif field == "signature" and isinstance(piece, str):
            out.append(Output(OutputKind.OTHER, "", text_tokens(piece, cpt), least=0))
        elif isinstance(piece, bytes | bytearray):
            out.append(Output(OutputKind.OTHER, "", max(1, round(len(piece) / cpt))))
        else:
            out += _other(piece, cpt)
    return out


def _other(value: Any, cpt: float) -> list[Output]:
    """A value without a rule, counted by its length (bytes by their size) and shown to
    nobody: its text is not the reply's."""
    if not value:
        return []
    if isinstance(value, bytes | bytearray):
        return [Output(OutputKind.OTHER, "", max(1, round(len(value) / cpt)))]
    text = value if isinstance(value, str) else json.dumps(value, default=_size)
    return [Output(OutputKind.OTHER, "", text_tokens(text, cpt))]


def _size(value: Any) -> str:
    """JSON for the bytes inside a decoded event: as many characters as they have bytes."""
    return "x" * len(value) if isinstance(value, bytes | bytearray) else str(value)


def _finish(reason: Any) -> FinishReason | None:
    if not isinstance(reason, str) or not reason:
        return None
    return FINISH.get(reason, FinishReason.OTHER)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def bedrock_usage(usage: Any) -> Usage | None:
    """Converse's ``usage`` in the gateway's terms: input is ``inputTokens`` plus the cache
    reads and writes, which Bedrock reports apart from it."""
    if not isinstance(usage, dict) or not usage:
        return None
    fresh = _int(usage.get("inputTokens"))
    read = _int(usage.get("cacheReadInputTokens"))
    written = _int(usage.get("cacheWriteInputTokens"))
    total = None if fresh is None else fresh + (read or 0) + (written or 0)
    return Usage(
        input_tokens=total,
        output_tokens=_int(usage.get("outputTokens")),
        cached_input_tokens=read,
        cache_write_input_tokens=written,
        raw=usage,
    )
