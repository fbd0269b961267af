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
# Name of the DynamoDB table of the durable usage ledger (unset: no durable store, no rollup).
# boto3 reaches it at AWS_ENDPOINT_URL_DYNAMODB (or AWS_ENDPOINT_URL) when set: a local moto.
USAGE_TABLE = "HARDCAP_USAGE_TABLE"
# Name of the DynamoDB table of the live config: tenants, keys, budgets changed without a deploy
# (hardcap_core/control/). Unset: the config file's tenants are the only ones.
CONFIG_TABLE = "HARDCAP_CONFIG_TABLE"
# Where traces go: an OTLP/HTTP endpoint (a collector's base URL, e.g. http://127.0.0.1:4318, or
# its /v1/traces URL); overrides `gateway.otlp_endpoint`. Unset (and no OTEL_EXPORTER_OTLP_*
# endpoint): no traces, and the OpenTelemetry SDK is never imported (docs/tracing.md).
OTLP_ENDPOINT = "HARDCAP_OTLP_ENDPOINT"
# The OpenTelemetry SDK's own names for the same, honoured after ours (traces' first).
OTEL_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTEL_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
# "true": no traces whatever the endpoints say (the SDK's switch).
OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"
