"""``hardcap admin`` and ``hardcap config`` as an operator runs them against a local ``hardcap
serve --admin-token``: its embedded DynamoDB holds the config table, and a key the CLI issues
works on that gateway at once (and stops working when revoked), with no restart."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from hardcap_core.local.cli import main
from hardcap_core.local.stack import Service, start_gateway
from hardcap_core.local.valkey import LocalValkey
from tests.stack import config_data

TOKEN = "local-admin-token-0123456789"
KEY = re.compile(r"^\s+(hc_[A-Za-z0-9_\-]{43})$", re.MULTILINE)


@pytest.fixture
def gateway(
    valkey: LocalValkey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Service, Path]]:
    for name in ("HARDCAP_USAGE_TABLE", "HARDCAP_CONFIG_TABLE", "AWS_ENDPOINT_URL_DYNAMODB",
                 "AWS_ENDPOINT_URL", "HARDCAP_ADMIN_TOKEN", "HARDCAP_ADMIN_URL"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "config.yaml"
    data = config_data("http://127.0.0.1:9", valkey.url)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    service = start_gateway(path, tmp_path, options=["--admin-token", TOKEN],
                            env={"POWERTOOLS_LOG_LEVEL": "WARNING"})  # fmt: skip
    yield service, path
    service.stop()


def hardcap(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def test_the_cli_runs_a_tenant_through_its_life(
    gateway: tuple[Service, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    service, _ = gateway
    conn = ["--url", service.url, "--token", TOKEN, "--operator", "ops-alice"]

    status, out, _ = hardcap(capsys, "admin", "tenants", "list", *conn)
    assert status == 0 and out.splitlines()[2].split()[:2] == ["alpha", "acme"]

    status, out, _ = hardcap(capsys, "admin", "tenants", "create", "gamma", "--org", "acme",
                             "--routes", "small", "--budget", "total_tokens:50000:day",
                             *conn)  # fmt: skip
    assert status == 0 and "tenant gamma saved" in out, out

    status, out, _ = hardcap(capsys, "admin", "keys", "create", "--tenant", "gamma", "--id",
                             "gamma-ci", *conn)  # fmt: skip
    assert status == 0 and "shown once" in out
    found = KEY.search(out)
    assert found, out
    key = found.group(1)
    # The gateway serves the new key at once: no redeploy, no restart.
    models = httpx.get(f"{service.url}/v1/models", headers={"authorization": f"Bearer {key}"})
    assert models.status_code == 200, models.text

    status, out, _ = hardcap(capsys, "admin", "keys", "list", "--tenant", "gamma", "--json", *conn)
    (listed,) = json.loads(out)["keys"]
    assert (listed["id"], listed["status"], listed["last_used_at"]) == ("gamma-ci", "active", None)
    assert key not in out

    status, out, _ = hardcap(capsys, "admin", "budgets", "set", "--level", "tenant", "--id",
                             "gamma", "--dimension", "total_tokens", "--window", "day",
                             "--limit", "90000", "--for", "2h", "--reason", "launch",
                             *conn)  # fmt: skip
    assert status == 0 and "then its own budgets again" in out, out

    status, out, _ = hardcap(capsys, "admin", "keys", "revoke", "gamma-ci", *conn)
    assert status == 0 and "revoked" in out
    chat = httpx.post(
        f"{service.url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": "small", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert chat.status_code == 401, chat.text

    status, out, _ = hardcap(capsys, "admin", "audit", *conn)
    assert status == 0
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [r[3] for r in rows[:4]] == ["key.revoke", "budget.override", "key.create",
                                        "tenant.create"]  # fmt: skip
    assert all(r[2] == "local:ops-alice" for r in rows)
    assert key not in out


def test_config_plan_apply_export(
    gateway: tuple[Service, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    service, path = gateway
    conn = ["--url", service.url, "--token", TOKEN]
    data = yaml.safe_load(path.read_text())
    data["tenants"][1]["budgets"][0]["limit"] = 2_000_000  # beta's output_tokens per day
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(data, sort_keys=False))

    status, out, _ = hardcap(capsys, "config", "plan", "-c", str(changed), *conn)
    assert status == 0 and "~ tenant beta: budgets[0].limit 1000000 -> 2000000" in out, out
    status, out, _ = hardcap(capsys, "config", "apply", "-c", str(changed), *conn)
    assert status == 0 and "Applied" in out, out
    status, out, _ = hardcap(capsys, "config", "plan", "-c", str(changed), *conn)
    assert status == 0 and out.strip() == "No changes."

    exported = tmp_path / "exported.yaml"
    status, out, _ = hardcap(capsys, "config", "export", "-o", str(exported), *conn)
    assert status == 0 and exported.is_file()
    status, out, _ = hardcap(capsys, "config", "plan", "-c", str(exported), *conn)
    assert status == 0 and out.strip() == "No changes."

    status, _, err = hardcap(capsys, "admin", "tenants", "list", "--url", service.url,
                             "--token", "not-the-token-0123456789")  # fmt: skip
    assert status == 1 and "401" in err
