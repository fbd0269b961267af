"""Names of the environment variables Hardcap reads, in one place.

Precedence everywhere: an explicit argument, then the environment, then the config file, then
the default. The SAM template sets exactly these (a test parses both and compares).
"""

from __future__ import annotations

# Path of the YAML config (in the Lambda artifact: the function's own folder).
CONFIG_PATH = "HARDCAP_CONFIG"
# redis:// or rediss:// URL of the budget server; overrides `gateway.redis_url` in the config.
REDIS_URL = "HARDCAP_REDIS_URL"
# "true" when the budget server is in cluster mode (ElastiCache Serverless always is).
REDIS_CLUSTER = "HARDCAP_REDIS_CLUSTER"
