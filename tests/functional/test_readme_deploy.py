"""The README's "Deploy to AWS", followed literally by a new user, offline.

A copy of the repository's tracked files (what a fresh clone holds, with this checkout's edits),
the SAM CLI from ``infra/requirements-tools.txt`` in a venv of its own (the one ``make test``
makes), a PATH with that venv and the system's tools only (no project venv, no pyenv shims), the
README's own lines ``cp examples/config.yaml infra/config.yaml`` and ``cd infra && sam build``
taken from its code block. Then the artifact is loaded under Python 3.13, as the runtime loads
it: its code, its validated config copy, its vocabularies, the buffered handler answering a
function URL event; the dependencies are the build's own venv (the lock's pins for this
machine's CPU), since the artifact's wheels are for arm64.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hardcap_core.local.valkey import LocalValkey
from tests.functional.test_infra_build import find_python313
from tests.functional.test_infra_template import ROOT, sam_cli, sam_env

pytestmark = pytest.mark.slow

README = ROOT / "README.md"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def deploy_block() -> list[str]:
    """The commands of the README's deploy code block, comments dropped."""
    section = README.read_text().split("## Deploy to AWS", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "the README's deploy section has a bash block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]


def fresh_clone(target: Path) -> Path:
    """The tracked files of this checkout, as a clone would have them (edits included)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def test_readme_deploy_builds_with_only_the_sam_cli(tmp_path: Path, valkey: LocalValkey) -> None:
    commands = deploy_block()
    copy = "cp examples/config.yaml infra/config.yaml"
    build = "cd infra && sam build && sam deploy --guided"
    assert copy in commands and build in commands, commands

    clone = fresh_clone(tmp_path / "hardcap")
    sam_bin = Path(sam_cli()).parent
    env = {
        k: v
        for k, v in sam_env(tmp_path / "sam-app").items()
        if k.startswith(("AWS_", "SAM_", "__SAM_")) or k in ("HOME", "LANG", "TMPDIR")
    }
    # As a user with the SAM CLI's venv activated: its python3 is the one make finds.
    env["PATH"] = f"{sam_bin}{os.pathsep}{SYSTEM_PATH}"
    probe = subprocess.run(
        ["python3", "-c", "import redis"], env=env, capture_output=True, text=True
    )
    assert probe.returncode != 0, "the SAM CLI's python must lack our dependencies"

    subprocess.run(copy.split(), cwd=clone, env=env, check=True)
    # `sam deploy --guided` needs an AWS account: the build is what runs offline.
    result = subprocess.run(
        ["sam", "build"], cwd=clone / "infra", env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Build Succeeded" in output
    assert "config infra/config.yaml: valid" in output, "the config was validated"
    assert "config not validated" not in output and "every vocabulary shipped" not in output

    artifact = clone / "infra" / ".aws-sam" / "build" / "GatewayFunction"
    build_python = clone / ".aws-sam" / "build-python" / "bin" / "python"
    assert build_python.is_file(), "the build made its own interpreter"
    version = subprocess.run(
        [str(build_python), "-c", "import sys; print(sys.version_info[:2] == (3, 13))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if find_python313() is not None:
        assert version == "True", "the build venv is made from the runtime's Python"

    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "hardcap_core").symlink_to(artifact / "hardcap_core")
    shutil.copy(artifact / "buffered.py", shim / "buffered.py")  # without the arch marker
    event = json.loads((ROOT / "events" / "function-url-usage.json").read_text())
    event["rawPath"] = event["requestContext"]["http"]["path"] = "/healthz"
    (shim / "event.json").write_text(json.dumps(event))
    loaded = """
import importlib, json, pkgutil, sys
from pathlib import Path
import hardcap_core
from hardcap_core.config import loader
from hardcap_core.tokenize import vocabularies
names = [m.name for m in pkgutil.walk_packages(hardcap_core.__path__, "hardcap_core.")]
for name in names:
    importlib.import_module(name)
path = Path(sys.argv[1])
config = loader.load_config(path)
from_copy = loader._validated_copy(path, path.read_text()) is not None
data = Path(sys.argv[2]) / vocabularies.DATA_PACKAGE / "data"
shipped = sorted(p.name for p in data.glob("*" + vocabularies.SUFFIX))
import buffered
class Context:  # what the runtime passes: the deadline is all the handler reads
    aws_request_id = "readme-deploy"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:hardcap-gateway"
    def get_remaining_time_in_millis(self): return 30000
reply = buffered.handler(json.loads(Path("event.json").read_text()), Context())
usage = json.loads(Path("event.json").read_text())
usage["rawPath"] = usage["requestContext"]["http"]["path"] = "/v1/hardcap/usage"
refused = json.loads(buffered.handler(usage, Context())["body"])["error"]["code"]
used = sorted(n + vocabularies.SUFFIX for n in vocabularies.used_by(config))
print(json.dumps({"core": hardcap_core.__file__, "from_copy": from_copy, "shipped": shipped,
                  "used": used, "status": reply["statusCode"], "refused": refused}))
"""
    run = subprocess.run(
        [str(build_python), "-c", loaded, str(artifact / "config.yaml"), str(artifact)],
        cwd=shim, capture_output=True, text=True, timeout=120,
        env={**env, "PYTHONPATH": str(shim), "PYTHONDONTWRITEBYTECODE": "1",
             "HARDCAP_CONFIG": str(artifact / "config.yaml"), "HARDCAP_REDIS_URL": valkey.url,
             "HARDCAP_REDIS_CLUSTER": "false", "POWERTOOLS_LOG_LEVEL": "WARNING"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.splitlines()[-1])
    assert Path(found["core"]).resolve().is_relative_to(artifact.resolve())
    assert found["from_copy"] is True, "the validated copy loads under the runtime's Python"
    assert found["used"], "the example config's routes count with a vocabulary"
    assert set(found["used"]) <= set(found["shipped"]), "a vocabulary a route needs was pruned"
    assert found["status"] == 200
    assert found["refused"] == "invalid_api_key", "a key the example config does not hold"
