-- consts.lua: the lifetimes, limits and record versions every script names.
--
-- Not a script of its own: hardcap_core/ledger/scripts.py prepends this file to every script
-- (before lib.lua, for the ledger scripts), so each value is named once, here. The Python side
-- names its own (what it passes in ARGV: reservation TTL, settle memory, queue tickets) in
-- hardcap_core/ledger/; these are the ones only the scripts use.
--
-- Units: times in ms; counts in entries. Changing a lifetime changes how long a key lives on
-- the server, never what it holds: a previous release's scripts beside these keep working.

local MINUTE_MS = 60000           -- a requests-per-minute window
local DAY_MS = 86400000
-- A used key (hc:{root}:u:...) outlives its window by this, for late reads (usage, the
-- rollup's check); then it expires by itself. Allowances live in the same keys.
local USED_KEY_GRACE_MS = DAY_MS
-- Keys that hold reservations, leases and queue tickets outlive their longest hold by this,
-- so they vanish by themselves once traffic stops (every hold in them has expired by then).
local HOLD_KEY_GRACE_MS = MINUTE_MS
-- The rate-limit hash (rpm and tpm windows) outlives its last hold or ended tokens by this:
-- the 60 s window they count in, and a minute more.
local RATE_KEY_GRACE_MS = 2 * MINUTE_MS
-- An expiry record (what expiry charged) outlives its settle memory by this.
local EXPIRED_KEY_GRACE_MS = MINUTE_MS
-- A shared limit's grants (allowance_grant.lua) matter until their window ends; an hour more
-- for a late return.
local GRANT_GRACE_MS = 3600000
-- A circuit breaker nobody touched for this long is forgotten (closed).
local BREAKER_IDLE_MS = DAY_MS
-- Retry hint of a 'busy' refusal (holds in flight stand in the way) and of a tpm window that
-- live holds alone fill: they end when their streams settle, so ask again in a second.
local BUSY_RETRY_MS = 1000
-- A usage stream is trimmed by the rollup once its records are in the durable ledger. This cap
-- only keeps a cache whose rollup stopped from filling up: about 200 MB of records per
-- hierarchy, more than a day of records at 10 requests a second.
local USAGE_MAXLEN = 1000000
-- At most this many expired holds reclaimed, and expiry records forgotten, per call: one call
-- never stalls the server; the next call takes the rest.
local RECLAIM_BATCH = 256
local FORGET_BATCH = 64
-- Hierarchies named to a short grant (allowance_grant.lua) as holders to release from.
local GRANT_HOLDERS = 16
-- Second buckets of a tokens-per-minute window (lib.lua: the tpm windows): 60 s and the one
-- being counted.
local TPM_SLOTS = 61

-- Record versions (lib.lua: the records). A reservation record (K_RES) and an expiry record
-- (K_EXPIRED) carry v; a record without v is version 1, what the release before this one
-- wrote; version 2 adds only v. A reader takes any version: changes are additive (new
-- optional fields), so a previous release's scripts read what this one writes, and this one
-- reads what a newer one writes.
local RESERVATION_VERSION = 2
-- A usage record's format is its first integer (hardcap_core/rollup/records.py reads 1-4):
-- 2 without a user or lease, 3 with a user, 4 under a lease. A deploy that uses neither writes
-- format 2 exactly, which every rollup since format 2 reads.
local USAGE_FORMAT = 2
local USAGE_FORMAT_USER = 3
local USAGE_FORMAT_LEASE = 4
