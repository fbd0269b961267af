"""The admin CLI's client: SigV4 signing that botocore (and so a function URL with AuthType
AWS_IAM) accepts, the token path for a local gateway, command lines into calls, and replies
into what an operator reads."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from typing import Any

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from hardcap_core.local.admin_client import AdminClient, AdminError, SigV4, region_of
from hardcap_core.local.admin_command import admin_command
from hardcap_core.local.cli import main

URL = "https://q8w7e6r5t4y3u2i1o0p9a8s7d6f5g4h3.lambda-url.eu-west-1.on.aws"
CREDENTIALS = Credentials("ASIAEXAMPLEKEYID0001", "secret-example-key", "session-token-example")
AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/"
    r"(?P<service>[^/]+)/aws4_request, SignedHeaders=(?P<signed>[^,]+), "
    r"Signature=(?P<signature>[0-9a-f]{64})$"
)


class Recorder:
    """An httpx transport that answers ``reply`` and keeps every request it was sent."""

    def __init__(self, reply: dict[str, Any], status: int = 200) -> None:
        self.reply = reply
        self.status = status
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        return httpx.Response(self.status, json=self.reply)


def verify_sigv4(request: httpx.Request, credentials: Credentials) -> dict[str, str]:
    """Check ``request`` as AWS does: recompute its signature with botocore from what was sent
    (method, URL, the signed headers, the body's hash); the Authorization header's parts."""
    found = AUTHORIZATION.match(request.headers["authorization"])
    assert found, request.headers["authorization"]
    parts = found.groupdict()
    signed = parts["signed"].split(";")
    assert request.headers["x-amz-date"][:8] == parts["date"]
    assert request.headers["x-amz-content-sha256"] == hashlib.sha256(request.content).hexdigest()
    sent = AWSRequest(method=request.method, url=str(request.url), data=request.content,
                      headers={name: request.headers[name] for name in signed})  # fmt: skip
    sent.context["timestamp"] = request.headers["x-amz-date"]
    signer = SigV4Auth(credentials, parts["service"], parts["region"])
    string_to_sign = signer.string_to_sign(sent, signer.canonical_request(sent))
    assert signer.signature(string_to_sign, sent) == parts["signature"]
    return parts


def test_sigv4_request_is_one_botocore_accepts() -> None:
    recorder = Recorder({"version": 3, "tenant": {"id": "gamma"}})
    client = AdminClient(URL, transport=httpx.MockTransport(recorder),
                         auth=SigV4(CREDENTIALS, "eu-west-1"))  # fmt: skip
    client.call("POST", "/tenants", {"id": "gamma", "budgets": []}, {"dry": "1 2"})
    (request,) = recorder.requests
    parts = verify_sigv4(request, CREDENTIALS)
    assert (parts["key"], parts["region"], parts["service"]) == (
        "ASIAEXAMPLEKEYID0001", "eu-west-1", "lambda"
    )  # fmt: skip
    signed = set(parts["signed"].split(";"))
    assert {"host", "content-type", "x-amz-date", "x-amz-content-sha256",
            "x-amz-security-token"} <= signed  # fmt: skip
    assert request.headers["x-amz-security-token"] == "session-token-example"
    assert request.url.path == "/admin/v1/tenants" and json.loads(request.content)["id"] == "gamma"
    # A body changed after signing no longer matches the signed hash: AWS refuses it.
    tampered = httpx.Request(request.method, request.url, headers=request.headers,
                             content=b'{"id":"evil"}')  # fmt: skip
    with pytest.raises(AssertionError):
        verify_sigv4(tampered, CREDENTIALS)


def test_sigv4_get_without_a_body_signs_the_empty_hash() -> None:
    recorder = Recorder({"keys": []})
    client = AdminClient(URL, transport=httpx.MockTransport(recorder),
                         auth=SigV4(CREDENTIALS, "eu-west-1"))  # fmt: skip
    client.call("GET", "/keys", params={"tenant": "gamma"})
    (request,) = recorder.requests
    verify_sigv4(request, CREDENTIALS)
    assert request.headers["x-amz-content-sha256"] == hashlib.sha256(b"").hexdigest()
    assert "authorization" in request.headers and "bearer" not in request.headers["authorization"]


def test_sigv4_uses_the_callers_credentials_and_the_urls_region(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAOPERATOR00000001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "operator-secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # the URL's region wins
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    recorder = Recorder({"tenants": []})
    client = AdminClient(URL + "/admin/v1/", transport=httpx.MockTransport(recorder))
    client.call("GET", "/tenants")
    (request,) = recorder.requests
    parts = verify_sigv4(request, Credentials("AKIAOPERATOR00000001", "operator-secret"))
    assert (parts["key"], parts["region"]) == ("AKIAOPERATOR00000001", "eu-west-1")
    assert request.url.path == "/admin/v1/tenants"  # a URL given with the prefix works too
    assert region_of(URL) == "eu-west-1" and region_of("http://127.0.0.1:8080") is None


def test_token_path_sends_a_bearer_and_the_operator() -> None:
    recorder = Recorder({"tenants": []})
    client = AdminClient("http://127.0.0.1:8080", token="t" * 20, operator="alice",
                         transport=httpx.MockTransport(recorder))  # fmt: skip
    client.call("GET", "/tenants")
    (request,) = recorder.requests
    assert request.headers["authorization"] == "Bearer " + "t" * 20
    assert request.headers["x-hardcap-operator"] == "alice"
    assert "x-amz-date" not in request.headers


def test_an_api_error_is_the_apis_message() -> None:
    error = {"error": {"message": "no route named 'x'", "type": "invalid_request_error",
                       "param": "tenants[a].routes[0]", "code": "invalid_request"}}  # fmt: skip
    client = AdminClient("http://127.0.0.1:8080", token="t" * 20,
                         transport=httpx.MockTransport(Recorder(error, 400)))  # fmt: skip
    with pytest.raises(AdminError) as raised:
        client.call("PATCH", "/tenants/a", {"routes": ["x"]})
    assert str(raised.value) == "400 (tenants[a].routes[0]): no route named 'x'"
    # A function URL refusing the signature answers its own shape.
    forbidden = httpx.MockTransport(Recorder({"Message": "Forbidden"}, 403))
    refused = AdminClient(URL, transport=forbidden, auth=SigV4(CREDENTIALS, "eu-west-1"))
    with pytest.raises(AdminError, match="403: Forbidden"):
        refused.call("GET", "/tenants")


def parse(argv: list[str]) -> argparse.Namespace:
    """The namespace `hardcap` makes of ``argv`` (through the real parser)."""
    captured: dict[str, argparse.Namespace] = {}

    def keep(ns: argparse.Namespace, client: Any = None) -> int:
        captured["ns"] = ns
        return 0

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("hardcap_core.local.admin_command.admin_command", keep)
        assert main(argv) == 0
    return captured["ns"]


@pytest.mark.parametrize(
    ("argv", "method", "path", "body"),
    [
        (["tenants", "create", "gamma", "--org", "acme", "--routes", "small,reason",
          "--budget", "cost_usd:12.5:month", "--rpm", "60", "--set", 'end_users="optional"',
          "--set", 'users={"budgets":[]}'],
         "POST", "/tenants",
         {"id": "gamma", "org": "acme", "routes": ["small", "reason"],
          "budgets": [{"dimension": "cost_usd", "limit": 12.5, "window": "month"}],
          "rate_limits": {"requests_per_minute": 60}, "end_users": "optional",
          "users": {"budgets": []}}),
        (["tenants", "update", "gamma", "--routes", "all", "--unset", "fail_mode"],
         "PATCH", "/tenants/gamma", {"routes": None, "fail_mode": None}),
        (["keys", "create", "--tenant", "gamma", "--id", "gamma-ci", "--priority", "3"],
         "POST", "/keys", {"tenant": "gamma", "id": "gamma-ci", "queue_priority": 3}),
        (["keys", "rotate", "gamma-ci", "--overlap", "2h"],
         "POST", "/keys/gamma-ci/rotate", {"overlap": "2h"}),
        (["budgets", "set", "--level", "tenant", "--id", "gamma", "--dimension", "total_tokens",
          "--window", "day", "--limit", "100000", "--for", "7d", "--reason", "launch"],
         "PUT", "/budgets",
         {"level": "tenant", "id": "gamma", "dimension": "total_tokens", "window": "day",
          "limit": 100000, "for": "7d", "reason": "launch"}),
        (["rate-limits", "set", "--level", "key", "--id", "gamma-ci", "--rpm", "none",
          "--tpm", "5000"],
         "PUT", "/rate-limits",
         {"level": "key", "id": "gamma-ci", "requests_per_minute": None,
          "tokens_per_minute": 5000}),
        (["overrides", "cancel", "ov-1"], "DELETE", "/overrides/ov-1", None),
    ],
)  # fmt: skip
def test_command_lines_become_calls(
    argv: list[str], method: str, path: str, body: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = parse(["admin", *argv, "--json", "--url", "http://127.0.0.1:1", "--token", "t" * 20])
    recorder = Recorder({"version": 1})
    client = AdminClient("http://127.0.0.1:1", token="t" * 20,
                         transport=httpx.MockTransport(recorder))  # fmt: skip
    assert admin_command(ns, client) == 0
    (request,) = recorder.requests
    assert (request.method, request.url.path) == (method, f"/admin/v1{path}")
    assert (json.loads(request.content) if request.content else None) == body
    assert json.loads(capsys.readouterr().out) == {"version": 1}


def test_a_mistake_in_the_command_line_is_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    ns = parse(["admin", "tenants", "create", "gamma", "--budget", "cost_usd:12", "--token", "x"])
    assert admin_command(ns, AdminClient("http://127.0.0.1:1", token="t" * 20)) == 2
    assert "DIMENSION:LIMIT:WINDOW" in capsys.readouterr().err


def test_keys_list_and_new_key_read_well(capsys: pytest.CaptureFixture[str]) -> None:
    listed = {"version": 4, "keys": [
        {"id": "gamma-ci", "tenant": "gamma", "status": "active", "created_at": 1773489600.0,
         "created_by": "local:alice", "expires_at": None, "revoked_at": None,
         "last_used_at": None},
    ]}  # fmt: skip
    ns = parse(["admin", "keys", "list", "--url", "http://127.0.0.1:1", "--token", "t" * 20])
    client = AdminClient("http://127.0.0.1:1", token="t" * 20,
                         transport=httpx.MockTransport(Recorder(listed)))  # fmt: skip
    assert admin_command(ns, client) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["key", "tenant", "status", "created", "expires", "revoked", "last",
                              "used"]  # fmt: skip
    assert out[2].split() == ["gamma-ci", "gamma", "active", "2026-03-14", "12:00:00Z", "-", "-",
                              "-"]  # fmt: skip

    created = {"version": 5, "key": "hc_" + "A" * 43, "id": "gamma-ci", "tenant": "gamma"}
    ns = parse(["admin", "keys", "create", "--tenant", "gamma", "--token", "t" * 20])
    client = AdminClient("http://127.0.0.1:1", token="t" * 20,
                         transport=httpx.MockTransport(Recorder(created)))  # fmt: skip
    assert admin_command(ns, client) == 0
    text = capsys.readouterr().out
    assert "shown once" in text and f"\n  {created['key']}\n" in text
