"""The Vercel AI SDK (`ai` with `@ai-sdk/openai` and `@ai-sdk/anthropic`, pinned in
package.json) through the gateway: `openai('m')` (the Responses API), `openai.chat('m')` and
`anthropic('claude')`, each with `generateText` and `streamText` and the provider's defaults
(only the base URL and the key set), run by ai_sdk.mjs.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.clients.conftest import Stack, installed
from tests.clients.stack import HERE, key_of, outcomes, run

pytestmark = [pytest.mark.slow, pytest.mark.clients, pytest.mark.xdist_group("clients")]

KINDS = ("responses", "chat", "anthropic")
MODES = ("generate", "stream")
# The SDK's default maxRetries: it retries a 429 though the gateway says x-should-retry: false.
ATTEMPTS = 3


def ai_sdk(stack: Stack, home: Path, kind: str, mode: str, tenant: str, prompt: str) -> Any:
    installed(HERE / "node_modules" / "ai")
    node = shutil.which("node")
    assert node, "node is not on PATH"
    env = {"HOME": str(home), "HARDCAP_BASE_URL": stack.url, "HARDCAP_KEY": key_of(tenant)}
    done = run([node, str(HERE / "ai_sdk.mjs"), kind, mode, prompt], env, cwd=HERE, timeout_s=60)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done
    return done, json.loads(lines[-1])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_turn_answers(client_stack: Stack, home: Path, kind: str, mode: str) -> None:
    before = len(outcomes(client_stack.log, "normal"))
    done, got = ai_sdk(client_stack, home, kind, mode, "normal", "say hi [mock:tokens=12]")
    assert done.returncode == 0 and got["text"].strip() and got["finishReason"] == "stop", done
    assert outcomes(client_stack.log, "normal")[before:] == ["completed"], done


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_turn_cut_at_the_budget(client_stack: Stack, home: Path, kind: str, mode: str) -> None:
    tenant = client_stack.cut_tenant()
    prompt = "write a story [mock:tokens=400] [mock:pace_ms=2]"
    done, got = ai_sdk(client_stack, home, kind, mode, tenant, prompt)
    # finish reason "length" and the partial text, as for a reply cut at max_tokens.
    assert done.returncode == 0 and got["text"].strip() and got["finishReason"] == "length", done
    assert got["usage"]["outputTokens"] <= 60, done
    # A whole reply was asked upstream with the cap the budget allows: it completes at it.
    ended = "truncated" if mode == "stream" else "completed"
    assert outcomes(client_stack.log, tenant) == [ended], done


@pytest.mark.parametrize("kind", KINDS)
def test_a_spent_budget_is_a_clear_error_after_the_sdks_retries(
    client_stack: Stack, home: Path, kind: str
) -> None:
    before = len(outcomes(client_stack.log, "spent"))
    started = time.monotonic()
    done, got = ai_sdk(client_stack, home, kind, "generate", "spent", "say hi")
    took = time.monotonic() - started
    assert done.returncode == 1 and got["status"] == 429, done
    assert "total_tokens budget of tenant spent" in got["error"], done
    assert got["attempts"] == ATTEMPTS, done
    assert outcomes(client_stack.log, "spent")[before:] == ["429"] * ATTEMPTS, done
    assert took < 30, took  # its backoff: 2 s, then 4 s
