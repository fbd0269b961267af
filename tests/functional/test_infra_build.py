"""`sam build` with the real SAM CLI, offline and without Docker, and what it produces.

The artifact's wheels are for the Lambda platform (cp313, arm64 by default), so this machine's
Python cannot import them. What can be checked here is checked: the files, the pins, the
architecture of every extension module; hardcap_core imported from the artifact with the
test environment's dependencies; and, where a CPython 3.13 is installed, a second build for
x86_64 that boots exactly as Lambda would start it (run.sh -> uvicorn -> GET /healthz).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hardcap_core.local.valkey import LocalValkey, free_port
from tests.functional.test_infra_template import (
    ROOT,
    TEMPLATE,
    dev_only_modules,
    load_template,
    lock_pins,
    sam_cli,
    sam_env,
)

pytestmark = pytest.mark.slow

ARTIFACT = "GatewayFunction"
TEMPLATE_RESOURCES = load_template()["Resources"]
FORBIDDEN = ("tests", "bench", "docs", "events", "infra", "functions", "examples", ".git")


def find_python313() -> str | None:
    """A CPython 3.13, as the Makefile finds one."""
    candidates = ["python3.13", *sorted(Path.home().glob(".pyenv/versions/3.13*/bin/python3.13"))]
    for candidate in candidates:
        try:
            out = subprocess.run(
                [str(candidate), "-c", "import sys; print(sys.version_info[:2] == (3, 13))"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.stdout.strip() == "True":
            return str(candidate)
    return None


def sam_build(
    build_dir: Path,
    arch: str,
    config: str | None = None,
    params: dict[str, str] | None = None,
    only: str | None = None,
) -> Path:
    """Run `sam build` into ``build_dir`` (every function, or ``only`` that one) and return the
    gateway function's artifact folder."""
    env = sam_env(build_dir.parent / "sam-app")
    # make runs pip and the config check with this interpreter: the test environment's.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHON"] = sys.executable
    env["LAMBDA_ARCH"] = arch
    if config is not None:
        env["HARDCAP_DEPLOY_CONFIG"] = config
    command = [sam_cli(), "build", "--template", str(TEMPLATE), "--build-dir", str(build_dir)]
    if only is not None:
        command.insert(2, only)
    overrides = dict(params or {})
    if arch != "arm64":
        overrides["Architecture"] = arch
    if overrides:
        command += ["--parameter-overrides", *(f"{k}={v}" for k, v in overrides.items())]
    started = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    print(f"sam build for {arch}: {time.monotonic() - started:.0f} s")  # shown with -rP or -s
    return build_dir / ARTIFACT


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Named, so a developer's own infra/config.yaml does not change what is tested.
    return sam_build(tmp_path_factory.mktemp("sam") / "build", "arm64", "examples/config.yaml")


def test_artifact_holds_the_function_and_nothing_else(artifact: Path) -> None:
    top = {p.name for p in artifact.iterdir()}
    for name in ("run.sh", "buffered.py", "config.yaml", "hardcap_core", ".lambda-arch"):
        assert name in top
    assert os.access(artifact / "run.sh", os.X_OK)
    assert not top & set(FORBIDDEN), f"not for the artifact: {sorted(top & set(FORBIDDEN))}"
    assert "bin" not in top, "console scripts carry the build machine's interpreter"
    assert not {"boto3", "botocore"} & top, "the Lambda runtime ships boto3"
    shipped = {p.name for p in (artifact / "hardcap_core").iterdir()}
    assert "local" in dev_only_modules()  # the CLI, the mock, the demo, the Valkey launcher
    assert not shipped & dev_only_modules()
    assert not list((artifact / "hardcap_core").rglob("cli.py")), "the CLI is local-only"
    assert (artifact / ".lambda-arch").read_text().strip() == "aarch64"
    assert (artifact / "config.yaml").read_bytes() == (ROOT / "examples/config.yaml").read_bytes()


def test_artifact_carries_every_lua_script(artifact: Path) -> None:
    packaged = artifact / "hardcap_core" / "lua"
    assert (packaged / "admit.lua").is_file()
    expected = {p.name: p.read_bytes() for p in (ROOT / "hardcap_core" / "lua").glob("*.lua")}
    assert {p.name: p.read_bytes() for p in packaged.glob("*.lua")} == expected


def test_artifact_dependencies_are_exactly_the_lock(artifact: Path) -> None:
    installed = {}
    for dist in artifact.glob("*.dist-info"):
        name, _, version = dist.name.removesuffix(".dist-info").partition("-")
        installed[name.replace("_", "-").lower()] = version
    assert installed == lock_pins()


EM_AARCH64 = 183  # ELF e_machine of 64-bit ARM


def _elf_machine(path: Path) -> int:
    """The ELF header's e_machine (little-endian, at byte 18) of a shared object."""
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF", f"{path.name} is not an ELF file"
    return int.from_bytes(head[18:20], "little")


def test_extension_modules_are_for_the_lambda_platform(artifact: Path) -> None:
    modules = [p for p in artifact.rglob("*.so") if ".libs" not in p.parent.name]
    assert modules, "pydantic-core, hiredis and pyyaml ship compiled modules"
    # A module built for CPython 3.13 says so in its name; one for the stable ABI (abi3, such
    # as cryptography's, which PyJWT uses) does not, so its ELF header must say aarch64.
    wrong = [
        p.name
        for p in modules
        if "cpython-313-aarch64-linux-gnu" not in p.name
        and not (p.name.endswith(".abi3.so") and _elf_machine(p) == EM_AARCH64)
    ]
    assert not wrong, f"not cp313/aarch64: {wrong}"
    # Bytecode, when shipped, is only of the runtime's Python: other versions would be dead weight.
    foreign = [p for p in artifact.rglob("*.pyc") if ".cpython-313." not in p.name]
    assert not foreign, f"bytecode of another Python: {foreign[:3]}"


def test_shipped_modules_never_import_dev_only_ones(artifact: Path) -> None:
    """Catches lazy imports too, which an import test would not reach."""
    dev = {f"hardcap_core.{name.removesuffix('.py')}" for name in dev_only_modules()}

    def is_dev(module: str) -> bool:
        return any(module == d or module.startswith(f"{d}.") for d in dev)

    for path in (artifact / "hardcap_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            bad = [n for n in names if is_dev(n)]
            assert not bad, f"{path.name}:{node.lineno} imports a dev-only module: {bad}"


def test_artifact_code_imports(artifact: Path, tmp_path: Path) -> None:
    """hardcap_core and the buffered handler, from the artifact, with this machine's deps."""
    # Only the artifact's own code goes on the path: its wheels are for another platform.
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "hardcap_core").symlink_to(artifact / "hardcap_core")
    shutil.copy(artifact / "buffered.py", shim / "buffered.py")  # without the arch marker
    probe = """
import importlib, json, pkgutil, sys
import hardcap_core, hardcap_core.ledger.scripts as scripts
names = [m.name for m in pkgutil.walk_packages(hardcap_core.__path__, "hardcap_core.")]
for name in names:
    importlib.import_module(name)
sources = {n: len(scripts.source(n)) for n in scripts.LEDGER_SCRIPTS + scripts.STANDALONE_SCRIPTS}
import buffered
print(json.dumps({"core": hardcap_core.__file__, "lua": str(scripts.lua_dir()),
                  "modules": names, "sources": sources, "handler": callable(buffered.handler)}))
"""
    env = {
        **os.environ,
        "PYTHONPATH": str(shim),
        "HARDCAP_CONFIG": str(artifact / "config.yaml"),
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=shim, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    assert Path(found["core"]).resolve().is_relative_to(artifact.resolve())
    assert Path(found["lua"]).resolve() == (artifact / "hardcap_core" / "lua").resolve()
    assert "hardcap_core.gateway.app" in found["modules"]
    assert all(size > 0 for size in found["sources"].values())
    assert found["handler"] is True


@pytest.fixture(scope="module")
def rollup_artifact(artifact: Path) -> Path:
    """The rollup function's artifact, from the same `sam build`."""
    return artifact.parent / "RollupFunction"


@pytest.fixture(scope="module")
def admin_artifact(artifact: Path) -> Path:
    """The admin function's artifact, from the same `sam build`."""
    return artifact.parent / "AdminFunction"


# The plain Python handlers: each artifact is the gateway's recipe with its own app.py.
PYTHON_HANDLERS = {
    "RollupFunction": "functions/rollup/app.py",
    "AdminFunction": "functions/admin/app.py",
}


def test_every_function_of_the_template_is_built(artifact: Path) -> None:
    built = {p.name for p in artifact.parent.iterdir() if p.is_dir()}
    functions = {
        n for n, r in TEMPLATE_RESOURCES.items() if r["Type"] == "AWS::Serverless::Function"
    }
    assert functions == {"GatewayFunction", *PYTHON_HANDLERS} and functions <= built


@pytest.mark.parametrize("function", sorted(PYTHON_HANDLERS))
def test_python_handler_artifacts_are_the_same_recipe_with_their_handler(
    artifact: Path, function: str
) -> None:
    built = artifact.parent / function
    top = {p.name for p in built.iterdir()}
    assert {"app.py", "config.yaml", "hardcap_core"} <= top
    assert not {"run.sh", "buffered.py"} & top, "the gateway's entry points"
    assert not top & set(FORBIDDEN), f"not for the artifact: {sorted(top & set(FORBIDDEN))}"
    assert "bin" not in top and not {"boto3", "botocore"} & top
    assert (built / "app.py").read_bytes() == (ROOT / PYTHON_HANDLERS[function]).read_bytes()
    shipped = {p.name for p in (built / "hardcap_core").iterdir()}
    assert "local" in dev_only_modules() and not shipped & dev_only_modules()
    assert (built / "config.yaml").read_bytes() == (ROOT / "examples/config.yaml").read_bytes()
    lua = {p.name: p.read_bytes() for p in (built / "hardcap_core" / "lua").glob("*.lua")}
    assert lua == {p.name: p.read_bytes() for p in (ROOT / "hardcap_core" / "lua").glob("*.lua")}

    # Everything but the handler files (and their bytecode) is what the gateway ships.
    def tree(root: Path) -> set[str]:
        files = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
        handlers = ("run.sh", "buffered.py", "app.py", "__pycache__/buffered.", "__pycache__/app.")
        return {f for f in files if not f.startswith(handlers)}

    assert tree(built) == tree(artifact)


def test_rollup_handler_imports_from_the_artifact(rollup_artifact: Path, tmp_path: Path) -> None:
    """app.py and the shipped hardcap_core, with this machine's dependencies; building the
    rollup (config, table, cache settings) at import needs no network."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "hardcap_core").symlink_to(rollup_artifact / "hardcap_core")
    shutil.copy(rollup_artifact / "app.py", shim / "app.py")
    probe = "import app, json; print(json.dumps({'handler': callable(app.handler)}))"
    env = {
        **os.environ,
        "PYTHONPATH": str(shim),
        "HARDCAP_CONFIG": str(rollup_artifact / "config.yaml"),
        "HARDCAP_USAGE_TABLE": "hardcap-usage",
        "HARDCAP_REDIS_URL": "redis://127.0.0.1:1",
        "HARDCAP_REDIS_CLUSTER": "false",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=shim, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"handler": True}


def test_admin_handler_imports_from_the_artifact(admin_artifact: Path, tmp_path: Path) -> None:
    """app.py and the shipped hardcap_core (the control package, Mangum's adapter), with this
    machine's dependencies, in the environment the template gives it; building the service at
    import needs no network."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "hardcap_core").symlink_to(admin_artifact / "hardcap_core")
    shutil.copy(admin_artifact / "app.py", shim / "app.py")
    probe = "import app, json; print(json.dumps({'handler': callable(app.handler)}))"
    env = {
        **os.environ,
        "PYTHONPATH": str(shim),
        "HARDCAP_CONFIG": str(admin_artifact / "config.yaml"),
        "HARDCAP_CONFIG_TABLE": "hardcap-config",
        "HARDCAP_USAGE_TABLE": "hardcap-usage",
        "HARDCAP_REDIS_URL": "redis://127.0.0.1:1",
        "HARDCAP_REDIS_CLUSTER": "false",
        "AWS_DEFAULT_REGION": "us-east-1",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=shim, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"handler": True}


def test_the_api_gateway_and_nat_shape_still_builds(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The former defaults, now parameters: the gateway's artifact is the same whatever the
    front door and the network (nothing in the build depends on them)."""
    built = sam_build(
        tmp_path_factory.mktemp("sam-apigw") / "build", "arm64", "examples/config.yaml",
        params={"FrontDoor": "api-gateway", "Egress": "nat"}, only="GatewayFunction",
    )  # fmt: skip
    top = {p.name for p in built.iterdir()}
    assert {"run.sh", "buffered.py", "config.yaml", "hardcap_core", ".lambda-arch"} <= top
    assert os.access(built / "run.sh", os.X_OK)


PYTHON313 = find_python313()
DEMO_KEY = "sk-alpha-demo"  # tenant alpha's key in hardcap_core/local/demo.yaml


@pytest.fixture(scope="module")
def x86_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if PYTHON313 is None or os.uname().machine != "x86_64":
        pytest.skip("needs CPython 3.13 on x86_64 to run an x86_64 artifact")
    # The demo config: its demo key lets the boot test make an authenticated call.
    return sam_build(
        tmp_path_factory.mktemp("sam-x86") / "build", "x86_64", "hardcap_core/local/demo.yaml"
    )


@pytest.fixture
def booted(
    x86_artifact: Path, valkey: LocalValkey
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """run.sh started as Lambda starts it: the artifact as /var/task, python = 3.13."""
    assert PYTHON313 is not None
    port = free_port()
    env = {
        "PATH": f"{Path(PYTHON313).parent}{os.pathsep}{os.environ['PATH']}",
        "LAMBDA_TASK_ROOT": str(x86_artifact),
        "AWS_LWA_PORT": str(port),
        "HARDCAP_CONFIG": str(x86_artifact / "config.yaml"),
        "HARDCAP_REDIS_URL": valkey.url,
        "HARDCAP_REDIS_CLUSTER": "false",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
        # /var/task is read-only on Lambda: only shipped bytecode can be used.
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    proc = subprocess.Popen(
        [str(x86_artifact / "run.sh")], cwd=x86_artifact, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_x86_artifact_boots_like_on_lambda(
    booted: tuple[str, subprocess.Popen[bytes]], x86_artifact: Path
) -> None:
    """Everything shipped, and nothing from this machine, serves the readiness check."""
    url, proc = booted
    assert any(x86_artifact.rglob("*.cpython-313.pyc")), "bytecode compiled for 3.13"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            output = proc.stdout.read().decode() if proc.stdout else ""
            pytest.fail(f"run.sh exited with {proc.returncode}:\n{output}")
        try:
            response = httpx.get(f"{url}/healthz", timeout=2)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "uvicorn did not answer /healthz"
            time.sleep(0.05)
    assert response.status_code == 200
    # The shipped redis client, hiredis and Lua scripts against a real server.
    usage = httpx.get(f"{url}/v1/hardcap/usage", headers={"authorization": f"Bearer {DEMO_KEY}"})
    assert usage.status_code == 200, usage.text
    assert usage.json()["tenant"] == "alpha"
    bad = httpx.get(f"{url}/v1/models", headers={"authorization": "Bearer sk-nope"}, timeout=10)
    assert bad.status_code == 401
    assert bad.json()["error"]["code"] == "invalid_api_key"
