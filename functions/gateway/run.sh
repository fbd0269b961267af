#!/bin/sh
# The streaming gateway's handler. AWS_LAMBDA_EXEC_WRAPPER=/opt/bootstrap (the Lambda Web Adapter
# layer) runs this script in place of the Python runtime, polls GET /healthz until uvicorn
# answers, then turns each invocation into a plain HTTP request and streams the response back
# (AWS_LWA_INVOKE_MODE=response_stream). Python has no native Lambda response streaming, hence
# the adapter; the ASGI app is the same one `hardcap serve` runs locally.
set -eu

task_root="${LAMBDA_TASK_ROOT:-$(dirname "$0")}"

# The dependencies' compiled extensions exist for one architecture: fail with a clear message
# rather than with pydantic_core's ImportError when the build and the function disagree.
built_for="$(cat "$task_root/.lambda-arch" 2>/dev/null || echo unknown)"
running_on="$(uname -m)"
if [ "$built_for" != unknown ] && [ "$built_for" != "$running_on" ]; then
    echo "hardcap: artifact built for $built_for but running on $running_on;" \
        "rebuild with LAMBDA_ARCH matching the Architecture parameter" >&2
    exit 1
fi

# Same search path as the python3.13 runtime gives a handler: the artifact, then layers.
export PYTHONPATH="$task_root:${PYTHONPATH:-}:/opt/python:${LAMBDA_RUNTIME_DIR:-/var/runtime}"

# --timeout-keep-alive: the adapter pools its connection to uvicorn and drops it after 4 s idle;
#   the server must not close first, or a request can land on a socket being closed.
# --no-access-log: the app logs one JSON line per request; a second line only costs ingestion.
# --no-proxy-headers: the app reads no client address; uvicorn's X-Forwarded-For middleware would
#   be one more layer for every request and every streamed piece.
# --lifespan on: a config or startup error stops the process, so the failure is visible in the
#   init logs instead of as a gateway answering 500s.
# uvloop and httptools (both in infra/requirements-lambda.txt), named rather than left to uvicorn's
#   "auto", so a missing wheel stops the start instead of silently falling back to asyncio and h11:
#   a worker needs 6.9 ms of CPU per request instead of 9.3 (bench/results/overhead.json), for
#   about 25 ms more cold start out of 700 (bench/results/coldstart-server.json; docs/deploy.md).
exec python -m uvicorn --factory hardcap_core.gateway.app:app_from_env \
    --host 127.0.0.1 --port "${AWS_LWA_PORT:-8080}" \
    --loop uvloop --http httptools --lifespan on \
    --timeout-keep-alive 75 --no-access-log --no-server-header --no-proxy-headers \
    --log-level warning
