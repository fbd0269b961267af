"""The gateway's input estimate: every field a provider bills counts, unknown fields count,
parameters do not, media follow OpenAI's rules, and the estimate is never below what the mock
upstream bills with a real tokenizer (cl100k_base) for any shape of the bench table."""

from __future__ import annotations

import base64
import json
import os
import string
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardcap_core.local.mock_billing import prompt_tokens, text_tokens
from hardcap_core.local.mock_plan import ChatRequest, estimate_prompt_tokens
from hardcap_core.tokenize.heuristics import input_text_tokens
from hardcap_core.wire import media
from hardcap_core.wire.openai_input import FREE_PARAMETERS
from hardcap_core.wire.openai_request import parse_chat_request
from tests.input_shapes import SHAPES, jpeg_header, mp3, png, shape, wav
from tests.pdf_samples import attacks

USER = {"role": "user", "content": "hello"}


def estimate(body: dict[str, Any]) -> int:
    tokens: int = parse_chat_request(json.dumps(body).encode()).input_tokens
    return tokens


def request(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "small", "messages": list(messages or [USER]), **fields}


def parts(*content: Any) -> dict[str, Any]:
    return request({"role": "user", "content": list(content)})


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


PNG_URL = "data:image/png;base64," + b64(png(1024, 1024))
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
FUNCTION = {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}
TEXT = {"type": "text", "text": "x"}

# (what, body without it, body with it): each kind of billed input.
FIELDS = [
    ("message text", request({"role": "user", "content": ""}), request(USER)),
    ("a text part", parts(TEXT), parts(TEXT, {"type": "text", "text": "more words"})),
    ("a refusal part", parts(TEXT), parts(TEXT, {"type": "refusal", "refusal": "no"})),
    (
        "an image part",
        parts(TEXT),
        parts(TEXT, {"type": "image_url", "image_url": {"url": PNG_URL}}),
    ),
    (
        "an audio part",
        parts(TEXT),
        parts(TEXT, {"type": "input_audio", "input_audio": {"data": b64(wav(1)), "format": "wav"}}),
    ),
    (
        "a file part",
        parts(TEXT),
        parts(
            TEXT, {"type": "file", "file": {"file_data": "data:text/plain;base64," + b64(b"hi")}}
        ),
    ),
    ("a part type nobody knows", parts(TEXT), parts(TEXT, {"type": "video", "video": {"u": 1}})),
    ("a part that is not an object", parts(TEXT), parts(TEXT, "stray text")),
    ("a message name", request(USER), request({**USER, "name": "alice"})),
    (
        "an assistant's tool calls",
        request({"role": "assistant", "content": None}),
        request({"role": "assistant", "content": None, "tool_calls": [CALL]}),
    ),
    (
        "a legacy function call",
        request({"role": "assistant", "content": None}),
        request({"role": "assistant", "content": None, "function_call": CALL["function"]}),
    ),
    (
        "a tool call id",
        request({"role": "tool", "content": "21"}),
        request({"role": "tool", "content": "21", "tool_call_id": "call_1"}),
    ),
    (
        "a message refusal",
        request({"role": "assistant", "content": "x"}),
        request({"role": "assistant", "content": "x", "refusal": "I cannot."}),
    ),
    ("a message field nobody knows", request(USER), request({**USER, "x_note": "remember"})),
    ("tools", request(), request(tools=[{"type": "function", "function": FUNCTION}])),
    ("legacy functions", request(), request(functions=[FUNCTION])),
    ("a response_format schema", request(), request(response_format=SCHEMA)),
    ("a prediction", request(), request(prediction={"type": "content", "content": "text"})),
    ("a tool choice", request(), request(tool_choice={"type": "function", "function": FUNCTION})),
    ("a body field nobody knows", request(), request(x_vendor_documents=["a long document"])),
]


@pytest.mark.parametrize(("what", "without", "with_it"), FIELDS, ids=[f[0] for f in FIELDS])
def test_each_billed_input_field_counts(
    what: str, without: dict[str, Any], with_it: dict[str, Any]
) -> None:
    assert estimate(with_it) > estimate(without), what


@pytest.mark.parametrize("size", [1, 10, 1000])
def test_a_field_nobody_knows_counts_by_its_size(size: int) -> None:
    extra = estimate(request(x_vendor={"words": ["word"] * size})) - estimate(request())
    assert extra >= text_tokens(json.dumps({"words": ["word"] * size}))


PARAMETERS = {
    "stream": True,
    "stream_options": {"include_usage": True},
    "n": 1,
    "max_tokens": 100,
    "max_completion_tokens": 100,
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 40,
    "min_p": 0.1,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "repetition_penalty": 1.1,
    "logit_bias": {str(i): 5 for i in range(200)},
    "logprobs": True,
    "top_logprobs": 5,
    "seed": 42,
    "stop": ["\n\n", "END"],
    "user": "alice-with-a-long-user-id",
    "safety_identifier": "hash",
    "prompt_cache_key": "k",
    "metadata": {"tenant": "alpha", "trace": "x" * 200},
    "store": True,
    "service_tier": "auto",
    "parallel_tool_calls": False,
    "reasoning_effort": "low",
    "verbosity": "low",
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"},
}


def test_the_parameter_list_is_the_free_list() -> None:
    assert set(PARAMETERS) | {"model"} == FREE_PARAMETERS


@pytest.mark.parametrize(("field", "value"), PARAMETERS.items())
def test_parameters_of_the_call_do_not_count(field: str, value: Any) -> None:
    assert estimate(request(**{field: value})) == estimate(request())


@pytest.mark.parametrize("name", SHAPES)
def test_the_estimate_is_never_below_the_tiktoken_bill(name: str) -> None:
    raw = shape(name)
    billed = estimate_prompt_tokens(ChatRequest.model_validate(json.loads(raw)))
    assert parse_chat_request(raw.encode()).input_tokens >= billed


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_is_never_estimated_below_cl100k(text: str) -> None:
    assert input_text_tokens(text) >= text_tokens(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=string.printable, max_size=300))
def test_any_ascii_text_is_never_estimated_below_cl100k(text: str) -> None:
    assert input_text_tokens(text) >= text_tokens(text)


def test_empty_text_is_free_and_any_other_text_costs_at_least_one() -> None:
    assert input_text_tokens("") == 0
    assert input_text_tokens("a") >= 1


def test_tools_and_functions_cost_a_frame_each() -> None:
    one = estimate(request(functions=[FUNCTION])) - estimate(request())
    two = estimate(request(functions=[FUNCTION, FUNCTION])) - estimate(request())
    assert two == 2 * one
    assert one >= 19 + text_tokens(json.dumps(FUNCTION))


# -- media ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "detail", "tokens"),
    [
        # OpenAI's own examples (vision guide, "Calculating costs").
        ((1024, 1024), "high", 765),
        ((2048, 4096), "high", 1105),
        ((4096, 8192), "low", 85),
        # Small: one tile; no upscaling.
        ((100, 100), "high", 255),
        ((512, 512), "auto", 255),
        ((513, 512), None, 425),
        # Long and thin: fit in 2048 first.
        ((8192, 256), "high", 85 + 170 * 4),
        # Unknown size: the bound, whatever the detail but low.
        (None, "high", 1445),
        (None, None, 1445),
        (None, "low", 85),
    ],
)
def test_image_tokens_follow_openai_s_rule(
    size: tuple[int, int] | None, detail: str | None, tokens: int
) -> None:
    assert media.image_tokens(size, detail) == tokens


def test_no_image_size_costs_more_than_the_bound() -> None:
    sizes = [(w, h) for w in range(64, 9000, 97) for h in range(64, 9000, 389)]
    assert max(media.image_tokens(s, "high") for s in sizes) == media.IMAGE_BOUND_TOKENS


def webp(chunk: bytes, payload: bytes) -> bytes:
    return b"RIFF" + b"\x00" * 4 + b"WEBP" + chunk + b"\x00" * 4 + payload


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (png(640, 480), (640, 480)),
        (b"GIF89a" + bytes([0x20, 0x03, 0x58, 0x02]) + b"\x00" * 10, (800, 600)),
        (jpeg_header(2048, 4096), (2048, 4096)),
        (webp(b"VP8 ", b"\x00" * 6 + bytes([0x80, 0x02, 0xE0, 0x01])), (640, 480)),
        (
            webp(b"VP8X", b"\x00" * 4 + (639).to_bytes(3, "little") + (479).to_bytes(3, "little")),
            (640, 480),
        ),
        (webp(b"VP8L", b"\x2f" + ((639) | (479 << 14)).to_bytes(4, "little")), (640, 480)),
        (b"not an image at all", None),
        (b"\x89PNG\r\n\x1a\n", None),  # cut short
        (b"\xff\xd8\xff\xe1\xff\xff", None),  # a segment longer than the data
    ],
)
def test_image_sizes_are_read_from_headers(data: bytes, size: tuple[int, int] | None) -> None:
    assert media.image_size(data) == size


def test_an_image_by_url_or_unreadable_costs_the_bound() -> None:
    assert media.url_image_tokens("https://example.com/x.png", "high") == 1445
    assert media.url_image_tokens("data:image/png;base64,bm9wZQ==", None) == 1445
    assert media.url_image_tokens(PNG_URL, None) == 765


@pytest.mark.parametrize(
    ("audio", "tokens"),
    [
        # A WAV's duration from its header: 3 s at 20 tokens a second.
        (wav(3), 3 * 20 + 1),
        (wav(0.5, rate=8_000), 10 + 1),
        # Anything else, from its size at 8 kbit/s (1,000 bytes a second).
        (mp3(2, kbps=64), 16 * 20 + 1),
        (b"\x00" * 5_000, 5 * 20 + 1),
    ],
)
def test_audio_is_bounded_by_its_duration(audio: bytes, tokens: int) -> None:
    assert media.audio_bound_tokens(b64(audio)) == tokens


def test_a_wav_header_that_claims_a_fast_rate_does_not_shorten_it() -> None:
    honest = wav(2)
    # byte rate field (offset 28) claims 100x the rate its samples play at.
    lying = honest[:28] + (3_200_000).to_bytes(4, "little") + honest[32:]
    assert media.audio_bound_tokens(b64(lying)) == media.audio_bound_tokens(b64(honest))


def test_the_mock_bills_audio_at_half_the_bound_rate_and_images_by_the_same_rule() -> None:
    wav_part = {"type": "input_audio", "input_audio": {"data": b64(wav(3)), "format": "wav"}}
    base = prompt_tokens(request())
    assert prompt_tokens(parts(wav_part)) - prompt_tokens(parts()) == 30
    image_part = {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "high"}}
    assert prompt_tokens(parts(image_part)) - prompt_tokens(parts()) == 765
    assert base > 0


def test_the_mock_s_tokenizer_loads_with_the_network_off(tmp_path: Any) -> None:
    # A fresh process, sockets disabled and an empty tiktoken cache: nothing may be fetched.
    code = (
        "import socket\n"
        "def refuse(*a, **k): raise OSError('network used')\n"
        "socket.socket = refuse; socket.create_connection = refuse\n"
        "from hardcap_core.local.mock_billing import text_tokens\n"
        "print(text_tokens('hello world'))\n"
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "2"), done.stderr


# The ways past the cap with a PDF sent as `file_data`: each was estimated by its
# file's bytes (and no image of a page) and billed far more (`tests/pdf_samples.py`).
ATTACKS = attacks()


@pytest.mark.parametrize("name", ATTACKS)
def test_a_pdf_is_never_estimated_below_its_bill(name: str) -> None:
    data = ATTACKS[name]
    file = {"filename": "report.pdf", "file_data": "data:application/pdf;base64," + b64(data)}
    body = parts({"type": "text", "text": "Summarize the report."}, {"type": "file", "file": file})
    billed = prompt_tokens(body)  # pypdf's text of each page by cl100k_base, and its image
    assert estimate(body) >= billed > len(data)  # a token a byte of the file: far too few
