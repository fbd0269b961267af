"""The YAML config: its schema, loading and cross-checks, and what the gateway builds from it."""

from hardcap_core.config.loader import load_config, parse_config
from hardcap_core.config.model import Config, Policy, Principal, Route, Upstream

__all__ = ["Config", "Policy", "Principal", "Route", "Upstream", "load_config", "parse_config"]
