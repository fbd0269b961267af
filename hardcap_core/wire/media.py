"""What images, audio and files in a prompt are billed, from what the request itself carries.

Images follow OpenAI's documented rule for its GPT-4o family (vision guide, "Calculating costs"):
``detail: low`` is 85 tokens; otherwise the image is scaled to fit in 2048 x 2048, then down so
its shortest side is at most 768 px, and costs 85 + 170 per 512-px tile. The size is read from
the header of a ``data:`` URL (PNG, JPEG, GIF, WebP); for a remote URL, or bytes it cannot
read, the bound over every size is used: 2048 x 768 is 4 x 2 tiles, 85 + 8 x 170 = 1445.

The provider-independent pieces (data URLs, image headers) are used by the mock upstream's
billing too, so the two agree on the facts and differ only in the rule they apply.
"""

from __future__ import annotations

import binascii
import math
import struct

LOW_DETAIL_TOKENS = 85
TILE_TOKENS = 170
TILE_PX = 512
FIT_PX = 2048
SHORT_SIDE_PX = 768
# The most any image can cost under the rule above: 2048 x 768 after scaling, 4 x 2 tiles.
IMAGE_BOUND_TOKENS = LOW_DETAIL_TOKENS + TILE_TOKENS * 8

# Audio: OpenAI bills user audio at 1 token per 100 ms and assistant audio at 1 per 50 ms
# (Realtime guide); the input bound uses the faster rate. Without a WAV header to read, the
# duration is bounded by the lowest standard MP3 bitrate, 8 kbit/s: 1,000 bytes a second.
AUDIO_TOKENS_PER_SECOND = 20
LOWEST_BYTES_PER_SECOND = 1_000


def data_url_payload(url: str) -> str | None:
    """The base64 text of a ``data:...;base64,`` URL, or None for any other URL."""
    if not url.startswith("data:"):
        return None
    header, comma, payload = url.partition(",")
    return payload if comma and header.endswith(";base64") else None


def data_url_bytes(url: str, limit: int | None = None) -> bytes | None:
    """The bytes of a base64 ``data:`` URL (the first ``limit`` or more of them), or None for
    any other URL. Lenient, like most decoders: characters outside base64 are skipped."""
    payload = data_url_payload(url)
    return None if payload is None else base64_bytes(payload, limit)


def base64_bytes(payload: str, limit: int | None = None) -> bytes:
    """``payload`` decoded (its first ``limit`` bytes or a few more when ``limit`` is set)."""
    if limit is not None:
        payload = payload[: (limit // 3 + 1) * 4]
    payload = payload[: len(payload) - len(payload) % 4]
    try:
        return binascii.a2b_base64(payload)
    except binascii.Error:
        return b""


def decoded_size(payload: str) -> int:
    """How many bytes the base64 text ``payload`` decodes to, at most (no decoding)."""
    return len(payload.rstrip("=")) * 3 // 4


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the header of a PNG, GIF, WebP or JPEG file; None if unreadable."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        return _positive(struct.unpack(">II", data[16:24]))
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return _positive(struct.unpack("<HH", data[6:10]))
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


def _positive(size: tuple[int, int]) -> tuple[int, int] | None:
    return size if size[0] > 0 and size[1] > 0 else None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack("<HH", data[26:30])
        return _positive((width & 0x3FFF, height & 0x3FFF))
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return _positive(((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1))
    if chunk == b"VP8X" and len(data) >= 30:
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return _positive((width, height))
    return None


# Start-of-frame markers: C0-CF but DHT (C4), JPG (C8) and DAC (CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """Walk the segments to the first start-of-frame; a thumbnail inside EXIF is skipped
    with the segment that holds it."""
    i = 2
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _SOF:
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return _positive((width, height))
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        i += 2 + length
    return None


def tiles(size: tuple[int, int]) -> int:
    """The 512-px tiles of an image of ``size`` by OpenAI's tile rule: scaled to fit in
    2048 x 2048, then down so its shortest side is at most 768 px (at most 4 x 2 tiles)."""
    width, height = float(size[0]), float(size[1])
    if max(width, height) > FIT_PX:
        scale = FIT_PX / max(width, height)
        width, height = width * scale, height * scale
    if min(width, height) > SHORT_SIDE_PX:
        scale = SHORT_SIDE_PX / min(width, height)
        width, height = width * scale, height * scale
    # Rounded first: 1024 * (768 / 1024) must be 768, one tile edge, not 768.0000001.
    return math.ceil(round(width, 6) / TILE_PX) * math.ceil(round(height, 6) / TILE_PX)


def image_tokens(size: tuple[int, int] | None, detail: str | None) -> int:
    """Tokens of one image by OpenAI's rule (see the module docstring); the bound over every
    size when ``size`` is None."""
    if detail == "low":
        return LOW_DETAIL_TOKENS
    if size is None:
        return IMAGE_BOUND_TOKENS
    return LOW_DETAIL_TOKENS + TILE_TOKENS * tiles(size)


def url_image_tokens(url: str, detail: str | None) -> int:
    """Tokens of an ``image_url`` by its header when it is a data URL, else the bound."""
    if detail == "low":
        return LOW_DETAIL_TOKENS
    data = data_url_bytes(url)
    return image_tokens(None if data is None else image_size(data), detail)


def wav_seconds(data: bytes) -> float | None:
    """The duration of an uncompressed (PCM or float) WAV file from its header, or None.

    The rate is the lower of the declared byte rate and sample rate x block size (a decoder
    plays samples, whatever the byte-rate field says), so a lying header can only lengthen it.
    """
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    i, rate = 12, 0
    while i + 8 <= len(data):
        chunk, size = data[i : i + 4], int.from_bytes(data[i + 4 : i + 8], "little")
        if chunk == b"fmt " and size >= 16 and i + 24 <= len(data):
            fmt, _, sample_rate, byte_rate, block = struct.unpack("<HHIIH", data[i + 8 : i + 22])
            if fmt not in (1, 3):  # compressed: its duration is not in the header
                return None
            rate = min(byte_rate, sample_rate * block)
        elif chunk == b"data":
            if rate <= 0:
                return None
            # The declared size, or what is there when a streamed WAV left it at 0 or too big.
            available = len(data) - i - 8
            return (size if 0 < size <= available else available) / rate
        i += 8 + size + (size & 1)
    return None


def audio_seconds_bound(payload: str) -> float:
    """The longest base64 audio ``payload`` can play: its WAV header's duration, else its size
    at 8 kbit/s (MP3's lowest standard bitrate)."""
    seconds = wav_seconds(base64_bytes(payload))
    return decoded_size(payload) / LOWEST_BYTES_PER_SECOND if seconds is None else seconds


def audio_bound_tokens(payload: str) -> int:
    """An upper bound on the tokens of base64 audio ``payload``, at 20 tokens a second."""
    return math.ceil(audio_seconds_bound(payload) * AUDIO_TOKENS_PER_SECOND) + 1
