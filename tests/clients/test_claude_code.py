"""Claude Code (`claude -p`, pinned in package.json) through the gateway with its defaults:
only ANTHROPIC_BASE_URL and the key point it at Hardcap; its default model names are routes.

Claude Code 2.1.328 sends `/v1/messages?beta=true` with `context_management`, `output_config`,
eight betas, system messages between the turns and `max_tokens` 128,000 (the routes allow it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.clients.conftest import Stack, node_tool
from tests.clients.stack import Run, key_of, outcomes, run

pytestmark = [pytest.mark.slow, pytest.mark.clients, pytest.mark.xdist_group("clients")]


def claude(stack: Stack, home: Path, tenant: str, prompt: str, *options: str) -> Run:
    env = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": stack.url,
        "ANTHROPIC_API_KEY": key_of(tenant),
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return run([str(node_tool("claude")), "-p", prompt, *options], env, cwd=home, timeout_s=120)


def events(done: Run) -> list[dict[str, Any]]:
    """The lines of `--output-format stream-json`."""
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_a_turn_answers(client_stack: Stack, home: Path) -> None:
    done = claude(client_stack, home, "normal", "say hi [mock:tokens=12]")
    assert done.returncode == 0 and done.stdout.strip(), done
    assert outcomes(client_stack.log, "normal")[-1:] == ["completed"]


def test_a_tool_round_trip(client_stack: Stack, home: Path) -> None:
    before = len(outcomes(client_stack.log, "normal"))
    done = claude(
        client_stack, home, "normal", "use a tool [mock:tool_use=1] [mock:tokens=20]",
        "--output-format", "stream-json", "--verbose",
    )  # fmt: skip
    assert done.returncode == 0, done
    seen = events(done)
    blocks = [
        block["type"]
        for e in seen
        if e["type"] in ("assistant", "user")
        for block in e["message"]["content"]
    ]
    # The mock calls Claude Code's first tool with made-up input: the tool result is the
    # validation error, sent back, and the model's next turn is text.
    assert blocks[:3] == ["tool_use", "tool_result", "text"], done
    assert seen[-1]["type"] == "result" and seen[-1]["subtype"] == "success", done
    assert outcomes(client_stack.log, "normal")[before:] == ["completed", "completed"]


def test_a_turn_cut_at_the_budget(client_stack: Stack, home: Path) -> None:
    tenant = client_stack.cut_tenant()
    done = claude(
        client_stack, home, tenant, "write a story [mock:tokens=400] [mock:pace_ms=2]",
        "--output-format", "stream-json", "--verbose",
    )  # fmt: skip
    seen = events(done)
    text = [
        block["text"]
        for e in seen
        if e["type"] == "assistant"
        for block in e["message"]["content"]
        if block["type"] == "text"
    ]
    # Cut at 60 output tokens (stop_reason max_tokens), Claude Code shows the partial text and
    # asks once more to go on; the budget is spent, so that one is refused, and it stops.
    assert text and text[0].strip(), done
    assert outcomes(client_stack.log, tenant) == ["truncated", "429"], done
    assert "budget of tenant" in done.stdout + done.stderr, done


def test_a_spent_budget_refuses_once_with_a_clear_error(client_stack: Stack, home: Path) -> None:
    before = len(outcomes(client_stack.log, "spent"))
    done = claude(client_stack, home, "spent", "say hi")
    assert done.returncode == 1, done
    assert "429" in done.stdout and "total_tokens budget of tenant spent" in done.stdout, done
    # x-should-retry: false: no retry at all.
    assert outcomes(client_stack.log, "spent")[before:] == ["429"], done
