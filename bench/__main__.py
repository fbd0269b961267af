"""``python -m bench NAME [--quick] [ARGS...]`` runs a benchmark of :mod:`bench.catalogue`;
``python -m bench --list`` prints each with its result files, the commit each measured and
whether the code it measures changed since; ``python -m bench report`` regenerates the tables.

Arguments after NAME go to the benchmark unchanged, so every benchmark keeps its own --help.
"""

from __future__ import annotations

import runpy
import sys

from bench.catalogue import BENCHMARKS, by_name
from bench.lib.freshness import RESULTS, check


def listing() -> str:
    """One line per benchmark, then one per result file with its commit and freshness."""
    lines = []
    for b in BENCHMARKS:
        quick = " [--quick]" if b.quick else ""
        lines.append(f"{b.name:<24} python -m bench {b.name}{quick}   ({b.path}: {b.about})")
        if not b.results:
            lines.append(f"{'':<4}no published result")
        for r in b.results:
            path = RESULTS / r.file
            if not path.exists():
                lines.append(f"{'':<4}{r.file}: MISSING")
                continue
            f = check(path, b.measures)
            state = "no commit stored (treated as older)" if f.commit is None else f.commit[:10]
            if f.commit and f.stale:
                state += f", OLDER than its code (changed at {(f.code_commit or '')[:10]})"
            elif f.commit:
                state += ", current"
            if f.absolute:
                state += ", ABSOLUTE PATH in stored command (report refuses it)"
            lines.append(f"{'':<4}{r.file}: {state}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"}:
        print(__doc__)
        print("benchmarks: " + ", ".join(b.name for b in BENCHMARKS) + ", report, plot")
        return 0
    if argv[0] == "--list":
        print(listing())
        return 0
    name, rest = argv[0], argv[1:]
    extra = {"report": "bench.report", "plot": "bench.lib.plot"}
    try:
        module = extra[name] if name in extra else by_name(name).dotted
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    sys.argv = [f"python -m bench {name}", *rest]
    runpy.run_module(module, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
