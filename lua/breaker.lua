-- breaker.lua: one upstream's circuit breaker, shared by every gateway instance.
--
-- KEYS[1]  hc:{brk:<upstream>}  hash  s: state (c closed | o open | h half-open),
--                                     f: consecutive failures, t: when it opened (ms),
--                                     p: probes in flight, pt: when the last probe began (ms)
--
-- ARGV[1]  op: 'check' (may a request go to this upstream now?), 'ok' (one succeeded),
--          'fail' (one failed: 429, 5xx, timeout, connection error)
-- ARGV[2]  failures that open it
-- ARGV[3]  cooldown, ms: how long it stays open before it lets probes through
-- ARGV[4]  probes let through at once while half-open
-- ARGV[5]  ms after which a probe that never reported is forgotten (its instance died)
--
-- Units: times in epoch ms from the server's TIME.
--
-- Reply: {allowed (1|0; 1 for 'ok' and 'fail'), state after ('closed'|'open'|'half_open'),
--         consecutive failures, ms until it may be probed (0 unless open)}
--
-- Closed: every request goes; `failures` consecutive failures open it. Open: nothing goes
-- until the cooldown has passed; then half-open: up to `probes` requests at once go, one
-- success closes it, one failure opens it again for another cooldown.

local op = ARGV[1]
local threshold, cooldown = tonumber(ARGV[2]), tonumber(ARGV[3])
local max_probes, probe_ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local f = redis.call('HMGET', KEYS[1], 's', 'f', 't', 'p', 'pt')
local state, fails = f[1] or 'c', tonumber(f[2] or '0')
local opened, probes, probe_at = tonumber(f[3] or '0'), tonumber(f[4] or '0'), tonumber(f[5] or '0')
local names = {c = 'closed', o = 'open', h = 'half_open'}

if state == 'o' and now - opened >= cooldown then
  state, probes = 'h', 0
end
if state == 'h' and probes > 0 and now - probe_at >= probe_ttl then
  probes = 0  -- the probes in flight never reported: their instances are gone
end

local allowed = 1
if op == 'check' then
  if state == 'o' then
    allowed = 0
  elseif state == 'h' then
    if probes < max_probes then
      probes, probe_at = probes + 1, now
    else
      allowed = 0
    end
  end
elseif op == 'ok' then
  state, fails, probes = 'c', 0, 0
elseif op == 'fail' then
  fails = fails + 1
  if state == 'h' or (state == 'c' and fails >= threshold) then
    state, opened, probes = 'o', now, 0
  end
end

redis.call('HSET', KEYS[1], 's', state, 'f', fails, 't', opened, 'p', probes, 'pt', probe_at)
-- A breaker nobody touched for a day is forgotten (closed).
redis.call('PEXPIRE', KEYS[1], 86400000)
local wait = 0
if state == 'o' then wait = math.max(opened + cooldown - now, 0) end
return {allowed, names[state], fails, wait}
