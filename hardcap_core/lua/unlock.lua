-- unlock.lua: release a lease only if it is still the caller's.
--
-- KEYS[1]  the lease key (a string holding its owner's id), e.g. hc:{root}:rollup
-- ARGV[1]  the caller's owner id
--
-- Reply: 1 released, 0 not the caller's (it expired and another took it, or it is gone)
--
-- A lease that outlived its TTL may belong to someone else by now: deleting it blindly would
-- let a third holder in beside the second.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
