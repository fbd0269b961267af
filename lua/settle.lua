-- settle.lua: release a reservation and charge what was really used. Idempotent by reservation id.
--
-- KEYS[1]  hc:{root}:reserved   hash  budget field -> held amount
-- KEYS[2]  hc:{root}:res        hash  reservation id -> JSON record
-- KEYS[3]  hc:{root}:exp        zset  reservation id -> expiry, epoch ms
-- KEYS[4]  hc:{root}:rl         hash  rate-limit state (token buckets are corrected here)
-- KEYS[5]  hc:{root}:s:<reservation id>  string  marker: this reservation was settled
-- KEYS[6..] hc:{root}:u:<window spec>:<window id>  hash  budget field -> used
--
-- ARGV[1]  reservation id
-- ARGV[2]  input tokens actually used
-- ARGV[3]  output tokens actually used
-- ARGV[4]  how long to remember the settle for idempotency, ms
-- ARGV[5]  JSON: {b: [[field, dim, limit, used_key_index]...], w: [[start_ms, end_ms]...],
--                 pi/po: nUSD per input/output token}
--
-- Units: tokens; money in integer nano-USD; times in epoch ms from the server's TIME.
--
-- Reply, settled:   {'ok', now_ms, had_reservation (1|0), <budget state>}
--                   had_reservation is 0 when the reservation had already expired and been
--                   reclaimed: the real usage is charged all the same, since it was billed.
-- Reply, repeated:  {'dup', now_ms}   this id was settled before; nothing was charged again
-- Reply, bad clock: {'clock', now_ms}
-- <budget state> = n, then n pairs (remaining, reset_ms) in the order of ARGV b
--
-- Usage is charged to the window current at settle time. A token bucket is corrected by the
-- difference between what admission took and what was used, and may go negative: it then
-- refuses new requests until it refills.

local rid, inp, out, remember = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local spec = cjson.decode(ARGV[5])
local now = now_ms()
if not windows_current(spec.w, now) then return {'clock', now} end
if redis.call('EXISTS', KEYS[5]) == 1 then return {'dup', now} end

local had = 0
local raw = redis.call('HGET', KEYS[2], rid)
if raw then
  had = 1
  local rec = cjson.decode(raw)
  release(KEYS[1], rec)
  redis.call('HDEL', KEYS[2], rid)
  redis.call('ZREM', KEYS[3], rid)
  local delta = inp + out - rec.tb
  for _, lvl in ipairs(rec.r) do
    local tag, tpm = lvl[1], lvl[2]
    local f = redis.call('HMGET', KEYS[4], tag .. ':tb', tag .. ':tt')
    local tokens, last = tonumber(f[1] or tpm), tonumber(f[2] or now)
    tokens = math.min(tpm, tokens + math.max(now - last, 0) * tpm / 60000) - delta
    redis.call('HSET', KEYS[4], tag .. ':tb', math.min(tokens, tpm), tag .. ':tt', now)
  end
end

local used_keys = used_keys_from(6)
for _, b in ipairs(spec.b) do
  local a = amount(b[2], inp, out, spec.pi, spec.po)
  if a ~= 0 then redis.call('HINCRBY', used_keys[b[4]], b[1], a) end
end
-- A window's key outlives its window by a day (for late reads), then expires by itself.
for j, w in ipairs(spec.w) do
  redis.call('PEXPIREAT', used_keys[j], w[2] + 86400000, 'NX')
end
redis.call('SET', KEYS[5], 1, 'PX', remember)

local used, reserved = read_counts(KEYS[1], used_keys, spec.b)
local reply = {'ok', now, had}
return append_budget_state(reply, spec.b, spec.w, used, reserved, now)
