"""Incremental parsing of a server-sent event stream, as providers send chat completions.

Only ``data:`` fields matter for chat completions; an event's data lines are joined with
newlines (per the SSE spec), comments and other fields are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

DONE = "[DONE]"


class SSEParser:
    """Feed it bytes as they arrive; it yields the data of each complete event."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> Iterator[str]:
        self._buffer += chunk
        while True:
            cut = self._buffer.find(b"\n")
            if cut < 0:
                return
            raw, self._buffer = self._buffer[:cut], self._buffer[cut + 1 :]
            line = raw.rstrip(b"\r").decode("utf-8")
            if not line:
                if self._data:
                    yield "\n".join(self._data)
                    self._data = []
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)

    def flush(self) -> Iterator[str]:
        """Whatever complete event is left when the stream ends without a final blank line."""
        if self._buffer:
            yield from self.feed(b"\n")
        if self._data:
            yield "\n".join(self._data)
            self._data = []


def encode(payload: dict[str, Any] | str) -> bytes:
    """One SSE event carrying ``payload`` (a JSON object, or a literal such as [DONE])."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
