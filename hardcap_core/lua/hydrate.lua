-- hydrate.lua: put a hierarchy's counters back after the cache lost them, once.
--
-- KEYS[1..9] the ledger keys every script takes (lib.lua); this one sets K_RESTORED
-- KEYS[10..] hc:{root}:u:<window spec>:<window id>  hash  budget field -> used, one per window
--
-- ARGV[1]  JSON: {w: [[start_ms, end_ms, spec]...] the window of each used key,
--                 r: [[used_key_index, field, amount]...] what the durable ledger says was used,
--                 src: a note kept in the marker (where the amounts came from)}
--
-- Units: tokens; money in integer nano-USD; times in epoch ms from the server's TIME.
--
-- Reply, restored:  {'ok', now_ms, rows applied}
-- Reply, already:   {'done', now_ms}  another instance restored them first; nothing changes
-- Reply, bad clock: {'clock', now_ms} (a window the client named does not contain now)
--
-- The cache answers {'hydrate'} from admit, settle and usage until this has run, so no request
-- is admitted, and nothing charged, against counters that start from zero by accident. Many
-- instances may see that at once and all call this: the first one's amounts count, the others
-- change nothing.

local spec = cjson.decode(ARGV[1])
local now = now_ms()
if not windows_current(spec.w, now) then return {'clock', now} end
if restored() then return {'done', now} end
local used_keys = used_keys_from(10)
for _, row in ipairs(spec.r) do
  local w = spec.w[row[1]]
  charge(used_keys[row[1]], w[2], row[2], row[3])
end
redis.call('SET', KEYS[K_RESTORED], cjson.encode({t = now, src = spec.src or ''}))
return {'ok', now, #spec.r}
