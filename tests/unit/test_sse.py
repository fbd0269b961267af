"""The SSE parser against the WHATWG event-stream interpretation rules, as providers stream.

https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation
Only the data of each event matters to the gateway. One deliberate extension: at the end of the
stream, flush() delivers an event the provider did not terminate with a blank line (browsers
discard it).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hardcap_core.sse import DONE, MAX_EVENT_BYTES, EventTooLarge, SSEParser, encode

BOM = b"\xef\xbb\xbf"


def parse(chunks: Iterable[bytes]) -> tuple[list[str], list[str]]:
    """(events the feeds yielded, events flush() yielded) for a stream read as ``chunks``."""
    parser = SSEParser()
    fed = [data for chunk in chunks for data in parser.feed(chunk)]
    return fed, list(parser.flush())


def spec_events(stream: bytes) -> list[str]:
    """The spec's algorithm step by step, on the whole stream at once, plus the gateway's flush.

    Decode as UTF-8 with replacement, drop one leading BOM, split on CRLF / LF / CR; an empty
    line dispatches the data buffer (if any), ':' starts a comment, otherwise the field is what
    precedes the first ':' and the value what follows it, less one leading space.
    """
    text = stream.decode("utf-8", errors="replace").removeprefix("\ufeff")
    *lines, rest = re.split(r"\r\n|\r|\n", text)
    if rest:  # the gateway's extension: an unterminated last line still counts at EOF
        lines.append(rest)
    lines.append("")  # ... and so does an undispatched event
    events: list[str] = []
    buffer = ""
    for line in lines:
        if line == "":
            if buffer:
                events.append(buffer.removesuffix("\n"))
            buffer = ""
            continue
        if line.startswith(":"):
            continue
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "data":
            buffer += value + "\n"
    return events


def chat_chunk(content: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1718000000,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}],
    }


CHAT_STREAM = (
    b": OPENROUTER PROCESSING\n\n"
    + encode(chat_chunk("Hel"))
    + encode(chat_chunk("lo, w\u00f6rld \u20ac \U0001f600"))
    + b": ping\n\n"
    + encode(chat_chunk("", "stop"))
    + encode(DONE)
)
CHAT_EVENTS = [  # encode() writes UTF-8 as it is, as most providers do
    json.dumps(chat_chunk("Hel"), separators=(",", ":"), ensure_ascii=False),
    json.dumps(
        chat_chunk("lo, w\u00f6rld \u20ac \U0001f600"), separators=(",", ":"), ensure_ascii=False
    ),
    json.dumps(chat_chunk("", "stop"), separators=(",", ":"), ensure_ascii=False),
    DONE,
]

# Streams that end with a blank line: every event arrives from feed(), flush() adds nothing.
COMPLETE: dict[str, tuple[bytes, list[str]]] = {
    # Line endings: the spec accepts CRLF, LF and a bare CR, mixed in one stream.
    "lf": (b"data: a\n\n", ["a"]),
    "crlf": (b"data: a\r\n\r\n", ["a"]),
    "cr": (b"data: a\r\r", ["a"]),
    "crlf-multiline": (b"data: a\r\ndata: b\r\n\r\n", ["a\nb"]),
    "cr-multiline": (b"data: a\rdata: b\r\r", ["a\nb"]),
    "cr-then-crlf": (b"data: a\r\r\n", ["a"]),
    "lf-cr-is-two-line-ends": (b"data: a\n\rdata: b\n\n", ["a", "b"]),
    "mixed": (b"data: a\r\ndata: b\rdata: c\n\r\ndata: d\r\r\n", ["a\nb\nc", "d"]),
    # Several events, blank lines.
    "two-events": (b"data: a\n\ndata: b\n\n", ["a", "b"]),
    "extra-blank-lines": (b"\n\ndata: a\n\n\n\ndata: b\n\n\n", ["a", "b"]),
    "only-blank-lines": (b"\n\r\n\r\n\n", []),
    # Comments, e.g. keep-alives, anywhere; they never dispatch or add data.
    "comment-alone": (b": ping\n\n", []),
    "comment-before": (b": ping\n\ndata: a\n\n", ["a"]),
    "comment-inside-event": (b"data: a\n: keep-alive\ndata: b\n\n", ["a\nb"]),
    "comment-empty": (b":\n\n", []),
    "comment-looks-like-data": (b":data: a\n\n", []),
    # Other fields are not data; an event with no data line dispatches nothing.
    "other-fields": (b"event: message\nid: 7\nretry: 1000\ndata: a\n\n", ["a"]),
    "event-without-data": (b"event: ping\n\n", []),
    "id-without-data": (b"id: 1\n\ndata: a\n\n", ["a"]),
    "unknown-field": (b"foo: bar\ndata: a\n\n", ["a"]),
    "field-names-are-exact": (
        b"datum: x\ndata2: x\nDATA: x\n data: x\ndata : x\ndatadata: x\n\n",
        [],
    ),
    # Multi-line data is joined with LF, empty lines of data kept.
    "multiline": (b"data: a\ndata: b\ndata: c\n\n", ["a\nb\nc"]),
    "multiline-empty-middle": (b"data: a\ndata:\ndata: b\n\n", ["a\n\nb"]),
    "multiline-empty-last": (b"data: a\ndata:\n\n", ["a\n"]),
    # `data` alone is a data field with an empty value: the event is dispatched, empty.
    "data-no-colon": (b"data\n\n", [""]),
    "data-no-colon-twice": (b"data\ndata\n\n", ["\n"]),
    "data-no-colon-after-value": (b"data: a\ndata\n\n", ["a\n"]),
    "data-empty-value": (b"data:\n\n", [""]),
    "data-only-space": (b"data: \n\n", [""]),
    # Exactly one leading space is stripped; nothing else.
    "no-space": (b"data:a\n\n", ["a"]),
    "two-spaces": (b"data:  a\n\n", [" a"]),
    "tab-kept": (b"data:\ta\n\n", ["\ta"]),
    "trailing-space-kept": (b"data: a \n\n", ["a "]),
    "colons-in-value": (b'data: {"a":"b:c"}\n\n', ['{"a":"b:c"}']),
    "colon-value": (b"data::\n\n", [":"]),
    # One BOM at the very start is dropped; any other is content.
    "bom": (BOM + b"data: a\n\n", ["a"]),
    "bom-then-comment": (BOM + b": hi\n\ndata: a\n\n", ["a"]),
    "second-bom-is-content": (BOM + BOM + b"data: a\n\ndata: b\n\n", ["b"]),
    "bom-mid-stream-is-content": (b"data: a\n\n" + BOM + b"data: b\n\n", ["a"]),
    "bom-in-value-kept": (b"data: " + BOM + b"a\n\n", ["\ufeffa"]),
    # UTF-8; invalid bytes become U+FFFD instead of failing the stream.
    "utf8": ("data: h\u00e9 \u20ac \U0001f600\r\n\r\n".encode(), ["h\u00e9 \u20ac \U0001f600"]),
    "invalid-byte": (b"data: a\xffb\n\n", ["a\ufffdb"]),
    "truncated-char": (b"data: a\xe2\x82\n\n", ["a\ufffd"]),
    "truncated-char-before-lf": (b"data: \xf0\x9f\ndata: b\n\n", ["\ufffd\nb"]),
    "invalid-in-comment": (b": \xff\xfe\ndata: a\n\n", ["a"]),
    "invalid-in-field-name": (b"\xff: x\ndata\xff: y\ndata: a\n\n", ["a"]),
    "bare-continuation-bytes": (b"data: \x80\x80\n\n", ["\ufffd\ufffd"]),
    # What a provider streams.
    "chat-completion": (CHAT_STREAM, CHAT_EVENTS),
    "chat-completion-crlf": (CHAT_STREAM.replace(b"\n", b"\r\n"), CHAT_EVENTS),
}

# Streams that end without the final blank line: (stream, events from feed, events from flush).
UNTERMINATED: dict[str, tuple[bytes, list[str], list[str]]] = {
    "empty-stream": (b"", [], []),
    "no-blank-line": (b"data: a\n", [], ["a"]),
    "no-line-end": (b"data: a", [], ["a"]),
    "no-line-end-after-event": (b"data: a\n\ndata: b", ["a"], ["b"]),
    "multiline-no-blank-line": (b"data: a\ndata: b\n", [], ["a\nb"]),
    "multiline-no-line-end": (b"data: a\r\ndata: b", [], ["a\nb"]),
    "cr-no-blank-line": (b"data: a\r", [], ["a"]),
    "crlf-no-blank-line": (b"data: a\r\n", [], ["a"]),
    "data-no-colon": (b"data", [], [""]),
    "cut-mid-json": (b'data: {"a":1}\n\ndata: {"b', ['{"a":1}'], ['{"b']),
    "cut-mid-character": (b"data: a\xe2\x82", [], ["a\ufffd"]),
    "comment": (b"data: a\n\n: ping", ["a"], []),
    "comment-with-line-end": (b": ping\n", [], []),
    "other-field": (b"event: x\n", [], []),
    "partial-field-name": (b"dat", [], []),
    "partial-bom": (BOM[:2], [], []),
    "bom-only": (BOM, [], []),
}

CASES = [
    pytest.param(stream, events, [], id=name) for name, (stream, events) in COMPLETE.items()
] + [
    pytest.param(stream, fed, flushed, id=f"eof-{name}")
    for name, (stream, fed, flushed) in UNTERMINATED.items()
]


@pytest.mark.parametrize(("stream", "fed", "flushed"), CASES)
def test_one_read(stream: bytes, fed: list[str], flushed: list[str]) -> None:
    assert parse([stream]) == (fed, flushed)


@pytest.mark.parametrize(("stream", "fed", "flushed"), CASES)
def test_two_reads_split_at_every_offset(stream: bytes, fed: list[str], flushed: list[str]) -> None:
    for cut in range(len(stream) + 1):
        assert parse([stream[:cut], stream[cut:]]) == (fed, flushed), f"cut at byte {cut}"


@pytest.mark.parametrize(("stream", "fed", "flushed"), CASES)
def test_one_byte_per_read_with_empty_reads_between(
    stream: bytes, fed: list[str], flushed: list[str]
) -> None:
    reads = [b""]
    for i in range(len(stream)):
        reads += [stream[i : i + 1], b""]
    assert parse(reads) == (fed, flushed)


@pytest.mark.parametrize(("stream", "fed", "flushed"), CASES)
def test_reference_agrees_with_the_table(stream: bytes, fed: list[str], flushed: list[str]) -> None:
    """The step-by-step reference the property test below relies on gives the same events."""
    assert spec_events(stream) == fed + flushed


@pytest.mark.parametrize(
    ("stream", "events"),
    [
        pytest.param(
            "data: \u20ac\r\ndata: \U0001f600\r\n\r\n".encode(),
            ["\u20ac\n\U0001f600"],
            id="crlf-multibyte",
        ),
        pytest.param(BOM + b"data: a\rdata: b\r\r: c\r\ndata\n\n", ["a\nb", ""], id="bom-cr-mixed"),
    ],
)
def test_three_reads_split_at_every_pair_of_offsets(stream: bytes, events: list[str]) -> None:
    for first in range(len(stream) + 1):
        for second in range(first, len(stream) + 1):
            reads = [stream[:first], stream[first:second], stream[second:]]
            assert parse(reads) == (events, []), f"cuts at bytes {first} and {second}"


PIECES = [
    b"data",
    b"data:",
    b"data: ",
    b":",
    b" ",
    b"a",
    b"{}",
    b"\n",
    b"\r",
    b"\r\n",
    b"\n\n",
    b"event: e",
    b"id: 1",
    b"retry: 5",
    "\u00e9".encode(),
    "\u20ac".encode(),
    "\U0001f600".encode(),
    b"\xff",
    b"\xe2\x82",
    BOM,
]


@given(
    stream=st.lists(st.sampled_from(PIECES), max_size=40).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_any_stream_read_any_way_matches_the_spec(stream: bytes, cuts: list[int]) -> None:
    bounds = [0, *sorted(min(cut, len(stream)) for cut in cuts), len(stream)]
    reads = [stream[start:end] for start, end in itertools.pairwise(bounds)]
    fed, flushed = parse(reads)
    assert fed + flushed == spec_events(stream)
    assert (fed, flushed) == parse([stream])  # where the cut falls never moves an event


def test_many_events_in_one_read_arrive_in_order() -> None:
    stream = b"".join(encode({"n": n}) for n in range(1000))
    fed, flushed = parse([stream])
    assert [json.loads(data)["n"] for data in fed] == list(range(1000))
    assert flushed == []


def test_event_in_progress_carries_over_reads() -> None:
    parser = SSEParser()
    assert list(parser.feed(b"data: a\n")) == []
    assert list(parser.feed(b"data: b\n")) == []
    assert list(parser.feed(b"\ndata: c\n\n")) == ["a\nb", "c"]
    assert list(parser.flush()) == []


def test_feed_parses_when_called_not_when_iterated() -> None:
    """Each read's events are settled by feed() itself, whatever order they are consumed in."""
    parser = SSEParser()
    first = parser.feed(b"data: a\n\ndata: ")
    second = parser.feed(b"b\n\n")
    assert list(second) == ["b"]
    assert list(first) == ["a"]


def test_flush_empties_the_parser() -> None:
    parser = SSEParser()
    assert list(parser.feed(b"data: a\n\ndata: b\ndata: c")) == ["a"]
    assert list(parser.flush()) == ["b\nc"]
    assert list(parser.flush()) == []


@pytest.mark.parametrize(
    "payload",
    [
        chat_chunk("Hello"),
        chat_chunk('line one\nline two\r\n\u2028 \u00e9 \U0001f600 "quoted" data: x\n\n'),
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}},
        {"error": {"message": "rate limited", "code": 429}},
        {},
    ],
    ids=["chunk", "awkward-text", "usage", "error", "empty"],
)
def test_encode_dict_round_trips(payload: dict[str, Any]) -> None:
    wire = encode(payload)
    assert wire.startswith(b"data: ")
    assert wire.endswith(b"\n\n")
    assert wire.count(b"\n") == 2  # one line of data, then the blank line
    assert b"\r" not in wire
    fed, flushed = parse([wire])
    assert [json.loads(data) for data in fed] == [payload]
    assert flushed == []


def test_encode_done_round_trips() -> None:
    assert encode(DONE) == b"data: [DONE]\n\n"
    assert parse([encode(DONE)]) == ([DONE], [])


def test_encoded_stream_round_trips_read_any_way() -> None:
    payloads: list[dict[str, Any] | str] = [chat_chunk("\u20ac"), chat_chunk(""), DONE]
    stream = b"".join(encode(payload) for payload in payloads)
    expected = [
        p if isinstance(p, str) else json.dumps(p, separators=(",", ":"), ensure_ascii=False)
        for p in payloads
    ]
    for cut in range(len(stream) + 1):
        assert parse([stream[:cut], stream[cut:]]) == (expected, [])


# -- the size cap: a line, and the event in progress, hold at most MAX_EVENT_BYTES ---------------


def pieces(stream: bytes, size: int) -> list[bytes]:
    return [stream[i : i + size] for i in range(0, len(stream), size)]


def refused_at(reads: Iterable[bytes], parser: SSEParser | None = None) -> int | None:
    """How many bytes had been fed when feed() raised EventTooLarge (None: it never did)."""
    parser = parser or SSEParser()
    fed = 0
    for read in reads:
        fed += len(read)
        try:
            list(parser.feed(read))
        except EventTooLarge:
            return fed
    return None


@pytest.mark.parametrize("prefix", [b"data: ", b": ", b"event: "], ids=["data", "comment", "other"])
@pytest.mark.parametrize("size", [1000, 65536])
def test_an_endless_line_fails_once_past_the_cap(prefix: bytes, size: int) -> None:
    """A provider that never ends its line is refused as soon as the line passes the cap,
    not when memory runs out; any line counts, not only data."""
    parser = SSEParser()
    assert list(parser.feed(b"data: before\n\n")) == ["before"]
    endless = itertools.chain([prefix], itertools.repeat(b"x" * size, MAX_EVENT_BYTES // size + 2))
    fed = refused_at(endless, parser)
    assert fed is not None
    assert MAX_EVENT_BYTES < fed <= MAX_EVENT_BYTES + size


def test_an_endless_line_in_one_read_fails() -> None:
    assert refused_at([b"data: " + b"x" * MAX_EVENT_BYTES]) is not None


def test_a_whole_line_past_the_cap_fails_even_with_its_end() -> None:
    assert refused_at([b": " + b"x" * MAX_EVENT_BYTES + b"\n\n"]) is not None


@pytest.mark.parametrize("size", [None, 7, 999, 65536], ids=["one-read", "7", "999", "64k"])
def test_an_event_of_many_data_lines_past_the_cap_fails(size: int | None) -> None:
    line = b"data: " + b"y" * 1017 + b"\n"  # 1023 bytes as the event holds them
    stream = line * (2 * MAX_EVENT_BYTES // 1023) + b"\n"
    fed = refused_at([stream] if size is None else pieces(stream, size))
    assert fed is not None
    if size is not None:  # refused at the line that passed the cap, not at the event's end
        assert fed <= MAX_EVENT_BYTES * 1.01 + size  # the cap, plus the lines' ends


def test_many_empty_data_lines_count_too() -> None:
    """Each `data` line adds at least its name to the event: a flood of empty ones is bounded."""
    assert refused_at([b"data\n" * (MAX_EVENT_BYTES // 4 + 1)]) is not None


def just_under(lines: int) -> tuple[bytes, str]:
    """One event of ``lines`` data lines holding exactly MAX_EVENT_BYTES, and its data."""
    each = MAX_EVENT_BYTES // lines
    values = [bytes([0x61 + i % 26]) * (each - 6) for i in range(lines)]
    values[-1] += b"z" * (MAX_EVENT_BYTES - each * lines)
    stream = b"".join(b"data: " + v + b"\r\n" for v in values) + b"\r\n"
    return stream, b"\n".join(values).decode()


@pytest.mark.parametrize("lines", [1, 3, 1024])
@pytest.mark.parametrize("size", [None, 7, 4096, 65536], ids=["one-read", "7", "4k", "64k"])
def test_an_event_just_under_the_cap_passes(lines: int, size: int | None) -> None:
    stream, data = just_under(lines)
    reads = [stream] if size is None else pieces(stream, size)
    assert parse(reads) == ([data], [])


def test_one_byte_more_fails() -> None:
    stream, _ = just_under(3)
    assert refused_at([stream.replace(b"data: a", b"data: aa", 1)]) is not None


@pytest.mark.parametrize("cut", [1, 6, 2000, MAX_EVENT_BYTES - 5, MAX_EVENT_BYTES + 1])
def test_where_a_read_ends_never_moves_the_cap(cut: int) -> None:
    """The same stream fails or passes however it is split into reads."""
    fits, _ = just_under(1)
    too_big = fits.replace(b"data: a", b"data: aa", 1)
    assert parse([fits[:cut], fits[cut:]]) == parse([fits])
    assert refused_at([too_big[:cut], too_big[cut:]]) is not None


def test_the_cap_is_per_event() -> None:
    """A dispatched event frees its room: a long stream of large events is fine."""
    stream, data = just_under(2)
    assert parse(pieces(stream * 5, 10_000)) == ([data] * 5, [])


def test_an_unterminated_event_under_the_cap_is_still_flushed() -> None:
    stream, data = just_under(4)
    assert parse(pieces(stream.removesuffix(b"\r\n"), 3000)) == ([], [data])


def test_event_too_large_is_a_value_error_that_says_the_limit() -> None:
    assert issubclass(EventTooLarge, ValueError)
    with pytest.raises(EventTooLarge, match=f"larger than {MAX_EVENT_BYTES} bytes"):
        SSEParser().feed(b"data: " + b"x" * MAX_EVENT_BYTES)
