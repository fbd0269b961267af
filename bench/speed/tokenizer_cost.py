"""What a tokenizer route costs against today's bound, in one run: CPU per request and cold start.

Per request: CPU (``time.process_time``) to parse a chat body and count its input, for prompts
of about 500, 4,000 and 16,000 tokens (English prose and source code): the bound alone (what
every request pays today, at parse) and the bound plus each tokenizer's count (what a request
pays when its count is needed: the bound does not fit, or ``exact_count: always``). The
vocabulary is loaded before these are timed.

Cold start: each in a fresh interpreter, the CPU to import the gateway's app (today's and a
tokenizer route's are the same: nothing is loaded on import), then to load each vocabulary
(the first count that needs it pays this once per process), and the count's first call.

    python -m bench tokenizer_cost              # quick: a few repeats
    python -m bench tokenizer_cost --repeats 50 --cold 5
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

from bench.lib.machine import ROOT, machine_info, write_json
from hardcap_core.tokenize.counters import counter_for
from hardcap_core.tokenize.vocabularies import encoding
from hardcap_core.wire.openai_request import parse_chat_request
from tests.input_shapes import PROSE

RESULT = ROOT / "bench" / "results" / "tokenizer-cost.json"
SIZES = (500, 4_000, 16_000)  # prompt tokens (cl100k_base), about
TOKENIZERS = ("o200k_base", "cl100k_base", "anthropic")
COLD = """
import json, sys, time
t0 = time.process_time()
import hardcap_core.gateway.app
t1 = time.process_time()
from hardcap_core.tokenize.vocabularies import encoding
encoding(sys.argv[1])
t2 = time.process_time()
from hardcap_core.tokenize.counters import counter_for
counter_for(sys.argv[1]).count({"messages": [{"role": "user", "content": "A first count."}]})
t3 = time.process_time()
print(json.dumps({"import_app_ms": (t1 - t0) * 1e3, "load_vocabulary_ms": (t2 - t1) * 1e3,
                  "first_count_ms": (t3 - t2) * 1e3}))
"""


def bodies() -> dict[str, bytes]:
    """Chat bodies of about each size, of prose and of code."""
    cl100k = encoding("cl100k_base").encode_ordinary
    code = inspect.getsource(json.decoder) + inspect.getsource(textwrap)
    out = {}
    for kind, source in (("prose", PROSE * 400), ("code", code * 8)):
        for size in SIZES:
            low, high = 0, len(source)  # the longest start of `source` within `size` tokens
            while low < high:
                middle = (low + high + 1) // 2
                low, high = (middle, high) if len(cl100k(source[:middle])) <= size else (
                    low, middle - 1)  # fmt: skip
            text = source[:low]
            body = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": text}]}  # fmt: skip
            out[f"{kind} {size}"] = json.dumps(body).encode()
    return out


def cpu_us(work: Callable[[], Any], repeats: int) -> float:
    """The median CPU microseconds of one call (after a warm-up)."""
    work()
    samples = []
    for _ in range(repeats):
        started = time.process_time_ns()
        work()
        samples.append((time.process_time_ns() - started) / 1000)
    return statistics.median(samples)


def per_request(repeats: int, bar: Any) -> list[dict[str, Any]]:
    for name in ("o200k_base", "cl100k_base"):
        encoding(name)  # loaded once before timing, as in a warm process
    rows = []
    for label, raw in bodies().items():
        chat = parse_chat_request(raw)
        row: dict[str, Any] = {
            "prompt": label,
            "body_bytes": len(raw),
            "bound_tokens": chat.input_tokens,
            "bound_us": cpu_us(lambda raw=raw: parse_chat_request(raw), repeats),
        }
        for tokenizer in TOKENIZERS:
            counter = counter_for(tokenizer)
            row[f"{tokenizer}_tokens"] = counter.count(chat.body)
            row[f"{tokenizer}_extra_us"] = cpu_us(
                lambda c=counter, b=chat.body: c.count(b), repeats
            )
        rows.append(row)
        bar.update(1)
    return rows


def cold_start(runs: int, bar: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("o200k_base", "cl100k_base"):
        samples = []
        for _ in range(runs):
            done = subprocess.run(
                [sys.executable, "-c", COLD, name], cwd=ROOT, capture_output=True, text=True,
                check=True, env={**os.environ, "PYTHONPATH": str(ROOT),
                                 "POWERTOOLS_LOG_LEVEL": "WARNING"},
            )  # fmt: skip
            samples.append(json.loads(done.stdout.splitlines()[-1]))
            bar.update(1)
        out[name] = {
            key: round(statistics.median(s[key] for s in samples), 1) for key in samples[0]
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--repeats", type=int, default=9, help="timed calls per cell")
    parser.add_argument("--cold", type=int, default=3, help="fresh interpreters per vocabulary")
    args = parser.parse_args(argv)
    bar = tqdm(total=2 * len(SIZES) + 2 * args.cold, unit="step", desc="tokenizer cost")
    rows = per_request(args.repeats, bar)
    cold = cold_start(args.cold, bar)
    bar.close()
    print(f"{'prompt':<12} {'bound µs':>9} " + " ".join(f"{t + ' +µs':>16}" for t in TOKENIZERS))
    for r in rows:
        extras = " ".join(f"{r[f'{t}_extra_us']:>16.0f}" for t in TOKENIZERS)
        print(f"{r['prompt']:<12} {r['bound_us']:>9.0f} {extras}")
    for name, c in cold.items():
        print(f"cold start {name}: import app {c['import_app_ms']} ms, vocabulary "
              f"{c['load_vocabulary_ms']} ms, first count {c['first_count_ms']} ms")  # fmt: skip
    write_json(
        args.out,
        {
            "benchmark": "tokenizer-cost",
            "command": "python -m bench tokenizer_cost "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "parameters": {"repeats": args.repeats, "cold": args.cold, "sizes": SIZES},
            "units": "CPU microseconds per request (median); cold start CPU ms (median)",
            "machine": machine_info(),
            "per_request": rows,
            "cold_start": cold,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
