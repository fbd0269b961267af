-- allowance_grant.lua: a limit that spans tenants (a route's or an upstream's) hands out its
-- capacity in allowances to the tenant hierarchies' slots, or takes back what one returns.
-- Runs in the shared limit's own slot ({up:<name>}, {rt:<name>}); allowance_credit.lua then adds
-- a grant to the hierarchy's own slot, where admit and extend check it (lib.lua, limits_of).
--
-- KEYS[1..n] hc:{<shared tag>}:g:<window spec>:<window id>  hash, one per window the rows use:
--              <field> -> allowance granted in total in that window (never above the limit)
--              <field>|<root tag> -> how much of it that hierarchy holds
--
-- ARGV[1]  'grant' | 'return'
-- ARGV[2]  the hierarchy's root tag (t:acme, o:acme)
-- ARGV[3]  JSON: {w: [[start_ms, end_ms]...] one per KEYS,
--                 b: [[field, limit, amount, key index]...]}  amount: wanted, or given back
--
-- Units: tokens, requests or nano-USD, as the row's budget counts; times in epoch ms from TIME.
--
-- Reply, grant:     {'ok', now_ms, given per row..., k, holder...}: given = min(amount, what is
--                   left of the limit in the window); where some row gave less than asked,
--                   the k (<= GRANT_HOLDERS, consts.lua) other hierarchies holding the most
--                   of it (root tags), whose unused allowance the caller may release
--                   (allowance_release.lua) and return
-- Reply, return:    {'ok', now_ms, taken back per row...}: at most what the hierarchy holds
-- Reply, bad clock: {'clock', now_ms}  (a window named does not contain now: nothing changes)
--
-- Invariant: granted <= limit for every field and window after every call, since this is the
-- only script that adds to granted, and it adds at most limit - granted. The sum of all
-- hierarchies' allowances of a window is at most granted (a credit adds only what a grant
-- gave; a release takes back before its return adds back here).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mode, root = ARGV[1], ARGV[2]
local spec = cjson.decode(ARGV[3])
for _, w in ipairs(spec.w) do
  if now < w[1] or now >= w[2] then return {'clock', now} end
end

local reply, short = {'ok', now}, {}
for _, row in ipairs(spec.b) do
  local field, limit, want, key = row[1], row[2], math.max(row[3], 0), KEYS[row[4]]
  local mine = field .. '|' .. root
  local n = 0
  if mode == 'grant' then
    local granted = tonumber(redis.call('HGET', key, field) or '0')
    n = math.max(math.min(want, limit - granted), 0)
    if n < want then short[field] = key end
  else
    n = math.min(want, tonumber(redis.call('HGET', key, mine) or '0'))
    n = -math.max(n, 0)
  end
  if n ~= 0 then
    redis.call('HINCRBY', key, field, n)
    redis.call('HINCRBY', key, mine, n)
  end
  reply[#reply + 1] = math.abs(n)
end
for i, w in ipairs(spec.w) do
  -- A window's grants matter until it ends, and a while more for a late return.
  redis.call('PEXPIREAT', KEYS[i], w[2] + GRANT_GRACE_MS, 'NX')
end

-- Who else holds what a short row lacks: the largest holders first.
local holders, seen = {}, {}
for field, key in pairs(short) do
  local all = redis.call('HGETALL', key)
  local prefix = field .. '|'
  for j = 1, #all, 2 do
    local name = all[j]
    if string.sub(name, 1, #prefix) == prefix then
      local who, n = string.sub(name, #prefix + 1), tonumber(all[j + 1])
      if who ~= root and n > 0 and not seen[who] then
        seen[who] = true
        holders[#holders + 1] = {who, n}
      end
    end
  end
end
table.sort(holders, function(a, b) return a[2] > b[2] end)
if mode == 'grant' then
  local k = math.min(#holders, GRANT_HOLDERS)
  reply[#reply + 1] = k
  for j = 1, k do reply[#reply + 1] = holders[j][1] end
end
return reply
