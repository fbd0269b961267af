"""The providers a config needs, one per kind of upstream, built once per process.

A route's upstream names its kind (``openai``, ``anthropic``, ``bedrock``); the gateway sends a
request through the provider of that kind. Only the kinds the config uses are built, and each
is imported only then: Bedrock's botocore costs a cold start that an OpenAI-only deploy should
not pay.
"""

from __future__ import annotations

from collections.abc import Mapping

from hardcap_core.config import Config
from hardcap_core.errors import ConfigError
from hardcap_core.providers.base import Provider
from hardcap_core.providers.openai_compat import OpenAICompatible
from hardcap_core.providers.transport import Transport


def providers_for(config: Config, http: Transport) -> Mapping[str, Provider]:
    """A provider for every kind of upstream in ``config``, keyed by kind."""
    kinds = {u.kind for u in config.upstreams.values()}
    cpt = config.gateway.chars_per_token
    out: dict[str, Provider] = {}
    if "openai" in kinds:
        out["openai"] = OpenAICompatible(http, chars_per_token=cpt)
    if "anthropic" in kinds:
        from hardcap_core.providers.anthropic import AnthropicMessages

        out["anthropic"] = AnthropicMessages(http, chars_per_token=cpt)
    if "bedrock" in kinds:
        from hardcap_core.providers.bedrock import BedrockConverse

        out["bedrock"] = BedrockConverse(chars_per_token=cpt)
    missing = kinds - out.keys()
    if missing:
        raise ConfigError(f"no provider for upstream kind(s) {sorted(missing)} yet")
    return out
