"""Incremental parsing of a server-sent event stream, as providers send chat completions.

Follows the WHATWG event-stream interpretation rules for what chat completions need: lines
end with CRLF, LF or a bare CR; one UTF-8 BOM at the start of the stream is ignored; bytes
that are not UTF-8 become U+FFFD rather than failing the stream; an event's ``data`` lines
(``data`` with no colon is an empty one) are joined with newlines, and a blank line dispatches
the event if it has any data. Comments and the other fields (``event``, ``id``, ``retry``)
are skipped. Unlike a browser, :meth:`SSEParser.flush` still delivers an event the provider
did not terminate with a blank line before closing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hardcap_core import json_codec

DONE = "[DONE]"

_BOM = b"\xef\xbb\xbf"
_LF = 0x0A
_CR = 0x0D


class SSEParser:
    """Feed it bytes as they arrive; it yields the data of each complete event.

    Each :meth:`feed` parses its bytes when called (the returned iterator only hands out the
    events), so the parser's state never depends on how far a caller iterates.
    """

    def __init__(self) -> None:
        self._buffer = b""  # the start of a line whose end has not arrived yet
        self._data: list[bytes] = []  # the data lines of the event in progress
        self._at_start = True  # a BOM may still come
        self._after_cr = False  # the last line ended with CR: an LF next belongs to it

    def feed(self, chunk: bytes) -> Iterator[str]:
        """The data of each event this read completes; a partial line waits for the next."""
        if not chunk:
            return iter(())
        buf = self._buffer + chunk if self._buffer else chunk
        if self._after_cr:
            self._after_cr = False
            if buf[0] == _LF:
                buf = buf[1:]
        if self._at_start:
            if len(buf) < len(_BOM) and _BOM.startswith(buf):
                self._buffer = buf
                return iter(())
            self._at_start = False
            if buf.startswith(_BOM):
                buf = buf[len(_BOM) :]
        if not buf:
            self._buffer = b""
            return iter(())
        # bytes.splitlines breaks at exactly CRLF, LF and CR, the spec's line ends.
        lines = buf.splitlines()
        last = buf[-1]
        if last in (_LF, _CR):
            self._buffer = b""
            self._after_cr = last == _CR
        else:
            self._buffer = lines.pop()
        return iter(self._lines(lines))

    def flush(self) -> Iterator[str]:
        """What is left when the stream ends: the unterminated event, if it has data."""
        lines = [self._buffer, b""] if self._buffer else [b""]
        self._buffer = b""
        self._after_cr = False
        return iter(self._lines(lines))

    def _lines(self, lines: list[bytes]) -> list[str]:
        events: list[str] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    events.append(b"\n".join(data).decode("utf-8", "replace"))
                    data = []
            elif line.startswith(b"data: "):
                data.append(line[6:])
            elif line.startswith(b"data:"):
                data.append(line[5:])
            elif line == b"data":
                data.append(b"")
        self._data = data
        return events


def encode(payload: dict[str, Any] | str) -> bytes:
    """One SSE event carrying ``payload`` (a JSON object, or a literal such as [DONE])."""
    data = payload.encode() if isinstance(payload, str) else json_codec.dumps(payload)
    return b"data: " + data + b"\n\n"
