-- config_version.lua: publish a config version to one tenant hierarchy, so that every gateway
-- instance learns in its next admit (admit.lua: spec cv, KEYS[13]) that its copy is older.
--
-- KEYS[1]  hc:{root}:cfgv  string  the newest version published for this hierarchy
-- ARGV[1]  the version (an integer: the config table's version after the change)
--
-- Units: a version is a counter, never a time.
-- Reply: the version the key holds afterwards. It only moves forward: publishing an older
-- version (a slow admin call overtaken by a newer one) changes nothing. The key has no expiry:
-- a version forgotten would let an instance with a stale copy (a revoked key) go unnoticed
-- until its poll of the table.

local v = tonumber(ARGV[1])
local held = tonumber(redis.call('GET', KEYS[1]) or '0')
if v > held then
  redis.call('SET', KEYS[1], ARGV[1])
  return v
end
return held
