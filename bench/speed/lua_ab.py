"""Server time of the ledger scripts from two trees side by side, on one server, interleaved.

``bench/speed/ledger.py`` measures one tree; on a shared 2-core machine two runs minutes apart
differ
by more than a change to a script does. This loads admit, extend and settle from the ``lua/`` of
``--base`` (another checkout, e.g. ``git worktree add /tmp/ledger-base <rev>``) and of this
tree on one private valkey-server, sends both the very calls this tree's Ledger builds (the
argument format is shared), and alternates base and new in rounds: per round, per tree, N
admits, then N extends, then N settles of those holds, each batch between ``CONFIG RESETSTAT``
and ``INFO commandstats`` (``usec_per_call`` of EVALSHA is that script's time in the server).
A ``return 1`` batch per round gives the machine's floor.

    python -m bench lua_ab --base /tmp/ledger-base            # ~1 min
    python -m bench lua_ab --base /tmp/ledger-base --quick
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import shlex
import statistics
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis

from bench.lib.machine import machine_info, write_json
from bench.speed.redis_clients import ledger_calls, with_id
from hardcap_core.ledger.scripts import LEDGER_SCRIPTS
from hardcap_core.local.valkey import LocalValkey

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
SCRIPTS = ("admit", "extend", "settle")


def lua_of(tree: Path) -> Path:
    """A checkout's scripts: ``hardcap_core/lua/`` now, ``lua/`` in trees from before the move."""
    inside = tree / "hardcap_core" / "lua"
    return inside if inside.is_dir() else tree / "lua"


def sources(lua: Path) -> dict[str, str]:
    """Each script as that tree sends it: its preludes (``consts.lua`` where the tree has one,
    ``lib.lua`` for the ledger scripts) before the body, as its ``ledger/scripts.py`` does."""
    consts = lua / "consts.lua"
    prelude = consts.read_text(encoding="utf-8") + "\n" if consts.is_file() else ""
    lib = (lua / "lib.lua").read_text(encoding="utf-8")
    out = {}
    for name in SCRIPTS:
        body = (lua / f"{name}.lua").read_text(encoding="utf-8")
        out[name] = prelude + (lib + "\n" + body if name in LEDGER_SCRIPTS else body)
    return out


def usec_per_call(r: redis.Redis) -> float:
    row = r.info("commandstats").get("cmdstat_evalsha", {})
    return float(row.get("usec_per_call", 0.0))


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--base", required=True, help="the other checkout (its scripts are 'base')")
    parser.add_argument("--calls", type=int, default=2000, help="calls per batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="500 calls, 2 rounds")
    parser.add_argument("--out", help="default bench/results/ledger-lua-ab.json")
    args = parser.parse_args(None if argv is None else list(argv))
    if args.quick:
        args.calls, args.rounds = 500, 2
    out = Path(
        args.out or RESULTS / ("ledger-lua-ab-quick.json" if args.quick else "ledger-lua-ab.json")
    )
    from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

    prefix = f"hc-ab-{uuid.uuid4().hex[:8]}"
    rid0, calls = asyncio.run(ledger_calls(prefix))
    trees = {"base": sources(lua_of(Path(args.base))), "new": sources(lua_of(ROOT))}
    rows: list[dict[str, Any]] = []
    with LocalValkey() as server:
        r = redis.Redis.from_url(server.url)
        r.set(calls["admit"][0][8], "bench")  # the 'restored' marker: counters in place
        shas = {t: {n: r.script_load(src) for n, src in s.items()} for t, s in trees.items()}
        noop = r.script_load("return 1")
        bar = tqdm(total=args.rounds * 2, unit="tree", file=sys.stderr)
        for round_ in range(args.rounds):
            order = ("base", "new") if round_ % 2 == 0 else ("new", "base")
            for tree in order:
                rids = [f"{tree}{round_}-{i}-{uuid.uuid4().hex[:6]}" for i in range(args.calls)]
                row: dict[str, Any] = {"tree": tree, "round": round_}
                for name in SCRIPTS:
                    call = calls[name] if name != "extend" else calls["extend"]
                    r.config_resetstat()
                    for rid in rids:
                        keys, a = with_id(call, rid0, rid)
                        reply = r.evalsha(shas[tree][name], len(keys), *keys, *a)
                        if reply[0] != b"ok":
                            raise RuntimeError(f"{tree} {name}: {reply[:3]}")
                    row[name] = usec_per_call(r)
                r.config_resetstat()
                for _ in range(args.calls):
                    r.evalsha(noop, 0)
                row["noop"] = usec_per_call(r)
                rows.append(row)
                bar.update(1)
        bar.close()
    summary = {
        tree: {
            k: round(statistics.median(x[k] for x in rows if x["tree"] == tree), 2)
            for k in (*SCRIPTS, "noop")
        }
        for tree in trees
    }
    data = {
        "bench": "ledger-lua-ab",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "bench", "lua_ab", *sys.argv[1:]]),
        "parameters": {"calls": args.calls, "rounds": args.rounds, "base": args.base,
                       "scope": "bench/speed/ledger.py's (3 levels, 4 budgets, rpm+tpm)"},
        "machine": machine_info(),
        "rounds": rows,
        "median_usec_per_call": summary,
    }  # fmt: skip
    write_json(out, data)
    print("| tree | " + " | ".join(f"{k} µs" for k in (*SCRIPTS, "noop")) + " |")
    print("|---|" + "---:|" * (len(SCRIPTS) + 1))
    for tree, s in summary.items():
        print(f"| {tree} | " + " | ".join(f"{s[k]:.2f}" for k in (*SCRIPTS, "noop")) + " |")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
