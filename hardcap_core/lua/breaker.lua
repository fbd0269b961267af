-- breaker.lua: one upstream's circuit breaker, shared by every gateway instance.
--
-- KEYS[1]  hc:{brk:<upstream>}  hash. Version 1's fields, which every version reads and writes:
--            s: state (c closed | o open | h half-open), f: consecutive failures,
--            t: when it opened (ms), p: probes in flight, pt: when the last probe began (ms)
--          Version 2 adds:
--            v: 2
--            w: the first tenant whose failure counted in this run ('' none). A run of
--               failures begins at a success or at the opening.
--            n: how many tenants' failures counted in this run, capped at 2 (2 at once for
--               a failure no tenant shaped)
--            nf: f when this version last wrote the hash. Another f means a version-1
--                gateway counted failures or a success since, of tenants it does not name:
--                w and n are dropped, and only this version's reports count towards n again.
--            a, at, b, bt: the two tenants that last used this upstream (distinct, a the
--               later) and when (ms): two within ARGV[7] make two tenants' evidence needed.
--
-- ARGV[1]  op: 'check' (may a request go to this upstream now?), 'ok' (one succeeded),
--          'fail' (one failed in a way that counts: 429, 5xx, a timeout it did not ask for,
--          no connection), 'pass' (one ended in a way that says nothing of the upstream: its
--          own fault; frees the probe slot it held)
-- ARGV[2]  failures that open it
-- ARGV[3]  cooldown, ms: how long it stays open before it lets probes through
-- ARGV[4]  probes let through at once while half-open
-- ARGV[5]  ms after which a probe that never reported is forgotten (its instance died)
-- ARGV[6]  the request's tenant; '' with 'fail': a failure no tenant shaped (evidence alone)
-- ARGV[7]  ms a tenant counts as using this upstream after it was last seen
--
-- Units: times in epoch ms from the server's TIME.
--
-- Reply: {allowed (1|0; 1 for 'ok', 'fail' and 'pass'), state after ('closed'|'open'|
--         'half_open'), consecutive failures, ms until it may be probed (0 unless open),
--         tenants whose failures counted in this run (0-2), tenants needed to open it (1|2)}
--
-- Closed: every request goes; `failures` consecutive failures open it, if they came from as
-- many tenants as are needed: 2 when two tenants used the upstream within ARGV[7], else 1.
-- Open: nothing goes until the cooldown has passed; then half-open: up to `probes` requests at
-- once go, one success closes it; failures open it again once they came from as many tenants
-- as are needed (till then each failed probe frees its slot for the next).

local op, tenant = ARGV[1], ARGV[6]
local threshold, cooldown = tonumber(ARGV[2]), tonumber(ARGV[3])
local max_probes, probe_ttl, seen_for = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local f = redis.call('HMGET', KEYS[1], 's', 'f', 't', 'p', 'pt',
                     'v', 'w', 'n', 'nf', 'a', 'at', 'b', 'bt')
local state, fails = f[1] or 'c', tonumber(f[2] or '0')
local opened, probes, probe_at = tonumber(f[3] or '0'), tonumber(f[4] or '0'), tonumber(f[5] or '0')
local first, named = f[7] or '', tonumber(f[8] or '0')
local a, a_at, b, b_at = f[10] or '', tonumber(f[11] or '0'), f[12] or '', tonumber(f[13] or '0')
local names = {c = 'closed', o = 'open', h = 'half_open'}

if f[6] ~= '2' or tonumber(f[9] or '-1') ~= fails or fails == 0 then
  first, named = '', 0  -- no run, or one a version-1 gateway changed: its tenants are unknown
end
if tenant ~= '' then
  if tenant ~= a then b, b_at, a = a, a_at, tenant end
  a_at = now
end
local need = 1
if b ~= '' and now - b_at < seen_for then need = 2 end

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
  state, fails, probes, first, named = 'c', 0, 0, '', 0
elseif op == 'fail' then
  fails = fails + 1
  if tenant == '' then
    named = 2
  elseif named == 0 then
    first, named = tenant, 1
  elseif tenant ~= first then
    named = 2
  end
  if named >= need and (state == 'h' or (state == 'c' and fails >= threshold)) then
    state, opened, probes, first, named = 'o', now, 0, '', 0
  elseif state == 'h' and probes > 0 then
    probes = probes - 1
  end
elseif op == 'pass' then
  if state == 'h' and probes > 0 then probes = probes - 1 end
end

redis.call('HSET', KEYS[1], 's', state, 'f', fails, 't', opened, 'p', probes, 'pt', probe_at,
           'v', 2, 'w', first, 'n', named, 'nf', fails, 'a', a, 'at', a_at, 'b', b, 'bt', b_at)
-- A breaker nobody touched for a while is forgotten (closed).
redis.call('PEXPIRE', KEYS[1], BREAKER_IDLE_MS)
local wait = 0
if state == 'o' then wait = math.max(opened + cooldown - now, 0) end
return {allowed, names[state], fails, wait, named, need}
