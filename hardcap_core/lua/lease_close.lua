-- lease_close.lua: read a lease, or close it: its unspent hold goes back (lib.lua: lease_end)
-- to its parent if that lives, else to the hierarchy's budgets, in this script.
--
-- KEYS[1..9] the ledger keys every script takes (lib.lua: reserved, res, exp, rl, expired,
--            expired_at, live, usage, restored)
--
-- ARGV[1]  lease id
-- ARGV[2]  1 to close the lease, 0 only to read it
-- ARGV[3]  the caller's tenant id
-- ARGV[4]  the caller's user id ('' : none)
--
-- Units: tokens; money in integer nano-USD; times in epoch ms from the server's TIME.
--
-- Reply:            {'ok', now_ms, expires_at_ms, tokens, usd, spent_tokens, spent_usd,
--                    held_tokens, held_usd, depth, parent}  tokens / usd: the envelope, -1 where
--                   it names none; spent: charged by its requests' settles and its ended
--                   sub-leases; held: its live requests' and sub-leases' holds; parent: '' if none.
--                   Closing, these are the lease's last state.
-- Reply, no lease:  {'nolease', now_ms}   not a live lease of this caller (another tenant's, a
--                                         user's that is not this one, closed or expired)
-- Reply, restore:   {'hydrate', now_ms}
--
-- Reading does not reclaim: an expired lease reads as gone at once (lib.lua: lease_get) and its
-- hold goes back with the next script that reclaims.

local id, close, tn, us = ARGV[1], ARGV[2] == '1', ARGV[3], ARGV[4]
local now = now_ms()
if not restored() then return {'hydrate', now} end
local l = lease_get(id, now)
if not l or not lease_owned(l, tn, us) then return {'nolease', now} end
if close then lease_end(l, now) end
return {'ok', now, l.e, l.et or -1, l.eu or -1, l.ut, l.uu, l.rt, l.ru, l.dp, l.p or ''}
