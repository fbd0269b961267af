"""Every ``bench:NAME`` block in the README and the docs has a generator in bench/report.py, and
every generator has a block to fill: a table cannot be typed by hand between markers nobody
writes, nor a generator write into nothing."""

from __future__ import annotations

import re
from pathlib import Path

from bench import report

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!-- bench:([\w-]+) -->")
END = re.compile(r"<!-- /bench:([\w-]+) -->")


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_marker_has_a_generator_and_every_generator_a_marker() -> None:
    found: dict[str, list[str]] = {}
    for page in _pages():
        text = page.read_text()
        opened, closed = MARKER.findall(text), END.findall(text)
        assert sorted(opened) == sorted(closed), f"{page.name}: a block opened and not closed"
        for name in opened:
            found.setdefault(name, []).append(page.name)
    assert sorted(set(found) - set(report.BLOCKS)) == [], "markers with no generator"
    assert sorted(set(report.BLOCKS) - set(found)) == [], "generators with no marker"


def test_the_blocks_build_makes_are_the_generators_named() -> None:
    """build() over the results in the tree makes no block outside BLOCKS."""
    res = report.RESULTS
    blocks = report.build(
        res / "overshoot.json",
        res / "overhead.json",
        res / "ledger.json",
        res / "wrk-overhead.json",
        res / "levers.json",
        res / "overshoot-realistic.json",
        res / "lambda-share.json",
        failover=res / "failover.json",
        tpm=res / "tpm-window.json",
        propagation=res / "live-config-propagation.json",
        coldstart=res / "coldstart-artifact-head.json",
        tokenizer=res / "tokenizer-cost.json",
        redis_clients=res / "redis-clients.json",
        pipe_ab=res / "wrk-pipe-ab.json",
        phases=res / "coldstart-phases.json",
        transports=res / "coldstart-transports.json",
        servers=res / "coldstart-server.json",
        input_estimate=res / "input-estimate.json",
        starved=res / "overshoot-starved.json",
        cut_charge=res / "cut-charge.json",
        loop_lag=res / "loop-lag.json",
    )
    assert blocks and set(blocks) <= set(report.BLOCKS)
