"""The README's commands, as written, so the front door cannot drift from the code.

Each code block's command that runs offline is taken from README.md itself: `make run` (the
Makefile recipe it runs, on free ports, then the SDK snippet printed under it, run against that
gateway), and the deploy block's `hardcap config apply` / `hardcap admin keys create` against a
local `hardcap serve` holding the example config (`<AdminUrl>` is the only word replaced). The
deploy block's `sam build` is tests/functional/test_readme_deploy.py; `make test` is what runs
this file.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hardcap_core.local.stack import Service, start_gateway, wait_http
from hardcap_core.local.valkey import LocalValkey, free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
TOKEN = "readme-admin-token-0123456789"


def blocks(language: str) -> list[str]:
    """Every fenced code block of the README in ``language``."""
    return re.findall(rf"```{language}\n(.*?)```", README, re.DOTALL)


def commands(block: str) -> list[str]:
    """A bash block's command lines, comments and continuation comments dropped."""
    lines = (line.split("#", 1)[0].strip() for line in block.splitlines())
    return [line for line in lines if line]


def make_recipe(target: str) -> list[str]:
    """What `make <target>` runs once its venv exists (make -n, the stamp already made)."""
    venv = Path(sys.executable).parent.parent
    # -o: the venv's install stamp counts as made, whatever pyproject.toml's time says.
    out = subprocess.run(
        ["make", "-n", "-s", target, f"VENV={venv}", "-o", f"{venv}/bin/.installed"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [line for line in out.splitlines() if line.strip()]


def console_script(name: str) -> list[str]:
    """The command running ``name``'s entry point as pyproject.toml declares it, on this
    interpreter: the code of this checkout, whatever script an install once wrote into the venv
    (an editable install of another checkout, or one made before the entry point moved)."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts[name].partition(":")
    code = (
        f"import sys; from {module} import {function} as entry; "
        f"sys.argv[0] = {name!r}; sys.exit(entry())"
    )
    return [sys.executable, "-c", code]


def test_the_two_commands_are_the_ones_the_readme_shows() -> None:
    two = commands(blocks("bash")[0])
    assert two == ["make run", "make test"], two


def test_make_run_serves_the_readme_snippet(tmp_path: Path) -> None:
    (run,) = make_recipe("run")
    argv = shlex.split(run)
    assert Path(argv[0]).name == "hardcap" and argv[1:] == ["demo"], f"make run runs {run!r}"
    port, mock_port = free_port(), free_port()
    log = tmp_path / "demo.log"
    ports = ["--port", str(port), "--mock-port", str(mock_port)]
    with log.open("wb") as out:
        demo = subprocess.Popen(
            [*console_script("hardcap"), *argv[1:], *ports],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", demo, timeout_s=90)
        snippet = next(b for b in blocks("python") if "127.0.0.1:8080" in b)
        code = snippet.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        assert len(result.stdout.split()) >= 5, f"the stream printed {result.stdout!r}"
    finally:
        demo.terminate()
        demo.wait(30)


@pytest.fixture
def example_stack(
    valkey: LocalValkey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Service, Path]]:
    """`hardcap serve` with the README's deploy config (examples/config.yaml copied to
    infra/config.yaml in a folder of its own) and its admin API."""
    for name in ("HARDCAP_USAGE_TABLE", "HARDCAP_CONFIG_TABLE", "AWS_ENDPOINT_URL_DYNAMODB",
                 "AWS_ENDPOINT_URL", "HARDCAP_ADMIN_URL"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    work = tmp_path / "checkout"
    (work / "infra").mkdir(parents=True)
    config = work / "infra" / "config.yaml"
    config.write_bytes((ROOT / "examples" / "config.yaml").read_bytes())
    env = {"HARDCAP_REDIS_URL": valkey.url, "HARDCAP_REDIS_CLUSTER": "false",
           "POWERTOOLS_LOG_LEVEL": "WARNING"}  # fmt: skip
    service = start_gateway(config, tmp_path, env=env, options=["--admin-token", TOKEN])
    yield service, work
    service.stop()


def test_the_deploy_blocks_admin_commands_run_against_a_local_stack(
    example_stack: tuple[Service, Path],
) -> None:
    service, work = example_stack
    deploy = next(b for b in blocks("bash") if "sam build" in b)
    hardcap = [c for c in commands(deploy) if c.startswith("hardcap ")]
    assert [c.split()[1] for c in hardcap] == ["config", "admin"], hardcap
    env = {**os.environ, "HARDCAP_ADMIN_TOKEN": TOKEN}
    outputs = []
    for line in hardcap:
        argv = shlex.split(line.replace("<AdminUrl>", service.url))
        result = subprocess.run(
            [*console_script("hardcap"), *argv[1:]],
            cwd=work, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, f"{line}: {result.stdout}{result.stderr}"
        outputs.append(result.stdout)
    applied, created = outputs
    # The gateway already serves the file it was deployed with: nothing to write, or written.
    assert "Applied" in applied or applied.strip() == "No changes.", applied
    assert "shown once" in created, created
    key = re.search(r"^\s+(hc_[A-Za-z0-9_\-]{43})$", created, re.MULTILINE)
    assert key, created
    # The key works on that gateway at once: the README's next step is calling it.
    models = httpx.get(
        f"{service.url}/v1/models", headers={"authorization": f"Bearer {key.group(1)}"}
    )
    assert models.status_code == 200, models.text
