"""The buffered gateway handler: the same ASGI app as ``run.sh``, wrapped by Mangum.

For BUFFERED function URLs, API Gateway (REST or HTTP API) and ALB, which cannot stream: the
whole response is produced, then returned. Handler: ``buffered.handler``. The event-driven tests
call it with the function URL events in ``events/``.

Everything is built once per execution environment, at import (the init phase), and reused by
every invocation: the app, its config, its cache and HTTP clients. Under SnapStart the runtime's
hooks (``snapshot_restore_py``, shipped with the Python managed runtimes) close the cache client
before the snapshot and, after a restore, reseed ``random`` and build it again.
"""

from __future__ import annotations

import asyncio
import json
import platform
import time
from pathlib import Path
from typing import Any

from mangum import Mangum
from mangum.types import LambdaContext, LambdaEvent

# The header the Lambda Web Adapter adds on the streaming path; the app reads the deadline from
# it, so this path supplies the same header instead of the app knowing two ways.
LAMBDA_CONTEXT_HEADER = "x-amzn-lambda-context"


def _check_architecture() -> None:
    """Refuse an artifact built for another CPU (see infra/Makefile, LAMBDA_ARCH)."""
    marker = Path(__file__).with_name(".lambda-arch")
    built_for = marker.read_text().strip() if marker.is_file() else None
    if built_for is not None and built_for != platform.machine():
        raise RuntimeError(
            f"artifact built for {built_for} but running on {platform.machine()}: rebuild with "
            "LAMBDA_ARCH matching the Architecture parameter"
        )


_check_architecture()

# Imported after the check: on the wrong architecture this import fails with an opaque error.
from hardcap_core.gateway.app import app_from_env  # noqa: E402

# Mangum runs each invocation on the thread's current event loop. Creating it here, once, keeps
# the loop, and the cache and HTTP clients bound to it, alive across invocations, and avoids
# asyncio.get_event_loop()'s deprecated implicit creation.
_loop = asyncio.new_event_loop()
asyncio.set_event_loop(_loop)
_app = app_from_env()
_asgi = Mangum(_app, lifespan="off")
# Mangum runs no lifespan: the clients are built here, in the init phase (and so in a snapshot).
_loop.run_until_complete(_app.state.runtime.warm())


def _register_snapstart_hooks() -> None:
    """Tie the runtime's snapshot hooks to the app's; absent outside Lambda's managed runtime."""
    try:
        from snapshot_restore_py import (  # type: ignore[import-not-found]
            register_after_restore,
            register_before_snapshot,
        )
    except ImportError:
        return
    runtime = _app.state.runtime
    register_before_snapshot(lambda: _loop.run_until_complete(runtime.before_snapshot()))
    register_after_restore(lambda: _loop.run_until_complete(runtime.after_restore()))


_register_snapstart_hooks()


def handler(event: LambdaEvent, context: LambdaContext) -> dict[str, Any]:
    """Serve one buffered invocation, telling the app its deadline as the adapter would."""
    _stamp_deadline(event, context)
    return _asgi(event, context)


def _stamp_deadline(event: LambdaEvent, context: LambdaContext) -> None:
    """Set the ``x-amzn-lambda-context`` header from the invocation's context.

    Any value the client sent is replaced: a client must not choose the deadline the gateway
    settles by.
    """
    deadline_ms = int(time.time() * 1000) + context.get_remaining_time_in_millis()
    value = json.dumps(
        {
            "request_id": context.aws_request_id,
            "deadline": deadline_ms,
            "invoked_function_arn": context.invoked_function_arn,
        },
        separators=(",", ":"),
    )
    headers = event.get("headers")
    if isinstance(headers, dict):
        for name in [n for n in headers if n.lower() == LAMBDA_CONTEXT_HEADER]:
            del headers[name]
        headers[LAMBDA_CONTEXT_HEADER] = value
    else:
        event["headers"] = {LAMBDA_CONTEXT_HEADER: value}
    # API Gateway REST and ALB events may carry headers here too; Mangum prefers this map.
    multi = event.get("multiValueHeaders")
    if isinstance(multi, dict):
        for name in [n for n in multi if n.lower() == LAMBDA_CONTEXT_HEADER]:
            del multi[name]
        multi[LAMBDA_CONTEXT_HEADER] = [value]
