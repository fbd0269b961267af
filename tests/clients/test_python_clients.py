"""The Python clients (pinned in pyproject.toml's dev extra) through the gateway, each in a
process of its own (tests/clients/python_clients.py) with a HOME of its own: a turn, a turn
cut at the budget, a refused turn, counting the requests the gateway answered."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.clients.conftest import Stack
from tests.clients.stack import HERE, Run, key_of, outcomes, run, tenant_requests

pytestmark = [pytest.mark.slow, pytest.mark.clients, pytest.mark.xdist_group("clients")]

ROOT = HERE.parents[1]
CUT_PROMPT = "write a story [mock:tokens=400] [mock:pace_ms=2]"


def client(stack: Stack, home: Path, name: str, mode: str, tenant: str, prompt: str) -> Any:
    env = {
        "HOME": str(home),
        "PYTHONPATH": str(ROOT),
        "HARDCAP_BASE_URL": stack.url,
        "HARDCAP_KEY": key_of(tenant),
        # What the OpenAI and Anthropic SDKs read themselves.
        "OPENAI_BASE_URL": f"{stack.url}/v1",
        "OPENAI_API_KEY": key_of(tenant),
        "ANTHROPIC_BASE_URL": stack.url,
        "ANTHROPIC_API_KEY": key_of(tenant),
        # The Agents SDK would export traces to OpenAI: nonessential traffic, off.
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
    }
    argv = [sys.executable, "-m", "tests.clients.python_clients", name, mode, prompt]
    done: Run = run(argv, env, cwd=ROOT, timeout_s=60)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done
    return done, json.loads(lines[-1])


@pytest.mark.parametrize("mode", ["generate", "stream"])
def test_agents_sdk_turn(client_stack: Stack, home: Path, mode: str) -> None:
    before = len(outcomes(client_stack.log, "normal"))
    done, got = client(client_stack, home, "agents", mode, "normal", "say hi [mock:tokens=12]")
    assert done.returncode == 0 and got["text"].strip(), done
    assert got["model"] == "gpt-5.6-luna"  # its default model, a route of that name
    assert outcomes(client_stack.log, "normal")[before:] == ["completed"], done


@pytest.mark.parametrize("mode", ["generate", "stream"])
def test_agents_sdk_cut(client_stack: Stack, home: Path, mode: str) -> None:
    tenant = client_stack.cut_tenant()
    done, got = client(client_stack, home, "agents", mode, tenant, CUT_PROMPT)
    # The Agents SDK ends a run on response.incomplete with ModelBehaviorError, naming the
    # reason, as it does with OpenAI's own; it shows no partial text and asks no more.
    assert done.returncode == 1 and got["type"] == "ModelBehaviorError", done
    assert "max_output_tokens" in got["error"], done
    # A whole reply was asked upstream with the cap the budget allows: it completes at it.
    ended = "truncated" if mode == "stream" else "completed"
    assert outcomes(client_stack.log, tenant) == [ended], done


@pytest.mark.parametrize("mode", ["generate", "stream"])
def test_agents_sdk_continues_a_response_by_its_id(
    client_stack: Stack, home: Path, mode: str
) -> None:
    """The second run names the first's response (previous_response_id): the gateway kept it
    for this tenant and sends the whole conversation upstream; both turns complete."""
    before = len(outcomes(client_stack.log, "normal"))
    prompt = "say hi [mock:tokens=12]"
    done, got = client(client_stack, home, "agents-chained", mode, "normal", prompt)
    assert done.returncode == 0 and got["text"].strip(), done
    assert got["first"].startswith("resp_") and got["second"] != got["first"], done
    assert outcomes(client_stack.log, "normal")[before:] == ["completed", "completed"], done
    first, second = tenant_requests(client_stack.log, "normal")[-2:]
    # The second turn's input holds the first's input and its answer's 12 text tokens (its
    # model reasons too: that output is billed once, not sent again).
    assert second["input_tokens"] > first["input_tokens"] + 12, done


def test_agents_sdk_refused(client_stack: Stack, home: Path) -> None:
    before = len(outcomes(client_stack.log, "spent"))
    done, got = client(client_stack, home, "agents", "generate", "spent", "say hi")
    assert done.returncode == 1 and got["type"] == "RateLimitError", done
    assert "total_tokens budget of tenant spent" in got["error"], done
    # The openai SDK underneath honours x-should-retry: false.
    assert outcomes(client_stack.log, "spent")[before:] == ["429"], done


# LangChain's chat models, and the finish they report for a reply cut at its cap.
LANGCHAIN = {"langchain-openai": "length", "langchain-anthropic": "max_tokens"}


@pytest.mark.parametrize("mode", ["generate", "stream"])
@pytest.mark.parametrize("name", sorted(LANGCHAIN))
def test_langchain_turn(client_stack: Stack, home: Path, name: str, mode: str) -> None:
    before = len(outcomes(client_stack.log, "normal"))
    done, got = client(client_stack, home, name, mode, "normal", "say hi [mock:tokens=12]")
    assert done.returncode == 0 and got["text"].strip(), done
    assert got["ended"] in ("stop", "end_turn"), done
    assert outcomes(client_stack.log, "normal")[before:] == ["completed"], done


@pytest.mark.parametrize("mode", ["generate", "stream"])
@pytest.mark.parametrize("name", sorted(LANGCHAIN))
def test_langchain_cut(client_stack: Stack, home: Path, name: str, mode: str) -> None:
    tenant = client_stack.cut_tenant()
    done, got = client(client_stack, home, name, mode, tenant, CUT_PROMPT)
    # The partial text, ended as a reply cut at max_tokens is.
    assert done.returncode == 0 and got["text"].strip(), done
    assert got["ended"] == LANGCHAIN[name], done
    ended = "truncated" if mode == "stream" else "completed"
    assert outcomes(client_stack.log, tenant) == [ended], done


@pytest.mark.parametrize("name", sorted(LANGCHAIN))
def test_langchain_refused(client_stack: Stack, home: Path, name: str) -> None:
    before = len(outcomes(client_stack.log, "spent"))
    done, got = client(client_stack, home, name, "generate", "spent", "say hi")
    assert done.returncode == 1 and got["type"].endswith("RateLimitError"), done
    assert "total_tokens budget of tenant spent" in got["error"], done
    # Both SDKs underneath honour x-should-retry: false.
    assert outcomes(client_stack.log, "spent")[before:] == ["429"], done


# pydantic-ai's agents on `openai:m` (its OpenAI provider speaks the Responses API) and
# `anthropic:claude`; it reports a cut reply's finish as "length" for both.
PYDANTIC_AI = ("pydantic-ai-openai", "pydantic-ai-anthropic")


@pytest.mark.parametrize("mode", ["generate", "stream"])
@pytest.mark.parametrize("name", PYDANTIC_AI)
def test_pydantic_ai_turn_and_cut(client_stack: Stack, home: Path, name: str, mode: str) -> None:
    before = len(outcomes(client_stack.log, "normal"))
    done, got = client(client_stack, home, name, mode, "normal", "say hi [mock:tokens=12]")
    assert done.returncode == 0 and got["text"].strip() and got["ended"] == "stop", done
    assert outcomes(client_stack.log, "normal")[before:] == ["completed"], done
    tenant = client_stack.cut_tenant()
    done, got = client(client_stack, home, name, mode, tenant, CUT_PROMPT)
    assert done.returncode == 0 and got["text"].strip() and got["ended"] == "length", done
    ended = "truncated" if mode == "stream" else "completed"
    assert outcomes(client_stack.log, tenant) == [ended], done


@pytest.mark.parametrize("name", PYDANTIC_AI)
def test_pydantic_ai_refused(client_stack: Stack, home: Path, name: str) -> None:
    before = len(outcomes(client_stack.log, "spent"))
    done, got = client(client_stack, home, name, "generate", "spent", "say hi")
    assert done.returncode == 1 and got["type"] == "ModelRateLimitError", done
    assert "total_tokens budget of tenant spent" in got["error"], done
    assert outcomes(client_stack.log, "spent")[before:] == ["429"], done


def llm(stack: Stack, home: Path, tenant: str, prompt: str, *options: str) -> Run:
    """Simon Willison's `llm` CLI with the gateway as an extra OpenAI-compatible model."""
    user = home / "llm"
    user.mkdir(exist_ok=True)
    (user / "extra-openai-models.yaml").write_text(
        f'- model_id: hardcap-m\n  model_name: m\n  api_base: "{stack.url}/v1"\n'
        "  api_key_name: hardcap\n"
    )
    (user / "keys.json").write_text(json.dumps({"hardcap": key_of(tenant)}))
    argv = [str(Path(sys.executable).parent / "llm"), "-m", "hardcap-m", *options, prompt]
    return run(argv, {"HOME": str(home), "LLM_USER_PATH": str(user)}, cwd=home, timeout_s=60)


@pytest.mark.parametrize("options", [(), ("--no-stream",)], ids=["stream", "whole"])
def test_llm_turn_cut_and_refused(
    client_stack: Stack, home: Path, options: tuple[str, ...]
) -> None:
    before = len(outcomes(client_stack.log, "normal"))
    done = llm(client_stack, home, "normal", "say hi [mock:tokens=12]", *options)
    assert done.returncode == 0 and done.stdout.strip(), done
    assert outcomes(client_stack.log, "normal")[before:] == ["completed"], done
    tenant = client_stack.cut_tenant()
    done = llm(client_stack, home, tenant, CUT_PROMPT, *options)
    # It prints the partial text and exits 0: it does not say the reply was cut.
    assert done.returncode == 0 and done.stdout.strip(), done
    ended = "completed" if options else "truncated"
    assert outcomes(client_stack.log, tenant) == [ended], done
    before = len(outcomes(client_stack.log, "spent"))
    done = llm(client_stack, home, "spent", "say hi", *options)
    assert done.returncode == 1 and "total_tokens budget of tenant spent" in done.stderr, done
    assert outcomes(client_stack.log, "spent")[before:] == ["429"], done
