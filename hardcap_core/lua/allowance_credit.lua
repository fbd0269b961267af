-- allowance_credit.lua: add what allowance_grant.lua gave to a hierarchy's allowance of a limit
-- that spans tenants, in the hierarchy's own slot, where admit and extend check it.
--
-- KEYS[1..n] hc:{root}:u:<window spec>:<window id>  hash  the used key of each window the rows
--            use: '<field>:a' -> this hierarchy's allowance of that shared row in the window
--
-- ARGV[1]  JSON: {b: [[field, amount, key index, window end ms]...]}
--
-- Reply: {'ok', allowance per row after the credit...}
--
-- The allowance lives in the window's used key, so it ends with its window (a new window starts
-- at 0 and asks again). A credit that lands after its window ended is dead capacity: it can
-- only strand, never add to another window.

local reply = {'ok'}
for _, row in ipairs(cjson.decode(ARGV[1]).b) do
  local key = KEYS[row[3]]
  reply[#reply + 1] = redis.call('HINCRBY', key, row[1] .. ':a', row[2])
  redis.call('PEXPIREAT', key, row[4] + USED_KEY_GRACE_MS, 'NX')  -- as lib.lua's charge
end
return reply
