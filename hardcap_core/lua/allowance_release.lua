-- allowance_release.lua: take back the unused part of a hierarchy's allowances of limits that
-- span tenants, so that the caller returns it to the shared limit (allowance_grant.lua 'return')
-- and another hierarchy can be granted it.
--
-- KEYS[1]    hc:{root}:reserved  hash  budget field -> amount held by live holds
-- KEYS[2..n] hc:{root}:u:<window spec>:<window id>  hash  the used key of each window the rows
--            use: field -> used, '<field>:a' -> the allowance
--
-- ARGV[1]  JSON: {b: [[field, key index, most]...]}  most: the most to take (absent: all)
--
-- Reply: {'ok', taken per row...}: taken = allowance - used - reserved, at least 0, at most
-- `most`; what is
-- used and what live holds reserve stays, so the holds in flight stay inside the allowance.
-- Taken here first and returned after: a failure between the two strands capacity until the
-- window ends, and never lets the sum of allowances pass what was granted.

local reply = {'ok'}
for _, row in ipairs(cjson.decode(ARGV[1]).b) do
  local field, key = row[1], KEYS[row[2] + 1]
  local v = redis.call('HMGET', key, field .. ':a', field)
  local held = tonumber(redis.call('HGET', KEYS[1], field) or '0')
  local free = tonumber(v[1] or '0') - tonumber(v[2] or '0') - held
  local n = math.max(free, 0)
  if row[3] then n = math.min(n, row[3]) end
  if n > 0 then redis.call('HINCRBY', key, field .. ':a', -n) end
  reply[#reply + 1] = n
end
return reply
