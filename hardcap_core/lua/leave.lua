-- leave.lua: a waiter gives up its place in the tenant's admission queue.
--
-- KEYS[1..9] the ledger keys every script takes (lib.lua: reserved, res, exp, rl, expired,
--            expired_at, live, usage, restored)
-- KEYS[10]   hc:{root}:q:<tenant>   zset  the tenant's admission queue (admit.lua)
-- KEYS[11]   hc:{root}:qx:<tenant>  zset  when each ticket lapses
--
-- ARGV[1]  the waiting reservation id
-- ARGV[2]  JSON: the reservation's meta (lib.lua: meta), for the usage record of the refusal
-- ARGV[3]  the refusal's outcome for that record ('busy': it waited as long as it could;
--          'client_gone': its client disconnected while it waited)
--
-- Reply: {'ok', now_ms, 1 if the id was waiting, else 0}
--
-- The waiter leaves at once rather than letting its ticket lapse: while it stands first in line,
-- nobody behind it is admitted. The refusal is recorded here, once, not on every 'queued' reply;
-- like every refusal it costs nothing (no tokens, no cost).

local rid = ARGV[1]
local now = now_ms()
local was = redis.call('ZREM', KEYS[10], rid)
redis.call('ZREM', KEYS[11], rid)
if was == 1 then
  append_record('r', rid, cjson.decode(ARGV[2]), {oc = ARGV[3], n = 1, t0 = now})
end
return {'ok', now, was}
