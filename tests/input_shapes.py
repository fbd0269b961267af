"""Request shapes for the input estimate: each a chat body exercising one kind of billed input.

Shared by the unit tests that the gateway's estimate (and a tokenizer route's count) is never
below the mock's tiktoken bill, the end-to-end budget tests, and ``bench/budget/input_estimate.py``
(the table in docs/design.md), which imports it from here: tests import nothing from bench/.
Every shape is deterministic: texts are written here or seeded, media are generated.
"""

# ruff: noqa: RUF001 - the CJK and Greek samples are meant to hold those characters

from __future__ import annotations

import base64
import functools
import inspect
import json
import json.decoder
import random
import string
import struct
import textwrap
import zlib
from collections.abc import Callable
from typing import Any

PROSE = (
    "The gateway keeps a ledger for every tenant. Before a request goes to the provider, it "
    "reserves what the request may cost; while the answer streams, it extends the hold in "
    "small steps; when the answer ends, it settles to what the provider reported. A budget "
    "that cannot cover the next step ends the stream, politely, with a finish reason the "
    "client already knows how to handle. Nobody should be surprised by a bill at the end of "
    "the month, and nobody should wait for a lock that another region holds. "
)
CJK = (
    "网关在请求发送给模型之前，会先为每个租户预留可能消耗的额度。回答流式返回时，它逐步延长预留；"
    "回答结束后，再按照提供商报告的用量结算。"
    "ゲートウェイは、リクエストをモデルに送る前に、テナントごとに必要な予算を確保します。"
    "応答が終わると、プロバイダーが報告した使用量で精算します。"
)
OTHER_SCRIPTS = (
    "Шлюз резервирует бюджет до отправки запроса и списывает фактический расход после ответа. "
    "تحجز البوابة الميزانية قبل إرسال الطلب وتسوي الحساب بعد انتهاء الإجابة. "
    "गेटवे अनुरोध भेजने से पहले बजट आरक्षित करता है और उत्तर के बाद हिसाब करता है। "
    "Ο διακομιστής δεσμεύει τον προϋπολογισμό πριν από το αίτημα. "
)
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🧪", "✅", "🔥", "❤️", "🤖"]


def user(text: Any, **extra: Any) -> dict[str, Any]:
    """A body with one user message (``text`` a string or content parts)."""
    return {"model": "small", "messages": [{"role": "user", "content": text}], **extra}


def seeded(name: str) -> random.Random:
    return random.Random(name)


def png(width: int, height: int) -> bytes:
    """A valid grayscale PNG of that size (all black, so it compresses to little)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * ((width + 1) * height), 9)
    signature = b"\x89PNG\r\n\x1a\n"
    return signature + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def jpeg_header(width: int, height: int) -> bytes:
    """A JPEG's leading segments up to its frame header, an EXIF segment first."""
    exif = b"Exif\x00\x00" + bytes(300)
    sof = b"\x08" + struct.pack(">HH", height, width) + b"\x01\x01\x11\x00"
    return (
        b"\xff\xd8"
        + b"\xff\xe1" + struct.pack(">H", len(exif) + 2) + exif
        + b"\xff\xc0" + struct.pack(">H", len(sof) + 2) + sof
        + b"\xff\xd9"
    )  # fmt: skip


def wav(seconds: float, rate: int = 16_000) -> bytes:
    """A silent 16-bit mono PCM WAV file."""
    data = bytes(int(seconds * rate) * 2)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", len(data))
    return b"RIFF" + struct.pack("<I", len(body) + len(data)) + body + data


def mp3(seconds: float, kbps: int = 64) -> bytes:
    """Bytes that start with an MPEG-1 layer III frame header at ``kbps`` (then noise)."""
    index = (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320).index(kbps)
    header = bytes([0xFF, 0xFB, index << 4 | 0x4, 0xC4])
    return header + seeded("mp3").randbytes(int(seconds * kbps * 1000 / 8) - 4)


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image(url: str, detail: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, "detail": detail}}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def audio(data: bytes, fmt: str) -> dict[str, Any]:
    payload = base64.b64encode(data).decode()
    return {"type": "input_audio", "input_audio": {"data": payload, "format": fmt}}


def file(name: str, mime: str, data: bytes) -> dict[str, Any]:
    return {"type": "file", "file": {"filename": name, "file_data": data_url(mime, data)}}


def seeded_text(name: str, alphabet: str, length: int) -> str:
    rng = seeded(name)
    return "".join(rng.choice(alphabet) for _ in range(length))


def json_schema(target_bytes: int) -> dict[str, Any]:
    """A response_format whose JSON schema serializes to about ``target_bytes``."""
    rng, properties = seeded("schema"), {}
    i = 0
    while len(json.dumps(properties)) < target_bytes:
        words = " ".join(rng.choice(PROSE.split()) for _ in range(12))
        properties[f"field_{i}"] = {
            "type": "object",
            "description": words,
            "properties": {
                "value": {"type": rng.choice(["string", "integer", "number", "boolean"])},
                "unit": {"type": "string", "enum": ["tokens", "usd", "requests"]},
            },
            "required": ["value"],
        }
        i += 1
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "json_schema", "json_schema": {"name": "report", "schema": schema}}


def tool(name: str, description: str) -> dict[str, Any]:
    parameters = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
    }
    return {"name": name, "description": description, "parameters": parameters}


def tool_history(rounds: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in these cities?"}]
    for i in range(rounds):
        call = {
            "id": f"call_{i:04d}abcdef",
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": f"City {i}"})},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        result = json.dumps({"temp": 20 + i, "unit": "celsius", "sky": "clear"})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return messages


AGENT_VERBS = ("search", "read", "write", "list", "create", "update", "delete", "run")
AGENT_NOUNS = ("file", "issue", "ticket", "calendar_event", "query", "deployment")


def agent_tool(i: int) -> dict[str, Any]:
    """A coding agent's tool: a nested schema with enums, arrays, defaults and limits."""
    rng = seeded(f"agent-tool-{i}")
    verb, noun = AGENT_VERBS[i % len(AGENT_VERBS)], AGENT_NOUNS[i % len(AGENT_NOUNS)]
    words = PROSE.split()
    said = " ".join(rng.choice(words) for _ in range(18 + i % 9))
    parameters = {
        "type": "object",
        "properties": {
            "target": {"type": "string", "description": f"The {noun} to {verb}, by path or id."},
            "mode": {
                "type": "string",
                "description": "How to apply it.",
                "enum": ["dry_run", "apply", "preview", "force"][: 2 + i % 3],
            },
            "filters": {
                "type": "object",
                "description": "Only items matching all of these.",
                "properties": {
                    "labels": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
                    "state": {"type": "string", "enum": ["open", "closed", "all"]},
                    "since": {"type": "string", "format": "date-time"},
                    "owner": {
                        "type": "object",
                        "properties": {
                            "kind": {"type": "string", "enum": ["user", "team", "bot"]},
                            "name": {"type": "string", "description": "Their handle."},
                        },
                        "required": ["kind"],
                    },
                },
            },
            "limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
            "fields": {
                "type": "array",
                "description": "Fields to return.",
                "items": {"type": "string", "enum": ["id", "title", "body", "author", "url"]},
            },
            "timeout_s": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        },
        "required": ["target", "mode"],
        "additionalProperties": False,
    }
    function = {"name": f"{verb}_{noun}_{i}", "description": said, "parameters": parameters}
    return {"type": "function", "function": function, **({"strict": True} if i % 4 == 0 else {})}


def agent_turns(rounds: int, calls: int, result_chars: int) -> list[dict[str, Any]]:
    """An agent's history: each round ``calls`` parallel tool calls, each answered by a tool
    result of about ``result_chars`` characters (file contents, search hits)."""
    rng = seeded(f"agent-turns-{rounds}-{calls}-{result_chars}")
    code = inspect.getsource(textwrap)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools; be precise."},
        {"role": "user", "content": "Find why the budget test fails and fix it."},
    ]
    for r in range(rounds):
        batch = []
        for c in range(calls):
            arguments = {"target": f"src/module_{r}_{c}.py", "mode": "preview", "limit": 20,
                         "filters": {"labels": ["bug", "budget"], "state": "open"}}  # fmt: skip
            batch.append({
                "id": "call_" + seeded_text(f"id{r}{c}", string.ascii_letters + string.digits, 24),
                "type": "function",
                "function": {"name": agent_tool(r + c)["function"]["name"],
                             "arguments": json.dumps(arguments)},
            })  # fmt: skip
        messages.append({"role": "assistant", "content": None, "tool_calls": batch})
        for call in batch:
            start = rng.randrange(0, len(code) - result_chars)
            content = code[start : start + result_chars]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    messages.append({"role": "user", "content": "Go on."})
    return messages


@functools.cache
def _non_merging_pairs() -> tuple[str, ...]:
    """Pairs of ASCII letters cl100k_base keeps as two tokens."""
    from hardcap_core.local.mock_billing import text_tokens

    letters = string.ascii_letters
    return tuple(a + b for a in letters for b in letters if text_tokens(a + b) == 2)


def crafted_letters(length: int) -> str:
    """Letters where each next one forms a non-merging pair with the last: about a token each."""
    pairs = _non_merging_pairs()
    rng, text = seeded("crafted"), "q"
    while len(text) < length:
        options = [p[1] for p in pairs if p[0] == text[-1]] or list("jqxz")
        text += rng.choice(options)
    return text


def greedy_text(length: int, alphabet: str) -> str:
    """Each next character the one of ``alphabet`` that adds the most tokens."""
    from hardcap_core.local.mock_billing import text_tokens

    rng, text = seeded("greedy" + alphabet), ""
    for _ in range(length):
        tail = text[-12:]
        text += max(rng.sample(alphabet, len(alphabet)), key=lambda c: text_tokens(tail + c))
    return text


def _shapes() -> dict[str, Callable[[], dict[str, Any]]]:
    rng_emoji = seeded("emoji")
    code = inspect.getsource(json.decoder) + inspect.getsource(textwrap)
    return {
        "plain chat": lambda: {
            "model": "small",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is a token budget?"},
            ],
        },
        "long English": lambda: user(PROSE * 40),
        "code": lambda: user("Review this:\n```python\n" + code + "\n```"),
        "json_schema 255 KB": lambda: user("Fill it.", response_format=json_schema(255_000)),
        "json_schema 8 KB": lambda: user("Fill it.", response_format=json_schema(8_000)),
        "tools + functions": lambda: user(
            "Weather in Paris?",
            tools=[
                {"type": "function", "function": tool(f"get_weather_{i}", PROSE[: 40 * i + 40])}
                for i in range(5)
            ],
            functions=[tool(f"legacy_{i}", PROSE[:80]) for i in range(3)],
            tool_choice="auto",
        ),
        "image low (PNG 4000x3000)": lambda: user(
            [text("Describe."), image(data_url("image/png", png(4000, 3000)), "low")]
        ),
        "image high (PNG 1024x1024)": lambda: user(
            [text("Describe."), image(data_url("image/png", png(1024, 1024)), "high")]
        ),
        "image auto (JPEG 2048x4096)": lambda: user(
            [image(data_url("image/jpeg", jpeg_header(2048, 4096)), "auto")]
        ),
        "image by URL (size unknown)": lambda: user(
            [text("Describe."), image("https://example.com/cat.png", "auto")]
        ),
        "audio WAV 3 s": lambda: user([audio(wav(3), "wav")]),
        "audio MP3 4 s at 64 kbit/s": lambda: user([audio(mp3(4), "mp3")]),
        "file (text, 5 KB)": lambda: user(
            [text("Summarize the file."), file("notes.txt", "text/plain", (PROSE * 15).encode())]
        ),
        "CJK": lambda: user(CJK * 40),
        "other scripts": lambda: user(OTHER_SCRIPTS * 30),
        "emoji": lambda: user(" ".join(rng_emoji.choice(EMOJI) for _ in range(1000))),
        "random ASCII": lambda: user(seeded_text("ascii", string.printable[:94], 6_000)),
        "random lowercase": lambda: user(seeded_text("lower", string.ascii_lowercase, 6_000)),
        "punctuation runs": lambda: user(
            "".join(c * (1 + i % 7) for i, c in enumerate(string.punctuation * 60))
        ),
        "base64 blob in text": lambda: user(
            "Decode this: " + base64.b64encode(seeded("b64").randbytes(6_000)).decode()
        ),
        "names": lambda: {
            "model": "small",
            "messages": [
                {"role": ("user", "assistant")[i % 2], "name": f"agent_{i}", "content": PROSE[:60]}
                for i in range(40)
            ],
        },
        "tool-call history": lambda: {"model": "small", "messages": tool_history(30)},
        "agent: 24 tools, nested schemas and enums": lambda: user(
            "Triage the open budget issues.",
            tools=[agent_tool(i) for i in range(24)],
            tool_choice="auto",
        ),
        "agent: parallel tool calls": lambda: {
            "model": "small",
            "messages": agent_turns(rounds=6, calls=4, result_chars=300),
            "tools": [agent_tool(i) for i in range(20)],
            "parallel_tool_calls": True,
        },
        "agent: long tool results": lambda: {
            "model": "small",
            "messages": agent_turns(rounds=3, calls=1, result_chars=6_000),
            "tools": [agent_tool(i) for i in range(20)],
        },
        "many short messages": lambda: {
            "model": "small",
            "messages": [{"role": "user", "content": "ok"} for _ in range(300)],
        },
        "prediction + unknown fields": lambda: user(
            "Rewrite the paragraph.",
            prediction={"type": "content", "content": PROSE * 5},
            x_vendor_context={"documents": [PROSE * 3, PROSE * 2]},
            temperature=0.2,
            seed=7,
            metadata={"tenant": "alpha"},
        ),
        "crafted letters (non-merging pairs)": lambda: user(crafted_letters(6_000)),
        "greedy worst case (printable)": lambda: user(greedy_text(400, string.printable[:94])),
    }  # fmt: skip


SHAPES: dict[str, Callable[[], dict[str, Any]]] = _shapes()


@functools.cache
def shape(name: str) -> str:
    """The body of the shape ``name`` as JSON (cached: some take a second to build)."""
    return json.dumps(SHAPES[name](), ensure_ascii=False)
