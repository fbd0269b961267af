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


def agents_chained(mode: str, prompt: str) -> dict[str, Any]:
    """Two turns of the Agents SDK's default model, the second continuing the first by its
    ``previous_response_id`` (sent only when asked: here, the first run's last response id)."""
    from agents import Agent, Runner

    agent = Agent(name="helper", instructions="Be brief.")
    if mode == "generate":
        first = Runner.run_sync(agent, prompt)
        second = Runner.run_sync(
            agent, "And once more. [mock:tokens=6]", previous_response_id=first.last_response_id
        )
        return {"text": str(second.final_output), "first": first.last_response_id,
                "second": second.last_response_id}  # fmt: skip

    async def streamed() -> dict[str, Any]:
        first = Runner.run_streamed(agent, prompt)
        async for _ in first.stream_events():
            pass
        second = Runner.run_streamed(
            agent, "And once more. [mock:tokens=6]", previous_response_id=first.last_response_id
        )
        async for _ in second.stream_events():
            pass
        return {"text": str(second.final_output), "first": first.last_response_id,
                "second": second.last_response_id}  # fmt: skip

    return asyncio.run(streamed())


def _langchain(model: Any, mode: str, prompt: str) -> dict[str, Any]:
    """One turn of a LangChain chat model, ``invoke`` or ``stream``: its text and how it
    ended (``finish_reason`` for OpenAI, ``stop_reason`` for Anthropic)."""
    if mode == "generate":
        message = model.invoke(prompt)
    else:
        message = None
        for chunk in model.stream(prompt):
            message = chunk if message is None else message + chunk
    meta = message.response_metadata
    return {"text": message.text, "ended": meta.get("finish_reason") or meta.get("stop_reason")}


def langchain_openai(mode: str, prompt: str) -> dict[str, Any]:
    from langchain_openai import ChatOpenAI

    return _langchain(ChatOpenAI(model="m", base_url=f"{BASE}/v1", api_key=KEY), mode, prompt)


def langchain_anthropic(mode: str, prompt: str) -> dict[str, Any]:
    from langchain_anthropic import ChatAnthropic

    model = ChatAnthropic(model="claude", base_url=BASE, api_key=KEY)  # type: ignore[call-arg]
    return _langchain(model, mode, prompt)


def _pydantic_ai(name: str, mode: str, prompt: str) -> dict[str, Any]:
    """pydantic-ai's Agent on a model named as its docs do (``openai:m``), whose provider
    reads the base URL and key from the environment."""
    from pydantic_ai import Agent

    agent = Agent(name)
    if mode == "generate":
        result = agent.run_sync(prompt)
        return {"text": result.output, "ended": result.response.finish_reason}

    async def streamed() -> dict[str, Any]:
        text = ""
        async with agent.run_stream(prompt) as run:
            async for delta in run.stream_text(delta=True):
                text += delta
            return {"text": text, "ended": run.response.finish_reason}

    return asyncio.run(streamed())


def pydantic_ai_openai(mode: str, prompt: str) -> dict[str, Any]:
    return _pydantic_ai("openai:m", mode, prompt)


def pydantic_ai_anthropic(mode: str, prompt: str) -> dict[str, Any]:
    return _pydantic_ai("anthropic:claude", mode, prompt)


CLIENTS: dict[str, Callable[[str, str], dict[str, Any]]] = {
    "pydantic-ai-openai": pydantic_ai_openai,
    "pydantic-ai-anthropic": pydantic_ai_anthropic,
    "agents": agents,
    "agents-chained": agents_chained,
    "langchain-openai": langchain_openai,
    "langchain-anthropic": langchain_anthropic,
}


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
