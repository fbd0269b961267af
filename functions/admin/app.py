"""The admin function: the admin API (``/admin/v1``) behind its own function URL, AuthType
AWS_IAM (template: AdminFunction).

Lambda checks the caller's SigV4 signature before this code runs, so a request that gets here
was signed by an IAM principal allowed ``lambda:InvokeFunctionUrl`` on this function; its ARN
is in the event and is who the audit names. An event without one (a URL someone switched to
AuthType NONE) is refused with 403 before the app sees it. Tenant keys are never checked here:
this function has no route a tenant key opens.

Everything is built once per execution environment, at import (Powertools style): the service
from HARDCAP_CONFIG, HARDCAP_CONFIG_TABLE, HARDCAP_USAGE_TABLE and the cache settings
(hardcap_core/control/admin_api.py: admin_from_env). The cache client is connected by the first
change that publishes, on this module's loop, and reused.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from mangum import Mangum
from mangum.types import LambdaContext, LambdaEvent
from starlette.applications import Starlette

from hardcap_core.control.admin_api import (
    admin_from_env,
    admin_routes,
    iam_principal,
    lambda_authenticator,
)
from hardcap_core.logs import logger

# Mangum runs each invocation on the thread's current event loop: made once, it keeps the cache
# client bound to it alive across invocations.
_loop = asyncio.new_event_loop()
asyncio.set_event_loop(_loop)
_admin = admin_from_env()
_asgi = Mangum(Starlette(routes=admin_routes(_admin, lambda_authenticator)), lifespan="off")

FORBIDDEN = {
    "statusCode": 403,
    "headers": {"content-type": "application/json"},
    "body": json.dumps(
        {
            "error": {
                "message": "The admin API takes only requests signed by an IAM principal "
                "(the function URL's AuthType must be AWS_IAM).",
                "type": "permission_error",
                "param": None,
                "code": "iam_required",
            }
        }
    ),
    "isBase64Encoded": False,
}


def close() -> None:
    """Close the cache client and the loop (Lambda never needs it; a local caller does)."""
    _loop.run_until_complete(_admin.aclose())
    _loop.close()


def handler(event: LambdaEvent, context: LambdaContext) -> dict[str, Any]:
    """Serve one admin call; 403 unless the event names the IAM principal that signed it."""
    if iam_principal(event) is None:
        logger.warning("admin call without an IAM principal refused")
        return dict(FORBIDDEN)
    return _asgi(event, context)
