-- estimator_record.lua: add one completed output length to a route's shared sample, keep its p95.
--
-- KEYS[1]  hc:{est:<route>}:samples  list  most recent output lengths, newest first
-- KEYS[2]  hc:{est:<route>}:stats    hash  {q: current quantile value, n: sample size, c: count}
--
-- ARGV[1]  output tokens of a completed, NOT truncated response (truncated ones would drag the
--          estimate down, cause more truncation, and spiral)
-- ARGV[2]  samples kept (e.g. 1000)
-- ARGV[3]  quantile, as a fraction (e.g. 0.95)
-- ARGV[4]  recompute the quantile every this many samples (it is always recomputed while the
--          sample is smaller than this many times ten)
--
-- Units: tokens.
--
-- Reply:   {quantile_value, sample_size}
--
-- Does not use lib.lua; time plays no part. Both keys share the route's hash tag.

local n, keep, q, every = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('LPUSH', KEYS[1], n)
redis.call('LTRIM', KEYS[1], 0, keep - 1)
local count = redis.call('HINCRBY', KEYS[2], 'c', 1)
local size = redis.call('LLEN', KEYS[1])
local value = tonumber(redis.call('HGET', KEYS[2], 'q') or '0')
if size < every * 10 or count % every == 0 or value == 0 then
  local xs = redis.call('LRANGE', KEYS[1], 0, -1)
  for i = 1, #xs do xs[i] = tonumber(xs[i]) end
  table.sort(xs)
  value = xs[math.max(math.ceil(q * #xs), 1)]
  redis.call('HSET', KEYS[2], 'q', value, 'n', size)
else
  redis.call('HSET', KEYS[2], 'n', size)
end
return {value, size}
