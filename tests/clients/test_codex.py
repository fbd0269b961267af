"""Codex CLI (`codex exec`, pinned in package.json) through the gateway's `/v1/responses`: a
custom model provider in a CODEX_HOME of its own names the gateway and the key's variable.

Two defaults are turned off, because the gateway refuses what they send (a finding, not a
config slip): the hosted `web_search` tool (billed per call by OpenAI, which the gateway does
not price) and the sub-agent tools (a `namespace` tool, which the translation onto chat
completions has no place for).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clients.conftest import Stack, node_tool
from tests.clients.stack import Run, key_of, outcomes, run

pytestmark = [pytest.mark.slow, pytest.mark.clients, pytest.mark.xdist_group("clients")]

CONFIG = """\
model = "m"
model_provider = "hardcap"
web_search = "disabled"

[agents]
enabled = false

[model_providers.hardcap]
name = "Hardcap"
base_url = "{url}/v1"
env_key = "HARDCAP_KEY"
wire_api = "responses"
"""


def codex(stack: Stack, home: Path, tenant: str, prompt: str) -> Run:
    codex_home = home / "codex"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(CONFIG.format(url=stack.url))
    work = home / "work"
    work.mkdir(exist_ok=True)
    env = {"HOME": str(home), "CODEX_HOME": str(codex_home), "HARDCAP_KEY": key_of(tenant)}
    argv = [str(node_tool("codex")), "exec", "--skip-git-repo-check", "-C", str(work), prompt]
    return run(argv, env, cwd=work, timeout_s=120, stdin="")


def test_a_turn_answers(client_stack: Stack, home: Path) -> None:
    before = len(outcomes(client_stack.log, "normal"))
    done = codex(client_stack, home, "normal", "say hi [mock:tokens=12]")
    assert done.returncode == 0 and done.stdout.strip(), done
    assert outcomes(client_stack.log, "normal")[before:] == ["completed"], done


def test_a_turn_cut_at_the_budget(client_stack: Stack, home: Path) -> None:
    tenant = client_stack.cut_tenant()
    done = codex(client_stack, home, tenant, "write a story [mock:tokens=400] [mock:pace_ms=2]")
    # response.incomplete: Codex names the reason and exits 1 (it shows no partial text of an
    # incomplete response); one request, no retry.
    assert done.returncode == 1, done
    assert "Incomplete response returned, reason: max_output_tokens" in done.stderr, done
    assert outcomes(client_stack.log, tenant) == ["truncated"], done


def test_a_spent_budget_refuses_once(client_stack: Stack, home: Path) -> None:
    before = len(outcomes(client_stack.log, "spent"))
    done = codex(client_stack, home, "spent", "say hi")
    assert done.returncode == 1, done
    # Codex prints its own words for any 429 ("exceeded retry limit"), not the gateway's
    # message, though it sent the request once: x-should-retry: false is honoured.
    assert "429 Too Many Requests" in done.stderr, done
    assert outcomes(client_stack.log, "spent")[before:] == ["429"], done
