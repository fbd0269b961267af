"""bench/README.md's table: one row per published result, from :mod:`bench.catalogue` and the
result files themselves (the commit each measured, whether its code changed since)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench.catalogue import BENCHMARKS
from bench.lib.freshness import Freshness


def catalogue_table(results: Path, fresh: Callable[[Path, tuple[str, ...]], Freshness]) -> str:
    rows = [
        "| Question | Result | Command | Measured at | Publishes |",
        "|---|---|---|---|---|",
    ]
    for b in BENCHMARKS:
        for r in b.results:
            path = results / r.file
            if not path.exists():
                state = "missing: run the command"
            else:
                f = fresh(path, b.measures)
                if f.commit is None:
                    state = "no commit stored (treat as older than its code)"
                else:
                    state = f"`{f.commit[:10]}`"
                    if f.stale and f.code_commit:
                        state += f"; code changed since at `{f.code_commit[:10]}`"
                if f.absolute:
                    state += "; **refused**: absolute path in its stored command"
            command = f"python -m bench {b.name} {r.args}".strip()
            rows.append(
                f"| {b.question} | `bench/results/{r.file}` | `{command}` | {state} "
                f"| {r.publishes} |"
            )
    unpublished = [b.name for b in BENCHMARKS if not b.results]
    rows += ["", "Benchmarks with no published result: " + ", ".join(unpublished) + "."]
    return "\n".join(rows)
