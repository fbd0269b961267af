-- usage.lua: read used, reserved and reset for each budget, after reclaiming expired reservations.
--
-- KEYS[1]  hc:{root}:reserved   hash  budget field -> held amount
-- KEYS[2]  hc:{root}:res        hash  reservation id -> JSON record
-- KEYS[3]  hc:{root}:exp        zset  reservation id -> expiry, epoch ms
-- KEYS[4..] hc:{root}:u:<window spec>:<window id>  hash  budget field -> used
--
-- ARGV[1]  JSON: {b: [[field, dim, limit, used_key_index]...], w: [[start_ms, end_ms]...]}
--
-- Units: tokens; money in integer nano-USD; times in epoch ms from the server's TIME.
--
-- Reply:            {'ok', now_ms, live_reservations, n, then n triples (used, reserved, reset_ms)}
-- Reply, bad clock: {'clock', now_ms}

local spec = cjson.decode(ARGV[1])
local now = now_ms()
if not windows_current(spec.w, now) then return {'clock', now} end
reclaim(KEYS[1], KEYS[2], KEYS[3], now)
local used, reserved = read_counts(KEYS[1], used_keys_from(4), spec.b)
local reply = {'ok', now, redis.call('ZCARD', KEYS[3]), #spec.b}
for i, b in ipairs(spec.b) do
  table.insert(reply, used[i])
  table.insert(reply, reserved[i])
  table.insert(reply, spec.w[b[4]][2] - now)
end
return reply
