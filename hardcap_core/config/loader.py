"""Loading the config file: the build's validated copy when it matches, else the YAML, validated.

A cold start does not parse or validate the YAML again: the Lambda build validates it and ships
the loaded config beside it (:func:`write_validated`, ``<config>.validated.pickle``), which
:func:`load_config` uses when it was made from exactly the text it finds (its SHA-256 must match)
by this format. Importing PyYAML and pydantic and defining the schema's models is about 180 ms
of a cold start (docs/coldstart.md); neither is imported then. The copy is part of the artifact,
as trusted as its code; any doubt about it (missing, stale, unreadable) means validating the
YAML as before. Validation itself is :mod:`hardcap_core.config.validation`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hardcap_core.config.model import Config
from hardcap_core.config.settings import env_overrides
from hardcap_core.errors import ConfigError

# The validated file a build ships next to the YAML; a new format number invalidates old ones.
VALIDATED_SUFFIX = ".validated.pickle"
VALIDATED_FORMAT = 5


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file; :class:`ConfigError` says what is wrong and where.

    If ``<path>.validated.pickle`` was written from this very text (:func:`write_validated`),
    the config is taken from it instead of parsing and validating again; the environment's
    overrides (``HARDCAP_REDIS_URL``, ``HARDCAP_REDIS_CLUSTER``) apply either way."""
    text = _read(path)
    loaded = _validated_copy(Path(path), text)
    if loaded is None:
        return parse_config(_parse_yaml(text, path), source=str(path))
    gateway = env_overrides(loaded.gateway, os.environ)
    return dataclasses.replace(loaded, gateway=gateway, source=str(path))


def parse_config(
    data: Any, source: str = "<config>", *, environ: Mapping[str, str] | None = None
) -> Config:
    """Validate parsed YAML and build the config; ``environ`` (default: ``os.environ``) may
    override ``gateway.redis_url`` and ``gateway.redis_cluster``."""
    from hardcap_core.config.validation import parse_config as validate

    return validate(data, source, environ=environ)


def read_data(path: str | Path) -> Any:
    """The config file's YAML, parsed but not validated (what a live config joins the config
    table's tenants into: :mod:`hardcap_core.control.live`)."""
    return _parse_yaml(_read(path), path)


def write_validated(path: str | Path, out: str | Path | None = None) -> Path:
    """Validate the config at ``path`` and write the validated file for :func:`load_config`
    (default: beside it); raises :class:`ConfigError` as loading does. The build runs this."""
    text = _read(path)
    data = _parse_yaml(text, path)
    # Every check, cross-checks included; without the environment's overrides, which the
    # function's own environment applies at load.
    config = parse_config(data, source=str(path), environ={})
    target = Path(out) if out is not None else _validated_path(Path(path))
    payload = {"format": VALIDATED_FORMAT, "sha256": _digest(text), "config": config}
    target.write_bytes(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
    return target


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from exc


def _parse_yaml(text: str, path: str | Path) -> Any:
    # Imported here: a cold start with a validated copy never parses YAML (about 25 ms).
    import yaml

    from hardcap_core.config.yaml_strict import StrictLoader

    try:
        return yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML in {path}: {exc}") from exc


def _validated_path(path: Path) -> Path:
    return path.with_name(path.name + VALIDATED_SUFFIX)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _validated_copy(path: Path, text: str) -> Config | None:
    """The config shipped beside ``path`` if it was made from ``text``; None if there is none,
    it is stale (another text), or this version of the code cannot read it."""
    try:
        raw = _validated_path(path).read_bytes()
    except OSError:
        return None
    # Written by the build and shipped with the code: as trusted as the code itself. Any failure
    # to read it (another version of a class, a truncated file) means validating the YAML.
    try:
        payload = pickle.loads(raw)
    except Exception:
        return None
    if (
        not isinstance(payload, dict)
        or payload.get("format") != VALIDATED_FORMAT
        or payload.get("sha256") != _digest(text)
        or not isinstance(payload.get("config"), Config)
    ):
        return None
    config: Config = payload["config"]
    return config
