"""The wheel carries the Lua scripts and the demo config, and an installed copy finds and runs
them without the repo (the scripts against a server, ``hardcap demo`` end to end).

Builds the wheel with pip (build isolation fetches hatchling from the package index), unpacks
it, and imports ``hardcap_core`` from there in a subprocess that cannot see the repository.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hardcap_core.ledger.scripts import LEDGER_SCRIPTS, STANDALONE_SCRIPTS
from hardcap_core.local.valkey import LocalValkey, free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = ("lib", *LEDGER_SCRIPTS, *STANDALONE_SCRIPTS)

# Runs in the subprocess: argv[1] is the server URL. Prints one JSON line.
PROBE = """
import asyncio, json, sys
import redis.asyncio as aioredis
import hardcap_core
from hardcap_core.budgets import Budget, Dimension, Level, LevelKind, Scope, Window
from hardcap_core.ledger import Admitted, Ledger
from hardcap_core.ledger.scripts import lua_dir, source

async def admit(url):
    client = aioredis.Redis.from_url(url)
    tenant = Level(LevelKind.TENANT, "packaged")
    scope = Scope((tenant,), (Budget(tenant, Dimension.TOTAL_TOKENS, 100, Window("day")),))
    try:
        ledger = Ledger(client, prefix="hc-packaging-test")
        r = await ledger.admit(scope, input_tokens=10, output_estimate=20)
        assert isinstance(r, Admitted), r
        await ledger.settle(r.reservation, input_tokens=10, output_tokens=5)
        return (await ledger.usage(scope)).rows[0].used
    finally:
        await client.aclose()

print(json.dumps({
    "package": hardcap_core.__file__,
    "lua_dir": str(lua_dir()),
    "admit_source": source("admit"),
    "sys_path": sys.path,
    "used": asyncio.run(admit(sys.argv[1])),
}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(REPO)],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("hardcap-*.whl")
    return built


@pytest.mark.slow
def test_wheel_contains_every_script(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for name in SCRIPTS:
            packed = f"hardcap_core/lua/{name}.lua"
            assert packed in names
            assert z.read(packed) == (REPO / "lua" / f"{name}.lua").read_bytes()
        demo = "hardcap_core/local/demo.yaml"
        assert z.read(demo) == (REPO / demo).read_bytes()


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The unpacked wheel and an environment whose Python sees it and the dependencies only."""
    site = tmp_path_factory.mktemp("installed") / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    # Dependencies from this interpreter's path, but neither the repo nor an editable install
    # of it: -S skips .pth files, -P the script directory, cwd is not the repo.
    # Dependencies stay importable (a venv may live inside the checkout, as .venv does in CI);
    # the source tree itself, and the editable install's path hook to it, must not.
    deps = [
        p
        for p in sys.path
        if p and (not Path(p).resolve().is_relative_to(REPO) or "site-packages" in Path(p).parts)
    ]
    return site, {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *deps])}


@pytest.mark.slow
def test_installed_wheel_finds_and_runs_its_scripts(
    installed: tuple[Path, dict[str, str]], valkey: LocalValkey
) -> None:
    site, env = installed
    done = subprocess.run(
        [sys.executable, "-S", "-P", "-c", PROBE, valkey.url],
        cwd=site.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)

    assert Path(got["package"]).is_relative_to(site)
    assert Path(got["lua_dir"]) == site / "hardcap_core" / "lua"
    assert str(REPO) not in got["sys_path"]
    lib = (REPO / "lua" / "lib.lua").read_text(encoding="utf-8")
    admit = (REPO / "lua" / "admit.lua").read_text(encoding="utf-8")
    assert lib in got["admit_source"] and admit in got["admit_source"]
    assert got["used"] == 15


@pytest.mark.slow
def test_demo_runs_from_the_installed_wheel(installed: tuple[Path, dict[str, str]]) -> None:
    """`hardcap demo` with no arguments but ports: its config ships inside the package."""
    site, env = installed
    ports = ["--port", str(free_port()), "--mock-port", str(free_port())]
    done = subprocess.run(
        [sys.executable, "-S", "-P", "-m", "hardcap_core.cli", "demo", "--once", *ports],
        cwd=site.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    config = next(line for line in done.stdout.splitlines() if line.startswith("Config"))
    assert Path(config.split()[-1]) == site / "hardcap_core" / "local" / "demo.yaml"
    assert "[finish_reason: " in done.stdout
    assert "[usage: " in done.stdout  # the stream's usage chunk
    assert "[DONE]" in done.stdout
    assert '"object": "hardcap.usage"' in done.stdout
    assert '"tenant": "alpha"' in done.stdout
