-- estimator_vote.lua: record one tenant's output-length quantile on a route; keep the consensus.
--
-- KEYS[1]  hc:{est:<route>}:votes      hash  tenant -> its quantile (tenants with enough samples)
-- KEYS[2]  hc:{est:<route>}:consensus  hash  {q: upper median of the votes, t: number of votes}
--
-- ARGV[1]  tenant id
-- ARGV[2]  the tenant's current quantile, from its own sample (0 withdraws its vote)
--
-- Units: tokens.
--
-- Reply:   {consensus_value, votes}
--
-- The consensus is what a tenant whose own sample is still small reserves (with enough votes).
-- Each tenant has one vote however much traffic it sends, and the upper median of at least
-- three votes lies between two other tenants' values: no one tenant's flood of short (or long)
-- replies can shrink (or inflate) it past what the others' replies say.
-- Does not use lib.lua; time plays no part. Both keys share the route's hash tag.

local tenant, value = ARGV[1], tonumber(ARGV[2])
if value > 0 then
  redis.call('HSET', KEYS[1], tenant, value)
else
  redis.call('HDEL', KEYS[1], tenant)
end
local xs = redis.call('HVALS', KEYS[1])
for i = 1, #xs do xs[i] = tonumber(xs[i]) end
table.sort(xs)
local q = 0
if #xs > 0 then q = xs[math.floor(#xs / 2) + 1] end
redis.call('HSET', KEYS[2], 'q', q, 't', #xs)
return {q, #xs}
