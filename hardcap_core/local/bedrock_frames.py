"""AWS's event-stream framing and SigV4 check, as the local Bedrock fake
(:mod:`~hardcap_core.local.bedrock_fake`) speaks them.

The fake encodes frames itself, byte by byte, so the gateway's side (botocore's decoder) is
tested against an independent encoder; it checks signatures with botocore's own signer, which
is what real AWS agrees with.
"""

from __future__ import annotations

import hmac
import json
import re
import struct
import zlib
from typing import Any

from starlette.requests import Request

EVENT_STREAM = "application/vnd.amazon.eventstream"
_SIGV4 = re.compile(
    r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([a-z0-9-]+)/bedrock/aws4_request, "
    r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})"
)


def frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message: prelude (total length, headers length, CRC32 of those 8
    bytes), headers (each: name length, name, type 7 = string, value length, value), payload,
    and the CRC32 of everything before it."""
    encoded = b"".join(
        bytes([len(name)])
        + name.encode()
        + b"\x07"
        + struct.pack(">H", len(value))
        + value.encode()
        for name, value in headers.items()
    )
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack(">II", total, len(encoded))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    message = prelude + encoded + payload
    return message + struct.pack(">I", zlib.crc32(message))


def event_frame(event_type: str, body: dict[str, Any]) -> bytes:
    headers = {":event-type": event_type, ":content-type": "application/json"}
    return frame({**headers, ":message-type": "event"}, json.dumps(body).encode())


def exception_frame(exception_type: str, message: str) -> bytes:
    headers = {":exception-type": exception_type, ":content-type": "application/json"}
    return frame(
        {**headers, ":message-type": "exception"}, json.dumps({"message": message}).encode()
    )


def signature_problem(request: Request, body: bytes, secret: str | None) -> str | None:
    """Why the request's SigV4 signature is not acceptable, or None: the Authorization header
    has SigV4's form for the service "bedrock", and (with ``secret``) its signature is the one
    botocore's own signer computes over the signed headers, path, query and body."""
    match = _SIGV4.fullmatch(request.headers.get("authorization", ""))
    if match is None:
        return "Missing or malformed SigV4 Authorization header (service bedrock)."
    if secret is None:
        return None
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    key, _, region, signed, signature = match.groups()
    headers = {name: request.headers.get(name, "") for name in signed.split(";")}
    raw_path = request.scope.get("raw_path") or request.url.path.encode()
    query = request.scope.get("query_string", b"")
    url = f"http://{headers.get('host', 'localhost')}{raw_path.decode()}"
    url += f"?{query.decode()}" if query else ""
    aws = AWSRequest(method=request.method, url=url, data=body, headers=headers)
    aws.context["timestamp"] = headers.get("x-amz-date", "")
    signer = SigV4Auth(Credentials(key, secret), "bedrock", region)
    canonical = signer.canonical_request(aws)
    expected = signer.signature(signer.string_to_sign(aws, canonical), aws)
    if not hmac.compare_digest(expected, signature):
        return "The request signature we calculated does not match the signature you provided."
    return None
