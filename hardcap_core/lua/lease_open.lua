-- lease_open.lua: open a lease, a hold of an envelope (tokens and/or nUSD) on every budget of
-- the caller's scope for a TTL, out of a parent lease when one is named (lib.lua: leases).
--
-- KEYS[1..9] the ledger keys every script takes (lib.lua: reserved, res, exp, rl, expired,
--            expired_at, live, usage, restored)
-- KEYS[10..] hc:{root}:u:<window spec>:<window id>  hash  budget field -> used
--
-- ARGV[1]  lease id (unique; the caller makes it)
-- ARGV[2]  JSON: {b: [[field, dim, limit, used_key_index[, shared]]...],
--                 w: [[start_ms, end_ms, spec]...], xm: ms an expiry charge is remembered,
--                 et: envelope tokens (absent: none), eu: envelope nUSD (absent: none),
--                 ttl: ms the lease lives, p: parent lease id (absent: none),
--                 md: the deepest a lease may be (1: no sub-leases),
--                 tn: owner tenant id, us: owner user id ('' or absent: any user of the tenant)}
--
-- Units: tokens; money in integer nano-USD; times in epoch ms from the server's TIME.
--
-- Reply, opened:    {'ok', now_ms, expires_at_ms, <budget state>}
-- Reply, refused:   {'exceeded'|'never', now_ms, what, retry_after_ms, <budget state>}: `what` is
--                   the budget field (or 'l:<parent>:tokens|usd') the envelope does not fit
--                   beside what is used and held ('never': not even with nothing used)
-- Reply, no parent: {'nolease', now_ms}   the parent is not a live lease of this owner
-- Reply, too deep:  {'depth', now_ms, md}
-- Reply, dims:      {'dims', now_ms, 'tokens'|'usd'}  the parent limits a dimension this lease
--                                          does not name
-- Reply, taken id:  {'exists', now_ms}
-- Reply, bad clock / windows / restore: as admit.lua
--
-- A token envelope holds its amount on every token budget ('in', 'out', 'tot': whichever the
-- requests spend) and a nUSD envelope on every cost budget; rows of limits that span tenants
-- (b[5]) and request counts are not held: each request is checked against them as it comes.
-- Under a parent the envelope draws from the parent's hold first, as a request does, and counts
-- as held at the parent's level; its expiry is at most the parent's.

local id = ARGV[1]
local spec = cjson.decode(ARGV[2])
local now = now_ms()
if not windows_current(spec.w, now) then return {'clock', now} end
if not restored() then return {'hydrate', now} end
local used_keys = used_keys_from(10)
local missing = reclaim(now, spec, used_keys)
if missing then return needs_windows(now, missing) end
if redis.call('HEXISTS', KEYS[K_RES], LEASE .. id) == 1 then return {'exists', now} end

local expires = now + spec.ttl
local parent, depth = nil, 1
if spec.p then
  parent = lease_get(spec.p, now)
  if not parent or not lease_owned(parent, spec.tn, spec.us) then return {'nolease', now} end
  depth = parent.dp + 1
  if depth > spec.md then return {'depth', now, spec.md} end
  if parent.et and not spec.et then return {'dims', now, 'tokens'} end
  if parent.eu and not spec.eu then return {'dims', now, 'usd'} end
  expires = math.min(expires, parent.e)
elseif spec.md < 1 then
  return {'depth', now, spec.md}
end

local used, reserved = read_counts(used_keys, spec.b)
local cap = limits_of(used_keys, spec.b)
local function refuse(kind, what, retry)
  local reply = {kind, now, what, retry}
  return append_budget_state(reply, spec.b, spec.w, used, reserved, now)
end

-- At the parent's level the envelope is one more hold.
if parent then
  local fits = {{parent.et, parent.ut, parent.rt, spec.et, 'tokens'},
                {parent.eu, parent.uu, parent.ru, spec.eu, 'usd'}}
  for _, x in ipairs(fits) do
    if x[1] and x[4] > x[1] - x[2] - x[3] then
      local kind = (x[4] > x[1]) and 'never' or 'exceeded'
      local retry = (kind == 'never') and 0 or BUSY_RETRY_MS
      return refuse(kind, 'l:' .. parent.id .. ':' .. x[5], retry)
    end
  end
end

-- What the envelope holds on each budget row of the scope.
local amounts = {}
for i, b in ipairs(spec.b) do
  local a = 0
  if not b[5] then
    if b[2] == 'usd' then a = spec.eu or 0
    elseif b[2] ~= 'req' then a = spec.et or 0 end
  end
  amounts[i] = a
  if a > 0 then
    if a > cap[i] then return refuse('never', b[1], 0) end
    local room = cap[i] - used[i] - reserved[i] + (parent and parent.h[b[1]] or 0)
    if a > room then return refuse('exceeded', b[1], spec.w[b[4]][2] - now) end
  end
end

local l = {v = RESERVATION_VERSION, lease = 1, id = id, e = expires, t = now, et = spec.et,
           eu = spec.eu, ut = 0, uu = 0, rt = 0, ru = 0, h = {}, a = {}, c = {}, p = spec.p,
           dp = depth, tn = spec.tn or '', us = spec.us or ''}
for i, b in ipairs(spec.b) do
  local a = amounts[i]
  if a > 0 then
    local c = parent and lease_draw(parent, b[1], a) or 0
    if a - c ~= 0 then redis.call('HINCRBY', KEYS[K_RESERVED], b[1], a - c) end
    reserved[i] = reserved[i] + a - c
    l.h[b[1]], l.a[b[1]], l.c[b[1]] = a, a, c
  end
end
if parent then
  parent.rt = parent.rt + (spec.et or 0)
  parent.ru = parent.ru + (spec.eu or 0)
  lease_save(parent)
end
lease_save(l)
redis.call('ZADD', KEYS[K_EXP], expires, LEASE .. id)
keep_alive(spec.ttl + HOLD_KEY_GRACE_MS, KEYS[K_RESERVED], KEYS[K_RES], KEYS[K_EXP])

local reply = {'ok', now, expires}
return append_budget_state(reply, spec.b, spec.w, used, reserved, now)
