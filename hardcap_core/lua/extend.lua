-- extend.lua: grow a live reservation by up to N output tokens, or refuse; refresh its expiry.
--
-- KEYS[1..9] the ledger keys every script takes (lib.lua: reserved, res, exp, rl, expired,
--            expired_at, live, usage, restored)
-- KEYS[10..] hc:{root}:u:<window spec>:<window id>  hash  budget field -> used
--
-- ARGV[1]  reservation id
-- ARGV[2]  output tokens wanted (0 only refreshes the expiry: a heartbeat for slow streams)
-- ARGV[3]  least output tokens worth granting (grant = min(wanted, what fits) if >= this)
-- ARGV[4]  reservation TTL, ms, counted from now
-- ARGV[5]  JSON: {b: [[field, dim, limit, used_key_index]...], w: [[start_ms, end_ms, spec]...],
--                 xm: ms an expiry charge is remembered,
--                 ag: 1 to answer 'grant' where a shared row's allowance (lib.lua, limits_of)
--                     holds less than `want`}
--
-- Units: tokens; money in integer nano-USD; times in epoch ms from the server's TIME.
--
-- Reply, granted:   {'ok', now_ms, granted, output_reserved_total, <budget state>}
-- Reply, refused:   {'no', now_ms, what, <budget state>}  what: the budget field that is full,
--                   or 'l:<lease id>:tokens|usd' when the request's lease cannot (or it ended),
--                   or '<level tag>:tpm' when a tokens-per-minute window cannot hold the
--                   least extension (lib.lua: the tpm windows); the stream then stops within
--                   what it holds, as at a full budget
-- Reply, grant:    {'grant', now_ms, row, need, ...}  (ag set: those shared rows lack `need`
--                                      for `want`; nothing changes: get more, call again)
-- Reply, gone:      {'gone', now_ms}   the reservation expired and was reclaimed (or settled):
--                                      it is NOT recreated, the caller must stop
-- Reply, bad clock: {'clock', now_ms}
-- Reply, windows:   {'windows', now_ms, spec...}  (an expired hold needs these windows named)
-- <budget state> = n, then n pairs (remaining, reset_ms) in the order of ARGV b

local rid, want, least, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
least = math.max(math.min(least, want), 1)  -- never ask for more than is wanted
local spec = cjson.decode(ARGV[5])
local now = now_ms()
if not windows_current(spec.w, now) then return {'clock', now} end
local used_keys = used_keys_from(10)
local missing = reclaim(now, spec, used_keys)
if missing then return needs_windows(now, missing) end

local raw = redis.call('HGET', KEYS[K_RES], rid)
if not raw then return {'gone', now} end
local rec = record_of(raw)

local used, reserved = read_counts(used_keys, spec.b)
local cap = limits_of(used_keys, spec.b)  -- a shared row: this hierarchy's allowance
local grant, tight, short = want, nil, nil
-- Under a lease the stream draws from the lease: its room there, and the lease's hold counts as
-- room on each budget it holds. A lease that ended grants nothing more.
local lease = rec.L and lease_get(rec.L, now)
if rec.L then
  local room, idle, what = 0, 0, 'l:' .. rec.L .. ':tokens'
  if lease then room, idle, what = lease_room(lease, 0, 0, rec.po) end
  if room < grant then grant, tight = math.max(room, 0), what end
end
for i, b in ipairs(spec.b) do
  local per = per_output(b[2], rec.po)
  if per > 0 then
    local room = cap[i] - used[i] - reserved[i] + (lease and lease.h[b[1]] or 0)
    local fit = math.floor(room / per)
    if fit < grant then grant, tight = math.max(fit, 0), i end
    if spec.ag and b[5] and fit < want then
      short = short or {'grant', now}
      short[#short + 1] = i
      short[#short + 1] = (want - fit) * per
    end
  end
end
if short then return short end

-- Tokens per minute: the extension must fit in each level's window, like a new request.
local windows = {}
if grant > 0 then
  local sec = math.floor(now / 1000)
  for _, lvl in ipairs(rec.r or {}) do
    if lvl[3] then
      local w = tpm_read(lvl[1], sec)
      local room = lvl[2] - w.live - w.ended
      if room < grant then
        grant = math.max(room, 0)
        tight = lvl[1] .. ':tpm'
      end
      windows[#windows + 1] = lvl
    end
  end
end

if want > 0 and grant < least then
  local what = tight
  if type(tight) == 'number' then what = spec.b[tight][1] end
  local reply = {'no', now, what}
  return append_budget_state(reply, spec.b, spec.w, used, reserved, now)
end

if grant > 0 then
  for i, b in ipairs(spec.b) do
    local a = grant * per_output(b[2], rec.po)
    local c = lease and lease_draw(lease, b[1], a) or 0
    if c > 0 then rec.lc[b[1]] = (rec.lc[b[1]] or 0) + c end
    if a - c ~= 0 then redis.call('HINCRBY', KEYS[K_RESERVED], b[1], a - c) end
    reserved[i] = reserved[i] + a - c
  end
  if lease then
    lease.rt = lease.rt + grant
    lease.ru = lease.ru + grant * rec.po
    lease_save(lease)
  end
  for _, lvl in ipairs(windows) do
    redis.call('HINCRBY', KEYS[K_RL], lvl[1] .. ':tl', grant)
    lvl[3] = lvl[3] + grant
  end
  rec.o = rec.o + grant
  redis.call('HSET', KEYS[K_RES], rid, cjson.encode(rec))
end
if #windows > 0 then keep_alive(ttl + RATE_KEY_GRACE_MS, KEYS[K_RL]) end
redis.call('ZADD', KEYS[K_EXP], 'XX', now + ttl, rid)
keep_alive(ttl + HOLD_KEY_GRACE_MS, KEYS[K_RESERVED], KEYS[K_RES], KEYS[K_EXP], KEYS[K_LIVE])

local reply = {'ok', now, grant, rec.o}
return append_budget_state(reply, spec.b, spec.w, used, reserved, now)
