"""The ElastiCache IAM token: the hand-rolled SigV4 presign equals botocore's, byte for byte."""

from __future__ import annotations

import datetime
from unittest import mock
from urllib.parse import parse_qs, urlsplit

import pytest
from botocore.auth import SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.hooks import HierarchicalEmitter
from botocore.model import ServiceId
from botocore.signers import RequestSigner

from hardcap_core.ledger import iam_auth
from hardcap_core.ledger.iam_auth import AwsCredentials, IamCredentialProvider, auth_token

NOW = datetime.datetime(2026, 12, 1, 14, 30, 5)
KEY_ID = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
# Session tokens carry '+', '/' and '=': they must be percent-encoded like botocore does.
SESSION = "IQoJb3JpZ2luX2VjEHYaCXVzLWVhc3QtMSJH+ab/cd=="


def botocore_query_auth(
    cache: str, user: str, region: str, token: str | None, serverless: bool
) -> str:
    query = f"Action=connect&User={user}" + ("&ResourceType=ServerlessCache" if serverless else "")
    request = AWSRequest(method="GET", url=f"http://{cache}/?{query}")
    with mock.patch("botocore.auth.get_current_datetime", return_value=NOW):
        SigV4QueryAuth(Credentials(KEY_ID, SECRET, token), "elasticache", region, 900).add_auth(
            request
        )
    return str(request.url).removeprefix("http://")


def botocore_request_signer(cache: str, user: str, region: str, token: str | None) -> str:
    """The route AWS's and redis-py's Python examples take: RequestSigner.generate_presigned_url."""
    emitter = HierarchicalEmitter()  # RequestSigner keeps only a weak reference to it
    signer = RequestSigner(
        ServiceId("elasticache"),
        region,
        "elasticache",
        "v4",
        Credentials(KEY_ID, SECRET, token),
        emitter,
    )
    query = f"Action=connect&User={user}&ResourceType=ServerlessCache"
    request = {
        "method": "GET",
        "url": f"http://{cache}/?{query}",
        "body": {},
        "headers": {},
        "context": {},
    }
    with mock.patch("botocore.auth.get_current_datetime", return_value=NOW):
        url = signer.generate_presigned_url(
            request, region_name=region, expires_in=900, operation_name="connect"
        )
    return str(url).removeprefix("http://")


@pytest.mark.parametrize("token", [SESSION, None], ids=["session", "no-session"])
@pytest.mark.parametrize("serverless", [True, False], ids=["serverless", "node-based"])
@pytest.mark.parametrize("region", ["us-east-1", "eu-central-2"])
def test_token_equals_botocore_sigv4_query_auth(
    token: str | None, serverless: bool, region: str
) -> None:
    ours = auth_token(
        "hardcap-1a2b3c4d",
        "hardcap-gateway",
        region=region,
        credentials=AwsCredentials(KEY_ID, SECRET, token),
        serverless=serverless,
        now=NOW,
    )
    assert ours == botocore_query_auth(
        "hardcap-1a2b3c4d", "hardcap-gateway", region, token, serverless
    )


@pytest.mark.parametrize("token", [SESSION, None], ids=["session", "no-session"])
def test_token_equals_botocore_request_signer(token: str | None) -> None:
    ours = auth_token(
        "hardcap-1a2b3c4d",
        "hardcap-gateway",
        region="us-west-2",
        credentials=AwsCredentials(KEY_ID, SECRET, token),
        now=NOW,
    )
    assert ours == botocore_request_signer(
        "hardcap-1a2b3c4d", "hardcap-gateway", "us-west-2", token
    )


def test_token_matches_an_aws_sdk_for_java_v2_vector() -> None:
    """A third implementation: a public project's test of its AWS SDK for Java v2 signer
    (IamAuthTokenRequestTest, package fi.okm.jod.yksilo.config.elasticache) fixes this
    signature for these inputs."""
    token = auth_token(
        "my-cache",
        "user123",
        region="eu-west-1",
        credentials=AwsCredentials("accessKey", "secretKey"),
        now=datetime.datetime(2024, 8, 2, 12, 11, 50),
    )
    assert token.startswith("my-cache/?Action=connect&User=user123&ResourceType=ServerlessCache")
    assert token.endswith(
        "X-Amz-Signature=5dda5db919b1337db6596b2a608924bc10197fb39289b933b60bdb114d5a70dc"
    )


def test_token_shape() -> None:
    token = auth_token(
        "Hardcap-ABC",  # ElastiCache lower-cases names at creation; the lower-case one is signed
        "hardcap-gateway",
        region="us-east-1",
        credentials=AwsCredentials(KEY_ID, SECRET, SESSION),
        now=NOW,
    )
    assert not token.startswith(("http://", "https://"))
    parts = urlsplit(f"http://{token}")
    assert parts.netloc == "hardcap-abc" and parts.path == "/"
    query = parse_qs(parts.query)
    assert query["Action"] == ["connect"]
    assert query["User"] == ["hardcap-gateway"]
    assert query["ResourceType"] == ["ServerlessCache"]
    assert query["X-Amz-Expires"] == ["900"]
    assert query["X-Amz-Credential"] == [f"{KEY_ID}/20261201/us-east-1/elasticache/aws4_request"]
    assert query["X-Amz-Security-Token"] == [SESSION]


def test_provider_signs_once_per_reuse_window() -> None:
    now = [1_796_000_000.0]
    env = {
        "AWS_ACCESS_KEY_ID": KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": SESSION,
    }
    provider = IamCredentialProvider(
        "hardcap-1", "hardcap-gateway", region="us-east-1", environ=env, clock=lambda: now[0]
    )
    user, first = provider.get_credentials()
    assert user == "hardcap-gateway"
    now[0] += iam_auth.TOKEN_REUSE_S - 1
    assert provider.get_credentials()[1] == first
    assert provider.signatures == 1
    now[0] += 1
    second = provider.get_credentials()[1]
    assert second != first and provider.signatures == 2
    # The token is the one auth_token signs at the provider's clock.
    expected = auth_token(
        "hardcap-1",
        "hardcap-gateway",
        region="us-east-1",
        credentials=AwsCredentials(KEY_ID, SECRET, SESSION),
        now=datetime.datetime.fromtimestamp(now[0], datetime.UTC).replace(tzinfo=None),
    )
    assert second == expected
    assert iam_auth.TOKEN_REUSE_S < iam_auth.TOKEN_EXPIRY_S == 900


def test_provider_from_env() -> None:
    assert iam_auth.provider_from_env({}) is None
    assert iam_auth.provider_from_env({iam_auth.IAM_USER: ""}) is None
    with pytest.raises(RuntimeError, match=iam_auth.IAM_CACHE_NAME):
        iam_auth.provider_from_env({iam_auth.IAM_USER: "u", "AWS_REGION": "us-east-1"})
    provider = iam_auth.provider_from_env(
        {
            iam_auth.IAM_USER: "u",
            iam_auth.IAM_CACHE_NAME: "c",
            iam_auth.IAM_SERVERLESS: "false",
            "AWS_REGION": "eu-west-1",
        }
    )
    assert provider is not None
    assert (provider.user_id, provider.cache_name, provider.region) == ("u", "c", "eu-west-1")
    assert provider.serverless is False
    with pytest.raises(RuntimeError, match="AWS_ACCESS_KEY_ID"):
        provider.get_credentials()


def test_connection_max_age_is_under_elasticaches_12_hours() -> None:
    assert iam_auth.CONNECTION_MAX_AGE_S < 12 * 3600
