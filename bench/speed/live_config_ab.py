"""The live config's cost on the hot path: a gateway before it (``--base-tree``) against one with
a config table (``--gateway-tree``), in one wrk run, blocks alternating.

What the live config adds per request: the copy's freshness check (a clock comparison), the
config version in the admit's spec and one GET of the hierarchy's version key inside the admit
script; no DynamoDB call (the table is read at start and every 30 s). Both gateways get the same
environment: an embedded DynamoDB (moto, in this process) with the usage and config tables; the
base tree does not read ``HARDCAP_CONFIG_TABLE``. The figures are bench/speed/wrk_overhead.py's.

    python -m bench live_config_ab --base-tree f3d094f --gateway-tree HEAD \
        --out bench/results/wrk-live-config-ab.json
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from hardcap_core.local.aws import LocalAws

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-tree", required=True, metavar="REV")
    p.add_argument("--gateway-tree", default="HEAD", metavar="REV")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, required=True)
    ns = p.parse_args(argv)
    args = [
        sys.executable, "-m", "bench", "wrk_overhead", "--targets", "direct,gateway",
        "--gateway-tree", ns.gateway_tree, "--base-tree", ns.base_tree,
        "--rounds", str(ns.rounds), "--out", str(ns.out),
    ]  # fmt: skip
    if ns.quick:
        args.append("--quick")
    with LocalAws(table="bench-usage", config_table="bench-config"):
        # The gateways inherit the tables' names and the endpoint from this environment.
        return subprocess.run(args, cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
