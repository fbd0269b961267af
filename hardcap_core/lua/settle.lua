-- settle.lua: release a reservation and charge what was really used. Idempotent by reservation id.
--
-- KEYS[1..9] the ledger keys every script takes (lib.lua: reserved, res, exp, rl, expired,
--            expired_at, live, usage, restored)
-- KEYS[10]   hc:{root}:s:<reservation id>  string  marker: this reservation was settled
-- KEYS[11..] hc:{root}:u:<window spec>:<window id>  hash  budget field -> used
--
-- ARGV[1]  reservation id
-- ARGV[2]  input tokens actually used
-- ARGV[3]  output tokens actually used
-- ARGV[4]  how long to remember the settle for idempotency, ms
-- ARGV[5]  JSON: {b: [[field, dim, limit, used_key_index]...], w: [[start_ms, end_ms, spec]...],
--                 xm: ms an expiry charge is remembered, pi/po: nUSD per input/output token,
--                 c: the cost in nUSD when it is not inp * pi + out * po (input read from or
--                    written to the provider's prompt cache has prices of its own),
--                 u: the usage record's own fields: {m: meta (lib.lua), oc: outcome,
--                    est: 1 if the counts are the gateway's estimate, rs: reasoning tokens,
--                    ci: cached input tokens}}
--
-- Units: tokens; money in integer nano-USD; times in epoch ms from the server's TIME.
--
-- Reply, settled:   {'ok', now_ms, had_reservation (1|0), expiry_charged (1|0), <budget state>}
--                   had_reservation is 0 when the reservation had already expired and been
--                   reclaimed: the real usage is charged all the same, since it was billed.
--                   expiry_charged is 1 when that reclaim charged the hold (admitted with x = 1):
--                   this settle then charges only the difference between the real counts and
--                   that charge, per budget: in the same window a refund if the real usage was
--                   lower; in a later window only what exceeds it (never a refund into a window
--                   that was not charged).
-- Reply, repeated:  {'dup', now_ms}   this id was settled before; nothing was charged again
-- Reply, bad clock: {'clock', now_ms}
-- Reply, restore:   {'hydrate', now_ms}  (the counters are not in place: restore, call again)
-- <budget state> = n, then n pairs (remaining, reset_ms) in the order of ARGV b
--
-- Every settle that charges appends one usage record (lib.lua) with what it added: the real
-- counts, or after an expiry charge the difference to it (n = 0: the expiry record counted the
-- request). Usage is charged to the window current at settle time. Each tokens-per-minute window
-- drops the hold and counts the real input + output as ended now (lib.lua, tpm_release; after an
-- expiry, which counted the hold, only what the real count adds beyond it). Settle does not
-- reclaim others. A request under a lease (lib.lua: leases) gives back to the lease, while it
-- lives, what it drew from the lease's hold and did not spend; a lease that ended gets nothing.

local rid, inp, out, remember = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local spec = cjson.decode(ARGV[5])
local now = now_ms()
if not windows_current(spec.w, now) then return {'clock', now} end
if not restored() then return {'hydrate', now} end
if redis.call('EXISTS', KEYS[10]) == 1 then return {'dup', now} end

local had, charged_at_expiry = 0, 0
local t0, xi, xo, xusd = 0, 0, 0, 0  -- admitted at; what an expiry charged
local before = {}  -- budget field -> {amount expiry charged, used key it went to}
local under, late = nil, nil  -- a lease's request: its record, or its lease after an expiry
local raw = redis.call('HGET', KEYS[K_RES], rid)
if raw then
  had = 1
  local rec = record_of(raw)
  t0 = rec.t or 0
  release(rec)
  redis.call('HDEL', KEYS[K_RES], rid)
  redis.call('ZREM', KEYS[K_EXP], rid)
  tpm_release(rec.r, inp + out, now)
  under = rec.L and rec
else
  local xraw = redis.call('HGET', KEYS[K_EXPIRED], rid)
  if xraw then
    charged_at_expiry = 1
    local x = record_of(xraw)
    xi, xo, xusd = x.i, x.o, amount('usd', x.i, x.o, x.pi, x.po)
    for _, row in ipairs(x.c) do
      before[row[1]] = {amount(row[2], x.i, x.o, x.pi, x.po), row[3]}
    end
    tpm_late(x.r, inp + out - x.i - x.o, now)
    late = x.L
    redis.call('HDEL', KEYS[K_EXPIRED], rid)
    redis.call('ZREM', KEYS[K_EXPIRED_AT], rid)
  end
end

local cost = spec.c or amount('usd', inp, out, spec.pi, spec.po)
-- Under a lease: what it drew and did not spend goes back to the lease (lib.lua: leases);
-- after an expiry charge the lease counts what the real usage adds beyond it.
if under then lease_return(under, inp, out, cost, now) end
local ll = late and lease_get(late, now)
if ll then
  ll.ut, ll.uu = ll.ut + inp + out - xi - xo, ll.uu + cost - xusd
  lease_save(ll)
end
local used_keys = used_keys_from(11)
for _, b in ipairs(spec.b) do
  local key = used_keys[b[4]]
  local a = (b[2] == 'usd') and cost or amount(b[2], inp, out, spec.pi, spec.po)
  local prev = before[b[1]]
  if prev then
    a = a - prev[1]
    if prev[2] ~= key then a = math.max(a, 0) end
  end
  if a ~= 0 then redis.call('HINCRBY', key, b[1], a) end
end
-- A window's key outlives its window (for late reads), then expires by itself.
for j, w in ipairs(spec.w) do
  redis.call('PEXPIREAT', used_keys[j], w[2] + USED_KEY_GRACE_MS, 'NX')
end
redis.call('SET', KEYS[10], 1, 'PX', remember)
local u = spec.u or {}
append_record('s', rid, u.m, {
  oc = u.oc or 'completed', est = u.est or 0, n = 1 - charged_at_expiry,
  i = inp - xi, o = out - xo, rs = u.rs or 0, ci = u.ci or 0,
  usd = cost - xusd, t0 = t0})

local used, reserved = read_counts(used_keys, spec.b)
local reply = {'ok', now, had, charged_at_expiry}
return append_budget_state(reply, spec.b, spec.w, used, reserved, now)
