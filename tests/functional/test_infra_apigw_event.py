"""A REST API proxy event, as API Gateway sends it to the default front door, through the
buffered (Mangum) handler: the app answers the path without the stage (``path``, not
``requestContext.path``), as the Web Adapter forwards it.

The streaming handler (the adapter) is not runnable here; this checks the event's shape and the
app's routes, not the streaming.
"""

from __future__ import annotations

import json

from tests.functional.test_infra_template import load_template
from tests.functional.test_lambda_events import (  # noqa: F401 - fixtures
    Invoke,
    body_of,
    handler_module,
    invoke,
    load_event,
    mock,
    sse_payloads,
)


def test_the_sample_event_is_the_templates_api() -> None:
    event = load_event("apigw-rest-chat-stream")
    resources = load_template()["Resources"]
    assert event["resource"] == "/" + resources["GatewayApiProxyResource"]["Properties"]["PathPart"]
    assert (
        event["requestContext"]["stage"] == resources["GatewayApiStage"]["Properties"]["StageName"]
    )
    assert event["requestContext"]["path"] == f"/{event['requestContext']['stage']}{event['path']}"


def test_a_streamed_completion_through_the_rest_api_event(invoke: Invoke) -> None:  # noqa: F811
    response = invoke(load_event("apigw-rest-chat-stream"))
    assert response["statusCode"] == 200, body_of(response)
    payloads = sse_payloads(body_of(response))
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")
    )
