"""The admin API's client, for ``hardcap admin`` and ``hardcap config``: JSON over httpx, signed
with SigV4 for the admin function's URL (AuthType AWS_IAM) or with a bearer admin token for a
local ``hardcap serve``.

SigV4: botocore's signer (``SigV4Auth``, service ``lambda``) with the operator's own AWS
credentials (profile, environment, SSO: botocore's usual chain), the region from the URL
(``<id>.lambda-url.<region>.on.aws``) or the session. The body's SHA-256 goes in
``x-amz-content-sha256`` and is signed: a function URL requires it for a request with a body.
Not shipped to Lambda (the artifact leaves ``hardcap_core/local/`` out).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Generator, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

OPERATOR_HEADER = "x-hardcap-operator"  # who the local audit names: local:<operator>
PREFIX = "/admin/v1"
SERVICE = "lambda"  # what a function URL's SigV4 scope names
TIMEOUT_S = 30.0
_FUNCTION_URL = re.compile(r"\.lambda-url\.([a-z0-9-]+)\.on\.aws$")


class AdminError(Exception):
    """The admin API answered an error (or could not be reached: ``status`` 0)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def __str__(self) -> str:
        where = f" ({self.param})" if self.param else ""
        return f"{self.status or 'unreachable'}{where}: {self.message}"


def region_of(url: str) -> str | None:
    """The region of a Lambda function URL, from its host name; None for another URL."""
    found = _FUNCTION_URL.search(urlsplit(url).hostname or "")
    return found.group(1) if found else None


def sign(
    method: str,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    credentials: Any,
    region: str,
) -> dict[str, str]:
    """The headers that sign a request (``Authorization``, ``X-Amz-Date``, the body's hash and,
    with temporary credentials, the session token) for a Lambda function URL. ``headers``: the
    ones to sign besides ``host`` (which botocore takes from ``url``)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    signed = {**headers, "x-amz-content-sha256": hashlib.sha256(body).hexdigest()}
    request = AWSRequest(method=method, url=url, data=body, headers=signed)
    SigV4Auth(credentials, SERVICE, region).add_auth(request)
    return {k: v for k, v in request.headers.items() if k.lower() != "host"}


class SigV4(httpx.Auth):
    """httpx auth that signs each request as it is sent, over the URL and body httpx sends."""

    requires_request_body = True

    def __init__(self, credentials: Any, region: str) -> None:
        self.credentials = credentials
        self.region = region

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        to_sign = {k: v for k, v in request.headers.items() if k.lower() == "content-type"}
        added = sign(request.method, str(request.url), request.content, to_sign,
                     self.credentials, self.region)  # fmt: skip
        request.headers.update(added)
        yield request


def aws_auth(url: str, region: str | None = None) -> SigV4:
    """SigV4 with the caller's AWS credentials (botocore's chain: environment, profile, SSO,
    instance role); the region from ``region``, the URL, or the session."""
    import botocore.session

    session = botocore.session.get_session()
    credentials = session.get_credentials()
    if credentials is None:
        raise AdminError(0, "no AWS credentials: set a profile or pass --token for a local "
                            "gateway")  # fmt: skip
    where = region or region_of(url) or session.get_config_variable("region")
    if not where:
        raise AdminError(0, "no AWS region: the URL does not name one; set AWS_REGION")
    return SigV4(credentials.get_frozen_credentials(), where)


class AdminClient:
    """Calls of the admin API at ``url`` (its base: ``https://...on.aws`` or
    ``http://127.0.0.1:8080``), authenticated by ``token`` when given, else by SigV4."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        operator: str | None = None,
        transport: httpx.BaseTransport | None = None,
        auth: httpx.Auth | None = None,
    ) -> None:
        base = url.rstrip("/")
        base = base.removesuffix(PREFIX)
        headers = {"accept": "application/json", "user-agent": "hardcap-admin"}
        if token:
            headers["authorization"] = f"Bearer {token}"
            headers[OPERATOR_HEADER] = operator or _operator()
        elif auth is None:
            auth = aws_auth(base)
        self._http = httpx.Client(base_url=base + PREFIX, headers=headers, auth=auth,
                                  transport=transport, timeout=TIMEOUT_S)  # fmt: skip

    def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One call; its JSON reply, or :class:`AdminError` with the API's message."""
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {} if content is None else {"content-type": "application/json"}
        try:
            reply = self._http.request(method, path, content=content, headers=headers,
                                       params=params)  # fmt: skip
        except httpx.HTTPError as e:
            raise AdminError(0, f"{e.__class__.__name__}: {e}") from None
        try:
            data = reply.json()
        except ValueError:
            data = None
        if reply.status_code >= 400:
            error = data.get("error") if isinstance(data, dict) else None
            if isinstance(error, dict):
                raise AdminError(reply.status_code, str(error.get("message")), error.get("param"))
            # A function URL refusing a signature answers {"Message": ...}.
            text = data.get("Message") if isinstance(data, dict) else None
            text = text or reply.text[:500] or reply.reason_phrase
            raise AdminError(reply.status_code, str(text))
        if not isinstance(data, dict):
            raise AdminError(reply.status_code, "the admin API answered something not JSON")
        return data

    def close(self) -> None:
        self._http.close()


def _operator() -> str:
    """Who the local audit names by default: the login name, made header-safe."""
    name = os.environ.get("USER") or os.environ.get("USERNAME") or "admin"
    return re.sub(r"[^A-Za-z0-9_.@+\-]", "-", name)[:64] or "admin"
