"""Incremental parsing of a server-sent event stream, as providers send chat completions.

Follows the WHATWG event-stream interpretation rules for what chat completions need: lines
end with CRLF, LF or a bare CR; one UTF-8 BOM at the start of the stream is ignored; bytes
that are not UTF-8 become U+FFFD rather than failing the stream; an event's ``data`` lines
(``data`` with no colon is an empty one) are joined with newlines, and a blank line dispatches
the event if it has any data. Comments and the other fields (``event``, ``id``, ``retry``)
are skipped. Unlike a browser, :meth:`SSEParser.flush` still delivers an event the provider
did not terminate with a blank line before closing.

Memory is bounded whatever the provider sends: a line, and the event being assembled (its data
lines plus the line still without its end), may hold at most :data:`MAX_EVENT_BYTES`; past it
:meth:`SSEParser.feed` raises :class:`EventTooLarge`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hardcap_core import json_codec

DONE = "[DONE]"
# A line, or an event's data lines plus its unterminated line, past this is refused: a chat
# chunk is a few hundred bytes; a whole tool call's arguments in one event, some kilobytes.
MAX_EVENT_BYTES = 1 << 20

_BOM = b"\xef\xbb\xbf"
_LF = 0x0A
_CR = 0x0D


class EventTooLarge(ValueError):
    """The provider sent a line or an event larger than :data:`MAX_EVENT_BYTES`."""

    def __init__(self) -> None:
        super().__init__(
            f"the provider sent an SSE line or event larger than {MAX_EVENT_BYTES} bytes"
        )


class SSEParser:
    """Feed it bytes as they arrive; it yields the data of each complete event.

    Each :meth:`feed` parses its bytes when called (the returned iterator only hands out the
    events), so the parser's state never depends on how far a caller iterates.
    """

    def __init__(self) -> None:
        # The start of a line whose end has not arrived yet, in the pieces it came in: an
        # endless line is joined once, when its end comes (or never), not on every read.
        self._partial: list[bytes] = []
        self._partial_bytes = 0
        self._data: list[bytes] = []  # the data lines of the event in progress
        self._held = 0  # their bytes, as they came (with the field name)
        self._at_start = True  # a BOM may still come
        self._after_cr = False  # the last line ended with CR: an LF next belongs to it

    def feed(self, chunk: bytes) -> Iterator[str]:
        """The data of each event this read completes; a partial line waits for the next.

        Raises :class:`EventTooLarge` once a line or the event in progress is past
        :data:`MAX_EVENT_BYTES` (the stream cannot be parsed further).
        """
        if not chunk:
            return iter(())
        if self._partial:
            if _LF not in chunk and _CR not in chunk:
                # The line goes on (CR and LF are the only line ends).
                self._partial.append(chunk)
                self._partial_bytes += len(chunk)
                if self._held + self._partial_bytes > MAX_EVENT_BYTES:
                    raise EventTooLarge()
                return iter(())
            partial = self._partial
            buf = partial[0] + chunk if len(partial) == 1 else b"".join([*partial, chunk])
            self._partial = []
            self._partial_bytes = 0
        else:
            buf = chunk
        if self._after_cr:
            self._after_cr = False
            if buf[0] == _LF:
                buf = buf[1:]
        if self._at_start:
            if len(buf) < len(_BOM) and _BOM.startswith(buf):
                self._partial = [buf]
                self._partial_bytes = len(buf)
                return iter(())
            self._at_start = False
            if buf.startswith(_BOM):
                buf = buf[len(_BOM) :]
        if not buf:
            return iter(())
        # Nothing this read holds can pass the cap unless the event so far and all of it do:
        # only then is each line checked.
        check = self._held + len(buf) > MAX_EVENT_BYTES
        # bytes.splitlines breaks at exactly CRLF, LF and CR, the spec's line ends.
        lines = buf.splitlines()
        last = buf[-1]
        if last in (_LF, _CR):
            self._after_cr = last == _CR
            return iter(self._lines(lines, check))
        rest = lines.pop()
        events = self._lines(lines, check) if lines else []
        if check and self._held + len(rest) > MAX_EVENT_BYTES:
            raise EventTooLarge()
        self._partial = [rest]
        self._partial_bytes = len(rest)
        return iter(events)

    def flush(self) -> Iterator[str]:
        """What is left when the stream ends: the unterminated event, if it has data."""
        rest = b"".join(self._partial)
        self._partial = []
        self._partial_bytes = 0
        self._after_cr = False
        return iter(self._lines([rest, b""] if rest else [b""], check=False))

    def _lines(self, lines: list[bytes], check: bool) -> list[str]:
        events: list[str] = []
        data = self._data
        held = self._held
        for line in lines:
            if not line:
                if data:
                    events.append(b"\n".join(data).decode("utf-8", "replace"))
                    data = []
                held = 0
                continue
            if check and held + len(line) > MAX_EVENT_BYTES:
                raise EventTooLarge()
            if line.startswith(b"data: "):
                data.append(line[6:])
            elif line.startswith(b"data:"):
                data.append(line[5:])
            elif line == b"data":
                data.append(b"")
            else:
                continue
            held += len(line)
        self._data = data
        self._held = held
        return events


def encode(payload: dict[str, Any] | str) -> bytes:
    """One SSE event carrying ``payload`` (a JSON object, or a literal such as [DONE])."""
    data = payload.encode() if isinstance(payload, str) else json_codec.dumps(payload)
    return b"data: " + data + b"\n\n"
