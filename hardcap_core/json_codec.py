"""JSON for the hot path: orjson (a provider's chunks, SSE events, upstream bodies, replies).

Decoding and re-encoding a chunk is most of what the gateway spends per relayed token; orjson
does each in about a sixth of the time of ``json`` (bench/results/wrk-overhead.json). A client's
request body is not decoded here: :mod:`hardcap_core.wire.json_body` is strict (duplicate keys,
NaN, huge integers are 400s), which orjson cannot tell apart; it uses :func:`encodes` to find
a lone surrogate, which no encoder writes as UTF-8.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

JSONDecodeError = orjson.JSONDecodeError  # a subclass of json.JSONDecodeError and ValueError


def loads(data: bytes | str) -> Any:
    """The value of JSON text; raises :class:`JSONDecodeError`."""
    return orjson.loads(data)


def dumps(value: Any) -> bytes:
    """Compact JSON as UTF-8. What orjson refuses (an integer past 64 bits that a provider
    sent) is encoded by ``json`` instead, never dropped."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def encodes(value: Any) -> bool:
    """Whether orjson encodes ``value``: False for a string holding a lone UTF-16 surrogate
    (which ``json`` cannot write as UTF-8 either) or an integer past 64 bits (which it can)."""
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return False
    return True
