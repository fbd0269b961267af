"""The one boundary where botocore's errors (and urllib3's, under Bedrock's event stream)
become errors a client can act on, the same classes :mod:`.http` gives the OpenAI-compatible
path: 429 stays 429, a provider outage is a 502, a timeout a 504, a bad request a 400, so
fallbacks and breakers see a Bedrock failure as they see any other provider's.
"""

from __future__ import annotations

import json
from typing import Any

from hardcap_core.config import Route
from hardcap_core.errors import GatewayError, InvalidRequest, UpstreamFailed, UpstreamTimeout
from hardcap_core.logs import logger
from hardcap_core.providers.http import status_error

# Bedrock's error codes by the status they mean here. ModelNotReadyException comes as a 429
# that the SDKs retry: it is the model's outage, not this tenant's rate, so 503. Codes not
# listed keep the HTTP status Bedrock sent.
STATUS = {
    "ThrottlingException": 429,
    "ValidationException": 400,
    "ServiceUnavailableException": 503,
    "InternalServerException": 500,
    "ModelNotReadyException": 503,
    "ModelErrorException": 502,
    "ResourceNotFoundException": 502,  # the route's model id is wrong: the operator's to fix
}
TIMEOUT_CODES = frozenset({"ModelTimeoutException"})
# Denied by IAM or by the model's access settings: the operator's to fix, and said so.
ACCESS_CODES = frozenset(
    {"AccessDeniedException", "UnrecognizedClientException", "ExpiredTokenException"}
)


def call_error(route: Route, e: Any) -> GatewayError:
    """The error for a Converse / ConverseStream call that failed before any output."""
    from botocore import exceptions as bx

    name = route.name
    if isinstance(e, GatewayError):
        return e
    if isinstance(e, bx.ParamValidationError):
        return InvalidRequest(f"Bedrock refused the request for '{name}': {e}")
    if isinstance(e, bx.ClientError):
        error = e.response.get("Error", {})
        code = str(error.get("Code", ""))
        message = str(error.get("Message", ""))
        if code in TIMEOUT_CODES:
            return UpstreamTimeout(f"The provider for '{name}' did not answer in time ({code}).")
        if code in ACCESS_CODES:
            return UpstreamFailed(
                f"Bedrock denied the gateway access to '{route.model}' ({code}): the "
                "function's role needs bedrock:InvokeModel* on it (BedrockModelArns) and the "
                "account access to the model."
            )
        status = STATUS.get(code) or e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        detail = json.dumps({"error": {"message": f"{code}: {message}"}}).encode()
        return status_error(name, int(status or 502), detail)
    if isinstance(e, bx.ReadTimeoutError | bx.ConnectTimeoutError):
        return UpstreamTimeout(f"The provider for '{name}' did not answer in time.")
    if isinstance(e, bx.NoCredentialsError | bx.NoRegionError | bx.PartialCredentialsError):
        return UpstreamFailed(f"The Bedrock upstream of '{name}' is not set up: {e}")
    if isinstance(e, bx.BotoCoreError):
        logger.warning("bedrock call failed", extra={"route": name, "error": type(e).__name__})
        return UpstreamFailed(f"The provider for '{name}' could not be reached.")
    raise e  # not a failure of the call but a bug: it surfaces as one


def event_error(e: BaseException) -> str | None:
    """What to tell the client for a failure Bedrock reported inside the stream (an exception
    event, or a frame that does not decode), or None if this is no such failure."""
    from botocore import eventstream
    from botocore.exceptions import EventStreamError

    if isinstance(e, EventStreamError):
        error = e.response.get("Error", {})
        return f"The provider failed mid-stream: {error.get('Code')}: {error.get('Message')}"
    if isinstance(e, eventstream.ParserError):
        return "The provider sent a malformed stream event."
    return None


def transport_failure(e: BaseException) -> GatewayError:
    """A failure of the connection while Bedrock was streaming."""
    from botocore.exceptions import ReadTimeoutError as BotoReadTimeout
    from urllib3.exceptions import ReadTimeoutError

    if isinstance(e, GatewayError):
        return e
    if isinstance(e, ReadTimeoutError | BotoReadTimeout | TimeoutError):
        return UpstreamTimeout("The provider stopped sending in time.")
    logger.warning("bedrock stream failed", extra={"error": type(e).__name__})
    return UpstreamFailed("The provider connection failed mid-stream.")
