"""Structured JSON logs through Powertools Logger: tenant, route, request id; never content.

Prompts and completions are never logged (there is no code path that would), and neither are
keys: only the key's id from the config. Per-request fields go in ``extra`` on each call, not
in ``append_keys``, because a local server runs many requests in one process at once.
"""

from __future__ import annotations

from aws_lambda_powertools import Logger

logger = Logger(service="hardcap")
