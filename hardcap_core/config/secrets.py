"""Upstream API keys: from an environment variable, AWS Secrets Manager, or SSM Parameter Store.

Values from AWS are fetched through Powertools Parameters, which caches each one for
``max_age`` seconds per execution environment: a warm function does not call AWS on every
request, and a rotated secret is picked up within minutes. Powertools and boto3 are imported
only when such a key is first needed, so a function without AWS-held keys never pays for them
at cold start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hardcap_core.errors import ConfigError

KeySourceKind = Literal["env", "secret", "parameter"]

# How long a value fetched from AWS is reused before it is fetched again.
DEFAULT_MAX_AGE_SECONDS = 300
# Powertools' own setting; when it is set we let it decide instead of overriding it.
POWERTOOLS_MAX_AGE_ENV = "POWERTOOLS_PARAMETERS_MAX_AGE"

_FIELD = {"env": "api_key_env", "secret": "api_key_secret", "parameter": "api_key_parameter"}
_SERVICE = {"secret": "AWS Secrets Manager", "parameter": "SSM Parameter Store"}


@dataclass(frozen=True, slots=True)
class KeySource:
    """Where one upstream's API key lives: ``kind`` and the variable, secret or parameter name."""

    kind: KeySourceKind
    name: str

    @property
    def field(self) -> str:
        """The config field this source came from, e.g. ``api_key_secret``."""
        return _FIELD[self.kind]


def resolve_api_key(
    upstream: str,
    source: KeySource | None,
    *,
    environ: Mapping[str, str] | None = None,
    max_age: int | None = None,
) -> str | None:
    """The API key of ``upstream``, or None when it has no key source configured.

    Raises :class:`ConfigError` naming the upstream when the variable is unset or empty, or the
    secret or parameter cannot be read (the cause is chained).
    """
    if source is None:
        return None
    if source.kind == "env":
        env = os.environ if environ is None else environ
        value = env.get(source.name, "")
        if not value.strip():
            raise ConfigError(
                f"upstream {upstream!r}: environment variable {source.name} "
                f"(api_key_env) is not set or empty"
            )
        return value.strip()
    value = _fetch_from_aws(upstream, source, max_age)
    if not value.strip():
        raise ConfigError(f"upstream {upstream!r}: {source.field} {source.name!r} is empty")
    return value.strip()


def _fetch_from_aws(upstream: str, source: KeySource, max_age: int | None) -> str:
    # Imported here, not at module top: see the module docstring.
    from aws_lambda_powertools.utilities import parameters
    from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError

    if max_age is None and not os.environ.get(POWERTOOLS_MAX_AGE_ENV):
        max_age = DEFAULT_MAX_AGE_SECONDS
    try:
        if source.kind == "secret":
            value: object = parameters.get_secret(source.name, max_age=max_age)
        else:
            value = parameters.get_parameter(source.name, decrypt=True, max_age=max_age)
    except GetParameterError as exc:
        raise ConfigError(
            f"upstream {upstream!r}: cannot read {source.field} {source.name!r} "
            f"from {_SERVICE[source.kind]}: {exc}"
        ) from exc
    if isinstance(value, bytes):
        # A binary secret (SecretBinary): keys are text, so it must decode as UTF-8.
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"upstream {upstream!r}: {source.field} {source.name!r} is not UTF-8 text"
            ) from exc
    if not isinstance(value, str):
        raise ConfigError(f"upstream {upstream!r}: {source.field} {source.name!r} is not text")
    return value
