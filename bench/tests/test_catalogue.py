"""The catalogue is the one list of benchmarks: every result file in bench/results/ belongs to
one, every benchmark runs by name, --list shows each result's commit, and report.py refuses a
result it could not rerun and says when a result is older than the code it measures."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report
from bench.__main__ import listing
from bench.__main__ import main as bench_main
from bench.catalogue import BENCHMARKS, published
from bench.lib.freshness import ROOT, absolute_path, check, last_change

RESULTS = ROOT / "bench" / "results"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def test_every_result_in_the_tree_is_published_by_a_benchmark_of_the_catalogue() -> None:
    orphans = sorted(p.name for p in RESULTS.iterdir() if p.name not in published())
    assert orphans == [], "superseded results leave the tree (git keeps them)"


def test_each_benchmark_names_its_module_and_commands_with_relative_paths_only() -> None:
    names = [b.name for b in BENCHMARKS]
    assert len(names) == len(set(names))
    for b in BENCHMARKS:
        assert (ROOT / b.path).is_file(), b.path
        assert b.question in {"budget", "speed", "coldstart", "cost", "failover"}
        for path in b.measures:
            assert (ROOT / path).exists(), f"{b.name} measures {path}, which is not there"
        for r in b.results:
            assert not absolute_path(f"python -m bench {b.name} {r.args}"), r


def test_list_prints_every_benchmark_and_the_commit_of_each_result() -> None:
    text = listing()
    for b in BENCHMARKS:
        assert f"python -m bench {b.name}" in text
        for r in b.results:
            line = next(x for x in text.splitlines() if x.strip().startswith(f"{r.file}:"))
            path = RESULTS / r.file
            if path.suffix == ".json" and path.exists():
                commit = check(path, b.measures).commit
                assert (commit or "no commit stored")[:10] in line


def test_an_unknown_name_fails_and_says_what_there_is(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["no_such_benchmark"]) == 2
    assert "overshoot" in capsys.readouterr().err


def test_a_benchmark_runs_by_name_with_its_arguments_passed_through() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "overshoot", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--quick" in out and "python -m bench overshoot" in out


def _result(tmp: Path, name: str, commit: str | None, command: str) -> Path:
    path = tmp / name
    machine = {"git_commit": commit} if commit else {}
    path.write_text(json.dumps({"command": command, "machine": machine}))
    return path


def test_a_result_measured_before_its_code_changed_is_marked_in_the_caption(
    tmp_path: Path,
) -> None:
    measures = ("hardcap_core/ledger",)
    changed = last_change(measures)
    assert changed
    before = _git("rev-parse", f"{changed}~1")
    old = check(_result(tmp_path, "a.json", before, "python -m bench ledger"), measures)
    assert old.stale
    assert old.caption() == (
        f"measured at `{before[:10]}`; the code it measures changed since at `{changed[:10]}`"
    )
    new = check(_result(tmp_path, "b.json", changed, "python -m bench ledger"), measures)
    assert not new.stale and new.caption() == f"measured at `{changed[:10]}`"
    none = check(_result(tmp_path, "c.json", None, "python -m bench ledger"), measures)
    assert none.stale and "no commit stored" in none.caption()


@pytest.mark.parametrize(
    ("command", "absolute"),
    [
        ("python -m bench overshoot --out /work/sweep/overshoot.json", True),
        ("python -m bench coldstart --python=/root/.pyenv/bin/python3.13", True),
        ("PYTHONPATH=/tmp/x python -m bench ledger", True),
        ("python -m bench overshoot --out bench/results/overshoot.json", False),
        ("python -m bench coldstart --artifact .aws-sam/build/GatewayFunction", False),
    ],
)
def test_absolute_paths_in_a_stored_command_are_found(command: str, absolute: bool) -> None:
    assert absolute_path(command) is absolute


def test_report_refuses_a_result_whose_command_holds_an_absolute_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head = _git("rev-parse", "HEAD")
    _result(tmp_path, "ledger.json", head, "python -m bench ledger --out /work/x/ledger.json")
    doc = tmp_path / "benchmarks.md"
    doc.write_text("<!-- bench:ledger -->\nkept\n<!-- /bench:ledger -->\n")
    args = ["--results", str(tmp_path), "--doc", str(doc), "--readme", str(tmp_path / "R.md")]
    assert report.main([*args, "--catalogue", str(tmp_path / "bench-README.md")]) == 1
    assert "refused `ledger.json`: its stored command holds an absolute path" in (
        capsys.readouterr().err
    )
    assert doc.read_text() == "<!-- bench:ledger -->\nkept\n<!-- /bench:ledger -->\n"


def test_bench_readme_has_one_row_per_published_result_with_its_command(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("<!-- bench:catalogue -->\n<!-- /bench:catalogue -->\n")
    args = ["--results", str(tmp_path), "--doc", str(tmp_path / "d.md")]
    report.main([*args, "--readme", str(tmp_path / "R.md"), "--catalogue", str(readme)])
    rows = [x for x in readme.read_text().splitlines() if x.startswith("| ") and "`bench/" in x]
    assert len(rows) == sum(len(b.results) for b in BENCHMARKS)
    for b in BENCHMARKS:
        for r in b.results:
            row = next(x for x in rows if f"`bench/results/{r.file}`" in x)
            assert f"`python -m bench {b.name}" in row and "missing: run the command" in row


def test_the_tests_import_nothing_from_bench() -> None:
    """bench/ may use tests/ (shared load clients, request shapes); never the other way."""
    pattern = re.compile(r"^\s*(from|import)\s+bench\b", re.M)
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("*.py")
        if pattern.search(p.read_text())
    ]
    assert offenders == []


def test_a_plot_takes_the_commit_of_the_result_that_made_it(tmp_path: Path) -> None:
    """A PNG or SVG stores no commit: the result naming it (a wrk run's flame graphs) or the
    result of its name whose run drew it (``--plot``) says what it measured; else it is older."""
    commit = last_change(("hardcap_core",))
    assert commit is not None
    machine = {"git_commit": commit}
    (tmp_path / "wrk.json").write_text(
        json.dumps({"command": "python -m bench wrk_overhead", "machine": machine,
                    "profiles": [{"svg": "profile.svg"}]})
    )  # fmt: skip
    (tmp_path / "failover.json").write_text(
        json.dumps({"command": "python -m bench failover --plot", "machine": machine})
    )
    (tmp_path / "other.json").write_text(
        json.dumps({"command": "python -m bench other", "machine": machine})
    )
    for name in ("profile.svg", "failover.png", "other.png", "orphan.png"):
        (tmp_path / name).write_bytes(b"")
    measures = ("hardcap_core",)
    assert check(tmp_path / "profile.svg", measures).commit == commit
    assert check(tmp_path / "failover.png", measures).commit == commit
    assert check(tmp_path / "other.png", measures).commit is None  # its run drew no plot
    assert check(tmp_path / "orphan.png", measures).stale
