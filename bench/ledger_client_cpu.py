"""The ledger client's own CPU per admit + settle pair, with the server replaced by canned replies.

bench/ledger.py's client CPU is the ledger's Python (keys, spec, reply parsing) plus redis-py's
call path; this measures the first alone: the same Ledger, scope and calls, each script answered
at once with a reply of the shape the real one has.

    PYTHONPATH=. python bench/ledger_client_cpu.py   # seconds; results/ledger-client-cpu.json
"""

from __future__ import annotations

import asyncio
import datetime
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.ledger import INPUT_TOKENS, OUTPUT_ESTIMATE, PRICES, bench_scope
from bench.machine import machine_info, write_json
from hardcap_core.ledger import Admitted, Ledger
from hardcap_core.ledger.scripts import LEDGER_SCRIPTS, STANDALONE_SCRIPTS

RESULTS = Path(__file__).resolve().parent / "results"
NAMES = LEDGER_SCRIPTS + STANDALONE_SCRIPTS  # Scripts.register's order


class Canned:
    def __init__(self, name: str) -> None:
        self.name = name

    async def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        now = int(time.time() * 1000)
        if self.name == "admit":
            return [b"ok", now, OUTPUT_ESTIMATE, 4, *[10**14, 5000] * 4, 1, 10**8, 100, 10**11, 5]
        return [b"ok", now, 1, 0, 4, *[10**14, 5000] * 4]


class CannedClient:
    def __init__(self) -> None:
        self.names = iter(NAMES)

    def register_script(self, src: str) -> Canned:
        return Canned(next(self.names))


async def measure(pairs: int, rounds: int) -> list[float]:
    ledger = Ledger(CannedClient(), prefix="hc-cpu")
    scope = bench_scope()

    async def pair() -> None:
        r = await ledger.admit(
            scope, input_tokens=INPUT_TOKENS, output_estimate=OUTPUT_ESTIMATE, prices=PRICES
        )
        assert isinstance(r, Admitted), r
        await ledger.settle(r.reservation, input_tokens=INPUT_TOKENS, output_tokens=150)

    for _ in range(500):
        await pair()
    out = []
    for _ in range(rounds):
        cpu = time.process_time()
        for _ in range(pairs):
            await pair()
        out.append(round(1e6 * (time.process_time() - cpu) / pairs, 1))
    return out


def main() -> int:
    rounds = asyncio.run(measure(5000, 5))
    data = {
        "bench": "ledger-client-cpu",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python bench/ledger_client_cpu.py",
        "parameters": {"pairs_per_round": 5000, "scope": "bench/ledger.py's"},
        "machine": machine_info(),
        "cpu_us_per_pair_rounds": rounds,
        "cpu_us_per_pair_median": statistics.median(rounds),
    }
    out = RESULTS / "ledger-client-cpu.json"
    write_json(out, data)
    print(f"ledger client CPU per admit + settle: {statistics.median(rounds)} µs (rounds {rounds})")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
