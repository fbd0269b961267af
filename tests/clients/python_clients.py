"""One turn of a Python client through the gateway, run in a process of its own by the tests:
``python -m tests.clients.python_clients <client> <generate|stream> <prompt>``, with the gateway
in ``HARDCAP_BASE_URL`` and the key in ``HARDCAP_KEY``. Each client gets only its base URL and
key (the environment variables it reads itself where it has them); the rest are its defaults.
Prints one JSON line: the text and how it ended, or the error and its type.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from typing import Any

BASE = os.environ.get("HARDCAP_BASE_URL", "")
KEY = os.environ.get("HARDCAP_KEY", "")


def agents(mode: str, prompt: str) -> dict[str, Any]:
    """The OpenAI Agents SDK, its default model (the Responses API) on the default client,
    which reads OPENAI_BASE_URL and OPENAI_API_KEY."""
    from agents import Agent, Runner
    from agents.models import get_default_model

    agent = Agent(name="helper", instructions="Be brief.")
    if mode == "generate":
        result = Runner.run_sync(agent, prompt)
        return {"text": str(result.final_output), "model": get_default_model()}

    async def streamed() -> dict[str, Any]:
        run = Runner.run_streamed(agent, prompt)
        text = ""
        async for event in run.stream_events():
            if (
                event.type == "raw_response_event"
                and event.data.type == "response.output_text.delta"
            ):
                text += event.data.delta
        return {"text": text, "final": str(run.final_output), "model": get_default_model()}

    return asyncio.run(streamed())


CLIENTS: dict[str, Callable[[str, str], dict[str, Any]]] = {"agents": agents}


def main() -> None:
    client, mode, prompt = sys.argv[1:4]
    try:
        out = CLIENTS[client](mode, prompt)
    except Exception as error:  # the test reads what the client raised
        print(json.dumps({"error": str(error), "type": type(error).__name__}))
        sys.exit(1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
