-- admit.lua: check rate limits and every budget a request touches, then reserve its estimate.
--
-- KEYS[1..9] the ledger keys every script takes (lib.lua: reserved, res, exp, rl, expired,
--            expired_at, live, usage, restored)
-- KEYS[10]   hc:{root}:s:<reservation id>  string  set once this id was settled
-- KEYS[11]   hc:{root}:q:<tenant>   zset  the tenant's admission queue: waiting id -> when it
--                                          joined (ms) less 10^13 per priority class
-- KEYS[12]   hc:{root}:qx:<tenant>  zset  waiting id -> when its ticket lapses unless renewed, ms
-- KEYS[13]   hc:{root}:cfgv         string  the newest config version an admin change
--                                          published for this hierarchy (config_version.lua)
-- KEYS[14..] hc:{root}:u:<window spec>:<window id>  hash  budget field -> used, one key per window
--
-- ARGV[1]  reservation id (unique per request)
-- ARGV[2]  reservation TTL, ms (a live stream refreshes it with extend)
-- ARGV[3]  JSON: {b: [[field, dim, limit, used_key_index]...], w: [[start_ms, end_ms, spec]...],
--                 xm: ms an expiry charge is remembered for a late settle,
--                 r: [[level_tag, rpm_or_0, tpm_or_0]...], i: input tokens, o: output estimate,
--                 mo: least output worth admitting, pi/po: nUSD per input/output token,
--                 x: 1 to CHARGE the hold if it expires unsettled (0: return it to the tenant),
--                 na: not after: server ms past which this call must reserve nothing (0: none),
--                 lv: the scope's level tags (its live reservations are counted per level),
--                 q: ms a queue ticket lives unless this id calls again (0 or absent: this
--                    request does not wait; it is refused 'busy' where it would queue),
--                 qp: its class in the queue, 0-9: it waits ahead of every lower class,
--                 hr: output tokens kept free per live reservation on a budget, for the
--                     extends of the streams in flight (0 or absent: none),
--                 m: {rt, md, k, rq, tn, og, pv, us} (lib.lua: meta), kept on the reservation
--                    record for the usage record an expiry writes, and put on a refusal's,
--                 cv: the config version the caller's copy of the config is at (absent: not
--                     checked); KEYS[13] newer: nothing is reserved, the reply says 'config',
--                 nr: 1 to append no usage record for a refusal (the caller asks again at
--                     once with a smaller input: a count in place of the bound),
--                 ag: 1 to answer 'grant' where a shared row's allowance is short (lib.lua,
--                     limits_of) rather than refuse, queue or shrink,
--                 L: a lease id (lib.lua: leases): the request is admitted against the lease
--                    too, and draws its hold out of the lease's (absent: no lease)}
--
-- Units: tokens; money in integer nano-USD; times in epoch ms from the server's TIME.
--
-- Reply, admitted:  {'ok', now_ms, output_reserved, <budget state>, <rate state>}
-- Reply, queued:    {'queued', now_ms, what, waiting_ahead, <budget state>, <rate state>}: the
--                    id holds a ticket in the tenant's queue; call again with the same id (which
--                    renews the ticket) until it is admitted or refused, or leave (leave.lua)
-- Reply, refused:   {'busy'|'exceeded'|'never'|'rate', now_ms, what, retry_after_ms,
--                    <budget state>, <rate state>}  where `what` is the budget field or
--                    '<level tag>:rpm|tpm'. 'never': the input and the least output exceed that
--                    budget's whole limit even with nothing used; no retry helps (retry 0).
-- Reply, bad clock: {'clock', now_ms}  (a window the client named does not contain now)
-- Reply, stale:     {'config', now_ms, version}  (the caller's config is older than what an
--                                       admin change published: reload it, then call again)
-- Reply, too late:  {'late', now_ms}   (now is past `na`: the caller has given up waiting, so
--                                       nothing is reserved; a reply it reads means its clock
--                                       guess was off and it may call again)
-- Reply, windows:   {'windows', now_ms, spec...}  (an expired hold needs these windows named)
-- Reply, restore:   {'hydrate', now_ms}  (the counters are not in place: restore, call again)
-- Reply, grant:    {'grant', now_ms, row, need, ...}  (ag set: these shared rows' allowances lack
--                    `need` for this request; nothing is reserved: get more, call again)
-- Reply, no lease:  {'nolease', now_ms}  (ARGV L names no live lease of this tenant / user)
-- Reply, reused id: {'settled', now_ms}  (this id was settled already; nothing changes)
--                   {'expired', now_ms}  (this id expired and was charged; nothing changes)
-- <budget state> = n, then n pairs (remaining, reset_ms) in the order of ARGV b
-- <rate state>   = m, then m quads (rpm_remaining, rpm_reset_ms, tpm_remaining, tpm_reset_ms);
--                  -1 where that limit is not set. tpm_remaining is the tpm less what its
--                  window holds (live holds + tokens ended in the last 60 s), at least 0;
--                  tpm_reset_ms is when the ended tokens it counts have all left it.
--
-- Checks in order: requests per minute, budgets, then tokens per minute (lib.lua: the tpm
-- windows): the tpm check needs the output the budgets leave. A request whose input and output
-- fit in the tpm waits ('rate', retry when enough ended tokens leave the window, or 1000 ms
-- when live holds alone fill it) rather than being shrunk; a larger one runs alone.
--
-- Output is reserved up to the estimate `o`, and only while `hr` tokens per live reservation stay
-- free after it (room for the streams in flight to extend into: a stream that outgrows its
-- estimate while newcomers take every freed token is cut). A request that would fit once the
-- holds in flight settle waits: it queues (q > 0) or is refused 'busy'. At the tail of a budget
-- (the estimate would not fit even with nothing in flight) it is shrunk to what the budgets hold,
-- never below `mo`, but only once no hold in flight makes that room smaller: one request takes
-- the tail, not several small holds that each would be cut. One that would not fit even with
-- nothing used is 'never'; otherwise 'exceeded'.
-- The queue is first come, first served per tenant within a priority class (a higher `qp` goes
-- ahead of every lower one): while ids wait, a newcomer queues behind those of its class and
-- above, and only the first in line is admitted (so a freed token goes to the oldest waiter of
-- the highest class, on whichever instance it waits). A ticket not renewed in time (its waiter died or gave up) lapses.
-- A request that can never fit is refused at once, queued or not.
-- A refused request changes nothing but the reclaiming of expired reservations (and its own
-- ticket), and appends a usage record of the refusal (outcome busy, exceeded, never or rate);
-- a 'queued' reply appends none (leave.lua records the refusal of a waiter that gives up).
-- Under a lease (L; lib.lua: leases) the lease is one more level: its envelope less what it
-- spent and holds caps the output (refused 'busy' while its own holds leave less than `mo`,
-- 'exceeded' once spent, 'never' when the input and `mo` exceed the whole envelope); on each
-- budget the lease's hold counts as room, and the request's hold is drawn out of it first (only
-- the rest is added to the reserved hash). Rate limits apply as to any request.
-- Admitting an id that is already held is a replay (a client retry after a lost reply): it
-- answers 'ok' with the existing reservation and reserves nothing more.

local rid, ttl = ARGV[1], tonumber(ARGV[2])
local spec = cjson.decode(ARGV[3])
local now = now_ms()
if not windows_current(spec.w, now) then return {'clock', now} end
if not restored() then return {'hydrate', now} end
if spec.cv then
  local published = tonumber(redis.call('GET', KEYS[13]) or '0')
  if published > spec.cv then return {'config', now, published} end
end
if redis.call('EXISTS', KEYS[10]) == 1 then return {'settled', now} end
if redis.call('HEXISTS', KEYS[K_EXPIRED], rid) == 1 then return {'expired', now} end
if (spec.na or 0) > 0 and now > spec.na then return {'late', now} end
local used_keys = used_keys_from(14)
local K_Q, K_QX = 11, 12
local missing = reclaim(now, spec, used_keys)
if missing then return needs_windows(now, missing) end

local held = redis.call('HGET', KEYS[K_RES], rid)
if held then
  local used, reserved = read_counts(used_keys, spec.b)
  local reply = {'ok', now, record_of(held).o}
  append_budget_state(reply, spec.b, spec.w, used, reserved, now)
  table.insert(reply, 0)
  return reply
end

local lease = nil
if spec.L then
  local m = spec.m or {}
  lease = lease_get(spec.L, now)
  if not lease or not lease_owned(lease, m.tn, m.us) then return {'nolease', now} end
end

local est_in, est_out, min_out = spec.i, spec.o, spec.mo
local pin, pout = spec.pi, spec.po
local minute = MINUTE_MS

-- Rate limits: compute everything first, so a refusal writes nothing.
local rates, rate_state = {}, {#spec.r}
local refusal = nil
local sec = math.floor(now / 1000)
for _, r in ipairs(spec.r) do
  local tag, rpm, tpm = r[1], r[2], r[3]
  local st = rate_read(tag, tpm, now)
  local c, p, elapsed = st.c, st.p, st.elapsed
  if rpm > 0 then
    local est = st.est
    if est + 1 > rpm and not refusal then
      local retry
      if c + 1 > rpm or p == 0 then
        retry = minute - elapsed
      else
        retry = math.ceil(minute - (rpm - 1 - c) * minute / p) - elapsed
      end
      refusal = {'rate', tag .. ':rpm', math.max(retry, 1)}
    end
    table.insert(rate_state, math.max(math.floor(rpm - est), 0))
    table.insert(rate_state, minute - elapsed)
  else
    table.insert(rate_state, -1)
    table.insert(rate_state, -1)
  end
  -- Tokens per minute: a sliding window over reservations (lib.lua, tpm_fields); checked
  -- after the budgets, which may shrink the output this request holds.
  if tpm > 0 then
    st.tpm = tpm
    st.room = tpm - st.win_state.live - st.win_state.ended
    table.insert(rate_state, math.max(st.room, 0))
    table.insert(rate_state, tpm_reset(st.win_state, sec, now))
  else
    table.insert(rate_state, -1)
    table.insert(rate_state, -1)
  end
  rates[#rates + 1] = st
end

local used, reserved = read_counts(used_keys, spec.b)
local cap = limits_of(used_keys, spec.b)

local function budget_reply(kind, what, retry)
  if not spec.nr then append_record('r', rid, spec.m, {oc = kind, n = 1, t0 = now}) end
  local reply = {kind, now, what, retry}
  append_budget_state(reply, spec.b, spec.w, used, reserved, now)
  for _, v in ipairs(rate_state) do table.insert(reply, v) end
  return reply
end

if refusal then
  redis.call('ZREM', KEYS[11], rid)  -- a waiter refused by a rate limit leaves the queue
  redis.call('ZREM', KEYS[12], rid)
  return budget_reply(refusal[1], refusal[2], refusal[3])
end

if spec.ag then
  local short = {'grant', now}
  for i, b in ipairs(spec.b) do
    local need = b[5] and used[i] + reserved[i] + amount(b[2], est_in, est_out, pin, pout) - cap[i]
    if need and need > 0 then
      short[#short + 1] = i
      short[#short + 1] = need
    end
  end
  if #short > 2 then return short end
end

-- The queue: tickets whose waiters stopped renewing them lapse; then how many wait ahead of this id.
local queue_ttl = spec.q or 0
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[K_QX], '-inf', now, 'LIMIT', 0, 32)
for _, id in ipairs(lapsed) do
  redis.call('ZREM', KEYS[K_Q], id)
  redis.call('ZREM', KEYS[K_QX], id)
end
local rank = redis.call('ZRANK', KEYS[K_Q], rid)
local ahead = rank
-- A waiter's score: its class (worth more than any time), then when it joined, in ms; those
-- that joined in the same ms are 1/64 apart in their order of arrival (a member's name would
-- order them otherwise). 1/64 is exact in a double at these magnitudes.
local joined = now - (spec.qp or 0) * 1e13
local next_ms = '(' .. string.format('%.17g', joined + 1)
if not rank then
  -- A newcomer waits behind those of its class or higher.
  ahead = redis.call('ZCOUNT', KEYS[K_Q], '-inf', next_ms)
end
local function leave_queue()
  if rank then
    redis.call('ZREM', KEYS[K_Q], rid)
    redis.call('ZREM', KEYS[K_QX], rid)
  end
end

-- Budgets: how many output tokens fit now, now keeping room for extends, and if nothing were
-- in flight.
local huge = 2 ^ 53
local headroom = spec.hr or 0
local fit, fit_room, fit_idle = huge, huge, huge
local tight, tight_idle = nil, 1
for i, b in ipairs(spec.b) do
  local dim, limit = b[2], cap[i]
  local fixed = amount(dim, est_in, 0, pin, pout)
  local per = per_output(dim, pout)
  local free = limit - used[i] - reserved[i] - fixed + (lease and lease.h[b[1]] or 0)
  local idle = limit - used[i] - fixed
  local f, fr, fi
  if per == 0 then
    f = (free >= 0) and huge or -1
    fr = f
    fi = (idle >= 0) and huge or -1
  else
    f = math.floor(free / per)
    fr = f
    if headroom > 0 and reserved[i] > 0 then
      local live = tonumber(redis.call('HGET', KEYS[K_LIVE], string.match(b[1], '^(.-):[^:]+:[^:]+$')) or '0')
      fr = f - headroom * live
    end
    fi = math.floor(idle / per)
  end
  fit = math.min(fit, f)
  if fr < fit_room then fit_room, tight = fr, i end
  if fi < fit_idle then fit_idle, tight_idle = fi, i end
end
tight = tight or 1

-- Wait (queue or 'busy') while holds in flight stand between this request and its room.
local function wait()
  if queue_ttl > 0 then
    -- Ordered by class, then by when it joined (a class is worth more than any time).
    if not rank then
      local last = redis.call('ZREVRANGEBYSCORE', KEYS[K_Q], next_ms, joined, 'WITHSCORES',
                              'LIMIT', 0, 1)
      local score = last[2] and (tonumber(last[2]) + 1 / 64) or joined
      redis.call('ZADD', KEYS[K_Q], string.format('%.17g', score), rid)
    end
    redis.call('ZADD', KEYS[K_QX], now + queue_ttl, rid)
    keep_alive(queue_ttl + HOLD_KEY_GRACE_MS, KEYS[K_Q], KEYS[K_QX])
    local reply = {'queued', now, spec.b[tight][1], ahead}
    append_budget_state(reply, spec.b, spec.w, used, reserved, now)
    for _, v in ipairs(rate_state) do table.insert(reply, v) end
    return reply
  end
  return budget_reply('busy', spec.b[tight][1], BUSY_RETRY_MS)
end

-- A lease: the envelope is one more level. Its output room caps the estimate; a request that
-- fits once the lease's holds in flight settle waits, one that never fits it is refused.
if lease then
  local room, idle, what = lease_room(lease, est_in, pin, pout)
  if idle < min_out then
    leave_queue()
    local whole = lease_room({id = lease.id, et = lease.et, eu = lease.eu, ut = 0, uu = 0,
                              rt = 0, ru = 0}, est_in, pin, pout)
    if whole < min_out then return budget_reply('never', what, 0) end
    return budget_reply('exceeded', what, lease.e - now)
  elseif room < min_out then
    leave_queue()  -- the lease's own holds stand in the way, not the tenant's queue
    return budget_reply('busy', what, BUSY_RETRY_MS)
  end
  est_out = math.min(est_out, room)
end

local out
if fit_idle < min_out then
  -- Larger than what is left even with nothing in flight: no wait helps.
  leave_queue()
  for _, b in ipairs(spec.b) do
    local room = b[3] - amount(b[2], est_in, 0, pin, pout)
    local per = per_output(b[2], pout)
    if (per == 0 and room < 0) or (per > 0 and math.floor(room / per) < min_out) then
      return budget_reply('never', b[1], 0)
    end
  end
  local b = spec.b[tight_idle]
  return budget_reply('exceeded', b[1], spec.w[b[4]][2] - now)
elseif ahead > 0 then
  return wait()  -- first come, first served: others wait ahead of this one
elseif fit_idle >= est_out then
  if fit_room < est_out then return wait() end  -- fits once holds settle
  out = est_out
else
  -- The tail: shrink to what is left, once the holds in flight no longer make it smaller.
  if fit < fit_idle or fit < min_out then return wait() end
  out = math.min(est_out, fit)
end
leave_queue()

-- Tokens per minute: the request needs its input and output to fit in every level's window
-- (tokens held live + ended in the last 60 s). One that could never fit whole (input and
-- output above the tpm) needs the whole window and then takes what is left of it, at least
-- `mo`: it runs alone. Otherwise its output is never shrunk for the window: it waits.
for _, st in ipairs(rates) do
  if st.tpm then
    local need = math.min(est_in + out, st.tpm)
    if st.room < need then
      return budget_reply('rate', st.tag .. ':tpm',
                          tpm_retry(st.win_state, need, st.tpm, sec, now))
    end
    out = math.min(out, math.max(st.room - est_in, min_out))
  end
end

-- Admitted: count the request, add to the tpm windows' live totals, hold the reservation.
local take = est_in + out
local tpm_levels = {}
for _, st in ipairs(rates) do
  local tag = st.tag
  redis.call('HSET', KEYS[K_RL], tag .. ':rw', st.win, tag .. ':rc', st.c + 1, tag .. ':rp', st.p)
  if st.tpm then
    redis.call('HINCRBY', KEYS[K_RL], tag .. ':tl', take)
    if st.win_state.dirty then tpm_save(st.win_state) end
    tpm_levels[#tpm_levels + 1] = {tag, st.tpm, take}
  end
end
if #rates > 0 then keep_alive(ttl + RATE_KEY_GRACE_MS, KEYS[K_RL]) end

local fields, dims, drawn = {}, {}, {}
for i, b in ipairs(spec.b) do
  local a = amount(b[2], est_in, out, pin, pout)
  local c = lease and lease_draw(lease, b[1], a) or 0  -- already in K_RESERVED, as the lease's
  if c > 0 then drawn[b[1]] = c end
  if a - c ~= 0 then redis.call('HINCRBY', KEYS[K_RESERVED], b[1], a - c) end
  reserved[i] = reserved[i] + a - c
  fields[i], dims[i] = b[1], b[2]
end
if lease then
  lease.rt = lease.rt + take
  lease.ru = lease.ru + amount('usd', est_in, out, pin, pout)
  lease_save(lease)
end
local levels = spec.lv or {}
for _, tag in ipairs(levels) do redis.call('HINCRBY', KEYS[K_LIVE], tag, 1) end
local rec = {v = RESERVATION_VERSION, f = fields, d = dims, i = est_in, o = out, pi = pin,
             po = pout, r = tpm_levels, m = spec.m, lv = levels,
             x = (spec.x == 1) and 1 or 0, t = now}
if lease then rec.L, rec.lc = lease.id, drawn end
redis.call('HSET', KEYS[K_RES], rid, cjson.encode(rec))
redis.call('ZADD', KEYS[K_EXP], now + ttl, rid)
keep_alive(ttl + HOLD_KEY_GRACE_MS, KEYS[K_RESERVED], KEYS[K_RES], KEYS[K_EXP], KEYS[K_LIVE])

local reply = {'ok', now, out}
append_budget_state(reply, spec.b, spec.w, used, reserved, now)
-- Rate state after this request: one fewer request, its tokens held in each tpm window.
for j, st in ipairs(rates) do
  local base = 1 + (j - 1) * 4
  if rate_state[base + 1] > 0 then rate_state[base + 1] = rate_state[base + 1] - 1 end
  if st.tpm then rate_state[base + 3] = math.max(st.room - take, 0) end
end
for _, v in ipairs(rate_state) do table.insert(reply, v) end
return reply
