"""The ledger's Python-side lifetimes and limits, named once (the Lua side names its own in
``lua/consts.lua``). Every ledger module imports them from here; none keeps a literal of its own.
"""

from __future__ import annotations

# -- lifetimes --------------------------------------------------------------------------------

# How long a hold lives without an extend or settle is the config's
# `gateway.reservation_ttl_seconds` (config/schema.py holds its default; ledger/client.py reads
# it as DEFAULT_RESERVATION_TTL_S, as this module must not import the config, which imports the
# ledger).
# How long a settled id (and an expiry's charge) is remembered: a retried settle within it is
# a duplicate, and an expiry charge waits this long for a late settle to correct it.
SETTLE_MEMORY_MS = 24 * 3600 * 1000
# An admit must run this long before its caller gives up for the reservation to be made, so a
# reply already on its way still arrives in time (server time lagging the guess helps too).
LATE_MARGIN_MS = 500
# A breaker probe that never reported is forgotten after this long.
BREAKER_PROBE_TTL_MS = 30_000
# A tenant counts as using an upstream for a day after it last did (as long as the cache keeps
# an untouched breaker): while two do, one alone cannot open the breaker.
BREAKER_SEEN_FOR_MS = 86_400_000
# A closed breaker with no failures, checked this recently in this process, is not asked again.
BREAKER_LOCAL_CLOSED_S = 0.25

# -- limits -----------------------------------------------------------------------------------

# Calls again after a 'clock' (wrong window guess), 'late' (read in time, so the clock guess was
# off) or 'windows' (an expired hold needs more windows named) reply.
SCRIPT_ATTEMPTS = 5
# Grant calls of one shared limit before its server's clock is taken to keep crossing a window.
GRANT_ATTEMPTS = 3
# More scopes than a config has principals means scopes are built per call (tests, tools):
# then the plans are dropped and built again rather than kept without bound.
MAX_PLANS = 4096
# A grant is at least this fraction of the limit (1/20 = 5%), so a busy hierarchy asks about 20
# times a window, not once a request.
GRANT_CHUNK_DIVISOR = 20
# The output-length sample of a route (estimators.py): replies kept, the quantile reserved,
# how often the server recomputes it, and the votes a route's consensus needs.
ESTIMATOR_SAMPLES_KEPT = 1000
ESTIMATOR_QUANTILE = 0.95
ESTIMATOR_RECOMPUTE_EVERY = 16
ESTIMATOR_MIN_TENANTS = 3
