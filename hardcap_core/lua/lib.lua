-- lib.lua: helpers shared by the ledger scripts.
--
-- Not a script of its own: hardcap_core/ledger/scripts.py prepends this file to each of its
-- LEDGER_SCRIPTS (admit, extend, settle, usage, hydrate, leave, lease_open, lease_close), after
-- consts.lua (the lifetimes, limits and record versions, named once), when it registers them,
-- so each registered script is self-contained on the server.
--
-- Conventions used by every ledger script:
--   * time comes from the server: now_ms() reads TIME, never a client clock;
--   * tokens are integers, money is integer nano-USD;
--   * a budget spec row is {field, dim, limit, used_key_index[, 1: shared (limits_of)]}; dim is
--     'in' | 'out' | 'tot' | 'usd' | 'req' (requests, for a shared limit's requests per minute);
--     a field is '<level tag>:<dim>:<window spec>', so its window spec is its last part;
--   * a window row is {start_ms, end_ms, window spec} of the window the client computed for each
--     used key; the rows past the scope's own are windows only reclaim needs (see reclaim);
--   * every ledger script takes the same first nine keys, all under the hierarchy's hash tag:
local K_RESERVED = 1    -- hc:{root}:reserved    hash  budget field -> amount held by live holds
local K_RES = 2         -- hc:{root}:res         hash  reservation id -> JSON record
local K_EXP = 3         -- hc:{root}:exp         zset  reservation id -> expiry, epoch ms
local K_RL = 4          -- hc:{root}:rl          hash  rate-limit state per level
local K_EXPIRED = 5     -- hc:{root}:expired     hash  reservation id -> JSON: what expiry charged
local K_EXPIRED_AT = 6  -- hc:{root}:expired_at  zset  reservation id -> when that is forgotten
local K_LIVE = 7        -- hc:{root}:live        hash  level tag -> live reservations holding on it
local K_USAGE = 8       -- hc:{root}:usage       stream  one usage record per charge or refusal
local K_RESTORED = 9    -- hc:{root}:restored    string  set once the counters were restored from
                        --                       the durable ledger (hydrate.lua); while it is
                        --                       missing (a new or flushed cache) admit, settle
                        --                       and usage answer {'hydrate', now_ms}
--
-- A reservation record (K_RES): {v: its version (consts.lua: RESERVATION_VERSION; absent in
--   version 1, the release before), f: fields, d: dims, i: input, o: output held, pi/po: prices,
--   r: [[level tag, tpm, tokens its window holds]...] (see tpm_release), m: meta,
--   lv: level tags,
--   x: 1 to be charged (not refunded) when it expires, t: admitted at, ms,
--   L: the lease it draws from and lc: {field -> what it drew from the lease's hold}, only
--   under a lease}; K_RES also holds the leases, as 'L:<id>' (see leases below)
-- Meta (m): {rt: route, md: upstream model, k: key id, rq: request id, tn: tenant, og: org,
--   pv: upstream (provider) name, us: the user level's id (tenant~user), only when the request
--   has a user}: what a usage record says about who spent and where.
-- A usage record (K_USAGE; parsed by hardcap_core/rollup/records.py), one field 'r' whose first
--   integer is its format (consts.lua: USAGE_FORMAT*; 2, or 3 with a user; see append_record):
--   est (1: the amounts are an estimate), n (requests it counts), in, out, rs (reasoning), ci
--   (cached input), usd (nUSD), t0 (admitted at, ms), then
--   kind (s settle, x expiry charge, r refusal), rid, tn, org, k, rt, md, pv, rq, oc (outcome)
--   and, in format 3, us (format 4: us, '' if none, then ls, the lease); amounts are what the
--   record adds to spend.
-- An expiry record (K_EXPIRED): {v: its version (as a reservation record's), c: [[field, dim,
--   used key]...] charged, i, o, pi, po: the counts
--   and prices charged, r: the tpm levels (as the reservation's, their holds counted as ended
--   at expiry), m: meta, e: 1 (an estimate: the provider's count never
--   arrived)}

-- Lifetimes, limits and record versions: consts.lua, prepended before this file.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Amount of one dimension that `inp` input and `out` output tokens make.
local function amount(dim, inp, out, pin, pout)
  if dim == 'in' then return inp end
  if dim == 'out' then return out end
  if dim == 'tot' then return inp + out end
  if dim == 'req' then return 1 end  -- requests: a shared limit's requests per minute
  return inp * pin + out * pout
end

-- How much one more output token adds to a dimension.
local function per_output(dim, pout)
  if dim == 'out' or dim == 'tot' then return 1 end
  if dim == 'usd' then return pout end
  return 0
end

-- The windows the client named must contain the server's now; otherwise the client's clock is
-- off across a boundary and it must retry with the server time we return.
local function windows_current(windows, now)
  for _, w in ipairs(windows) do
    if now < w[1] or now >= w[2] then return false end
  end
  return true
end

local function window_of(field)
  return string.match(field, '[^:]+$')
end

-- Keep keys alive at least `ms`: they vanish by themselves once traffic stops, and by then
-- every reservation in them has expired.
-- GT first: a live key already has a TTL, and GT (which treats no TTL as infinite) then takes
-- one call; NX sets the TTL of a key that has none.
local function keep_alive(ms, ...)
  for _, k in ipairs({...}) do
    if redis.call('PEXPIRE', k, ms, 'GT') == 0 then redis.call('PEXPIRE', k, ms, 'NX') end
  end
end

-- Add `n` to a used key's field; the key outlives its window (for late reads).
local function charge(used_key, window_end, field, n)
  if n ~= 0 then redis.call('HINCRBY', used_key, field, n) end
  redis.call('PEXPIREAT', used_key, window_end + USED_KEY_GRACE_MS, 'NX')
end

-- An integer as Redis stores it: whole digits, never '1e+15'.
local function int(x)
  return string.format('%d', x)
end

-- A reservation, lease or expiry record as stored (JSON), decoded; every script reads them
-- here. Any version is read (consts.lua: RESERVATION_VERSION): one without v is version 1,
-- the release before, which holds the same fields; a newer one only adds fields, which a
-- script passes on untouched when it writes the record back (extend).
local function record_of(raw)
  local rec = cjson.decode(raw)
  rec.v = rec.v or 1
  return rec
end

-- Append a usage record: `kind` 's' | 'x' | 'r', meta `m` (see above), counts `c`:
-- {oc, est, n, i, o, rs, ci, usd, t0}. One field, 'r' (format 2): the version and the eight
-- integers est, n, in, out, rs, ci, usd, t0, each followed by a comma, then a JSON array of the
-- strings kind, rid, tn, org, k, rt, md, pv, rq, oc. (Format 1 had a field per value: 20
-- fields took the XADD from 4.8 to 8.7 µs of server time, measured on this 2-core VM.)
-- Format 3 is format 2 with the user (m.us) as an 11th string, written only when there is one:
-- a deploy without users writes format 2 exactly, which a rollup of the release before reads.
-- Format 4 is format 3 with the lease (m.ls) as a 12th string, written only under a lease.
local function append_record(kind, rid, m, c)
  m = m or {}
  local strings = {kind, rid, m.tn or '', m.og or '', m.k or '', m.rt or '', m.md or '',
                   m.pv or '', m.rq or '', c.oc}
  local version = USAGE_FORMAT
  if m.us and m.us ~= '' then
    version = USAGE_FORMAT_USER
    strings[11] = m.us
  end
  if m.ls and m.ls ~= '' then  -- format 4: the lease as a 12th string (the user '' if none)
    version = USAGE_FORMAT_LEASE
    strings[11], strings[12] = m.us or '', m.ls
  end
  local r = string.format('%d,%d,%d,%d,%d,%d,%d,%d,%d,', version, c.est or 0, c.n or 1,
    c.i or 0, c.o or 0, c.rs or 0, c.ci or 0, c.usd or 0, c.t0 or 0) .. cjson.encode(strings)
  redis.call('XADD', KEYS[K_USAGE], 'MAXLEN', '~', USAGE_MAXLEN, '*', 'r', r)
end

-- Whether this hierarchy's counters are in place: restored from the durable ledger after the
-- cache was created or lost them (see hydrate.lua). Until then a script that reads or changes
-- them answers {'hydrate', now} and changes nothing.
local function restored()
  return redis.call('EXISTS', KEYS[K_RESTORED]) == 1
end

-- Release a reservation record's amounts from the reserved hash and its live counts.
local function release(rec)
  for i, f in ipairs(rec.f) do
    local a = amount(rec.d[i], rec.i, rec.o, rec.pi, rec.po)
    if a ~= 0 then redis.call('HINCRBY', KEYS[K_RESERVED], f, -a) end
  end
  for _, tag in ipairs(rec.lv or {}) do
    if redis.call('HINCRBY', KEYS[K_LIVE], tag, -1) <= 0 then redis.call('HDEL', KEYS[K_LIVE], tag) end
  end
end

-- Token-per-minute windows. A request counts in every 60 s window that overlaps its life
-- [admitted, settled], so admitting only while
--   live holds + tokens of requests that ended in the last 60 s + this request <= tpm
-- (and extending only while the same holds for the extension) keeps every sliding 60 s window
-- within tpm. Per level tag with a tpm, in K_RL:
--   <tag>:tl    input + output held by the level's live reservations (admit and extend add,
--               settle and expiry remove exactly what the record says the level holds)
--   <tag>:e<k>  'second,tokens': tokens of requests that ended in that epoch second, for
--               k = second % 61; a field whose second is not the one k stands for now is
--               stale and counts 0. A request that ended in second s counts until s + 61 (up
--               to 1 s more than it must).
--   <tag>:es    the sum of the buckets of seconds eo and later, so a read needs no sum: a
--   <tag>:eo    read at second t first subtracts the buckets of seconds eo .. t - 61 (one
--               or two a second under load; none when nothing ended) and moves eo to t - 60
--   <tag>:el    the latest second that has ended tokens (when the window will be empty)
-- A reservation record's r holds [tag, tpm, held] per level; records of the earlier token
-- bucket ([tag, tpm], fields <tag>:tb and <tag>:tt) are ignored. TPM_SLOTS: consts.lua.

-- Append to `fields` the K_RL fields tpm_state reads.
local function tpm_fields(fields, tag)
  fields[#fields + 1] = tag .. ':tl'
  fields[#fields + 1] = tag .. ':es'
  fields[#fields + 1] = tag .. ':eo'
  fields[#fields + 1] = tag .. ':el'
end

-- A bucket value's tokens if it is the bucket of second `sec`, else 0.
local function bucket_tokens(v, sec)
  if not v then return 0 end
  local s, n = string.match(v, '^(%d+),(%d+)$')
  if tonumber(s) == sec then return tonumber(n) end
  return 0
end

local function bucket_field(tag, sec)
  return tag .. ':e' .. (sec % TPM_SLOTS)
end

-- A level's window at epoch second `sec`, from the values of tpm_fields at `vals[at..]`:
-- {tag, live, ended (tokens ended in seconds sec - 60 .. sec), eo, el, dirty}. Buckets that
-- left the window are subtracted here; tpm_save writes the result (when dirty).
local function tpm_state(tag, vals, at, sec)
  local st = {tag = tag, live = math.max(tonumber(vals[at] or '0') or 0, 0)}
  local es, eo = tonumber(vals[at + 1] or '0') or 0, tonumber(vals[at + 2] or '')
  st.el = tonumber(vals[at + 3] or '') or 0
  local first = sec - 60
  if not eo or first - eo >= TPM_SLOTS then
    es = 0  -- every bucket it counted has left the window (or none was ever counted)
  elseif eo < first then
    local names = {}
    for t = eo, first - 1 do names[#names + 1] = bucket_field(tag, t) end
    local old = redis.call('HMGET', KEYS[K_RL], unpack(names))
    for i = 1, #names do es = es - bucket_tokens(old[i], eo + i - 1) end
  end
  st.eo = math.max(first, eo or first)  -- never back, should the server's clock go back
  st.ended = math.max(es, 0)
  st.dirty = st.eo ~= eo
  return st
end

local function tpm_save(st)
  redis.call('HSET', KEYS[K_RL], st.tag .. ':es', st.ended, st.tag .. ':eo', st.eo,
             st.tag .. ':el', st.el)
end

-- A level's rate state now, read only (one HMGET; admit writes what it changes): the requests
-- per minute, a sliding window (this minute's count plus last minute's, weighted by how much of
-- it still overlaps: est), and with tpm > 0 the tokens-per-minute window (win_state).
local function rate_read(tag, tpm, now)
  local minute = MINUTE_MS
  local names = {tag .. ':rw', tag .. ':rc', tag .. ':rp'}
  if tpm > 0 then tpm_fields(names, tag) end
  local f = redis.call('HMGET', KEYS[K_RL], unpack(names))
  local win = math.floor(now / minute)
  local w, c, p = tonumber(f[1] or '-1'), tonumber(f[2] or '0'), tonumber(f[3] or '0')
  if w ~= win then
    p = (w == win - 1) and c or 0
    c = 0
  end
  local st = {tag = tag, win = win, c = c, p = p, elapsed = now - win * minute}
  st.est = p * (minute - st.elapsed) / minute + c
  if tpm > 0 then st.win_state = tpm_state(tag, f, 4, math.floor(now / 1000)) end
  return st
end

-- Read a level's window now (one HMGET; a second one for buckets that left it).
local function tpm_read(tag, sec)
  local names = {}
  tpm_fields(names, tag)
  return tpm_state(tag, redis.call('HMGET', KEYS[K_RL], unpack(names)), 1, sec)
end

-- Ms until the window's ended tokens have all left it (0: none counted).
local function tpm_reset(st, sec, now)
  if st.ended > 0 and st.el >= sec - 60 then return (st.el + TPM_SLOTS) * 1000 - now end
  return 0
end

-- Ms until `need` more tokens fit under `tpm`: when enough ended tokens leave the window (its
-- buckets read oldest first), or 1000 when the live holds alone leave no room (they end when
-- their streams settle).
local function tpm_retry(st, need, tpm, sec, now)
  if st.live + need > tpm then return BUSY_RETRY_MS end
  local over = st.live + st.ended + need - tpm  -- ended tokens that must leave first
  local names = {}
  for t = st.eo, sec do names[#names + 1] = bucket_field(st.tag, t) end
  local per = redis.call('HMGET', KEYS[K_RL], unpack(names))
  for i = 1, #names do
    local t = st.eo + i - 1
    over = over - bucket_tokens(per[i], t)
    if over <= 0 then return math.max((t + TPM_SLOTS) * 1000 - now, 1) end
  end
  return BUSY_RETRY_MS
end

-- Add `n` tokens to a level's bucket of the current second (and to its sum).
local function tpm_add_ended(tag, n, now)
  if n <= 0 then return end
  local sec = math.floor(now / 1000)
  local f = bucket_field(tag, sec)
  local names = {f}
  tpm_fields(names, tag)
  local vals = redis.call('HMGET', KEYS[K_RL], unpack(names))
  local st = tpm_state(tag, vals, 2, sec)  -- subtracts a stale bucket in this field first
  redis.call('HSET', KEYS[K_RL], f, int(sec) .. ',' .. int(bucket_tokens(vals[1], sec) + n))
  st.ended, st.el = st.ended + n, sec
  tpm_save(st)
end

-- A reservation ends (settled, or reclaimed at expiry): each tpm level drops what it held and
-- counts `ended` tokens (what it really used; at expiry its hold) as ended now.
local function tpm_release(levels, ended, now)
  local any = false
  for _, lvl in ipairs(levels or {}) do
    local held = lvl[3]
    if held then
      any = true
      if redis.call('HINCRBY', KEYS[K_RL], lvl[1] .. ':tl', -held) < 0 then
        redis.call('HSET', KEYS[K_RL], lvl[1] .. ':tl', 0)  -- the hash expired meanwhile
      end
      tpm_add_ended(lvl[1], ended, now)
    end
  end
  if any then keep_alive(RATE_KEY_GRACE_MS, KEYS[K_RL]) end
end

-- A settle after an expiry that counted the hold as ended: count only what the real usage
-- adds beyond it (never less: the hold may well have been generated).
local function tpm_late(levels, extra, now)
  local any = false
  for _, lvl in ipairs(levels or {}) do
    if lvl[3] then
      any = true
      tpm_add_ended(lvl[1], extra, now)
    end
  end
  if any and extra > 0 then keep_alive(RATE_KEY_GRACE_MS, KEYS[K_RL]) end
end

-- The used key and window end of each window spec the caller named.
local function windows_by_spec(windows, used_keys)
  local by = {}
  for j, w in ipairs(windows) do by[w[3]] = {used_keys[j], w[2]} end
  return by
end

-- Charge an expired reservation its hold, in the windows current now, and remember what was
-- charged so that a settle arriving after all charges only the difference. Its usage record
-- says so: outcome 'expired', an estimate.
local function charge_expired(rid, rec, by, now, memory)
  local rows = {}
  for i, f in ipairs(rec.f) do
    local w = by[window_of(f)]
    charge(w[1], w[2], f, amount(rec.d[i], rec.i, rec.o, rec.pi, rec.po))
    rows[i] = {f, rec.d[i], w[1]}
  end
  local x = {v = RESERVATION_VERSION, c = rows, i = rec.i, o = rec.o, pi = rec.pi, po = rec.po,
             r = rec.r, m = rec.m, e = 1, L = rec.L}
  redis.call('HSET', KEYS[K_EXPIRED], rid, cjson.encode(x))
  append_record('x', rid, rec.m, {oc = 'expired', est = 1, n = 1, i = rec.i, o = rec.o,
                                  usd = amount('usd', rec.i, rec.o, rec.pi, rec.po), t0 = rec.t})
  redis.call('ZADD', KEYS[K_EXPIRED_AT], now + memory, rid)
  keep_alive(memory + EXPIRED_KEY_GRACE_MS, KEYS[K_EXPIRED], KEYS[K_EXPIRED_AT])
end

-- Forget expiry records older than the settle memory: a settle that late is not expected.
local function forget_expired(now)
  local old = redis.call('ZRANGEBYSCORE', KEYS[K_EXPIRED_AT], '-inf', now, 'LIMIT', 0, FORGET_BATCH)
  for _, rid in ipairs(old) do
    redis.call('HDEL', KEYS[K_EXPIRED], rid)
    redis.call('ZREM', KEYS[K_EXPIRED_AT], rid)
  end
end

-- Leases (lease_open.lua, lease_close.lua): a hold of an envelope (tokens and/or nUSD) on a
-- scope's budgets, kept in K_RES as 'L:<id>' with its expiry in K_EXP, so that reclaim ends it
-- like an expired hold. A lease record: {v: its version (as a reservation record's), lease: 1,
--   id, e: expires at, t: opened at,
--   et/eu: the envelope in tokens / nUSD (absent: that dimension is not limited),
--   ut/uu: spent (charged by settles of its requests and ended sub-leases),
--   rt/ru: held by its live requests and sub-leases,
--   h: {field -> what the lease holds now on that budget field (counted in K_RESERVED)},
--   a: {field -> what it held when opened}, c: {field -> the part of a drawn from its parent},
--   p: parent lease id, dp: depth (1: opened on the scope), tn/us: owner (tenant, user)}.
-- Invariant: K_RESERVED[f] = sum of live requests' holds on f + sum of live leases' h[f]. A
-- request under a lease takes min(its amount, h[f]) out of h[f] (so the hierarchy does not
-- count it twice) and adds only the rest to K_RESERVED; its settle returns to h[f] what it
-- drew and did not spend (while the lease lives; a dead lease gets nothing back).
local LEASE = 'L:'

local function lease_get(id, now)
  if not id or id == '' then return nil end
  local raw = redis.call('HGET', KEYS[K_RES], LEASE .. id)
  if not raw then return nil end
  local l = record_of(raw)
  if l.e <= now then return nil end  -- expired: ended by the next reclaim
  return l
end

local function lease_save(l)
  redis.call('HSET', KEYS[K_RES], LEASE .. l.id, cjson.encode(l))
end

-- Whether a caller (tenant `tn`, user `us` or '') may use lease `l`.
local function lease_owned(l, tn, us)
  return l.tn == (tn or '') and (l.us == nil or l.us == '' or l.us == (us or ''))
end

-- Output tokens that fit in lease `l` for a request of `inp` input tokens at these prices:
-- now (beside its live holds), if nothing were held, and the dimension that binds
-- ('l:<id>:tokens' or 'l:<id>:usd'). -1 when even no output fits.
local function lease_room(l, inp, pin, pout)
  local huge = 2 ^ 53
  local room, idle, what = huge, huge, nil
  local function fit(limit, spent, held, fixed, per, dim)
    local f, i
    if per == 0 then
      f = (limit - spent - held - fixed >= 0) and huge or -1
      i = (limit - spent - fixed >= 0) and huge or -1
    else
      f = math.floor((limit - spent - held - fixed) / per)
      i = math.floor((limit - spent - fixed) / per)
    end
    if f < room or not what then what = 'l:' .. l.id .. ':' .. dim end
    room, idle = math.min(room, f), math.min(idle, i)
  end
  if l.et then fit(l.et, l.ut, l.rt, inp, 1, 'tokens') end
  if l.eu then fit(l.eu, l.uu, l.ru, inp * pin, pout, 'usd') end
  return room, idle, what or ('l:' .. l.id .. ':tokens')
end

-- Take up to `a` of budget field `f` out of lease `l`'s hold; returns what it took.
local function lease_draw(l, f, a)
  local h = l.h[f] or 0
  local c = math.min(a, h)
  if c <= 0 then return 0 end
  l.h[f] = h - c
  return c
end

-- A request under a lease ended (settled, or reclaimed at expiry) having spent `inp` input,
-- `out` output tokens and `cost` nUSD: each budget field gets back into the lease's hold what
-- the request drew from it and did not spend (spend draws from the lease's part first), and
-- the lease counts the spend and drops the request's hold. Nothing when the lease is gone.
local function lease_return(rec, inp, out, cost, now)
  local l = lease_get(rec.L, now)
  if not l then return end
  for i, f in ipairs(rec.f) do
    local c = (rec.lc or {})[f] or 0
    if c > 0 then
      local spent = (rec.d[i] == 'usd') and cost or amount(rec.d[i], inp, out, 0, 0)
      local back = math.max(c - spent, 0)
      if back > 0 then
        redis.call('HINCRBY', KEYS[K_RESERVED], f, back)
        l.h[f] = (l.h[f] or 0) + back
      end
    end
  end
  l.rt = math.max(l.rt - rec.i - rec.o, 0)
  l.ru = math.max(l.ru - amount('usd', rec.i, rec.o, rec.pi, rec.po), 0)
  l.ut, l.uu = l.ut + inp + out, l.uu + cost
  lease_save(l)
end

-- End lease `l` (closed, or reclaimed at expiry): its hold leaves K_RESERVED, except the part
-- of what it drew from a live parent that it did not use, which goes back into the parent's
-- hold. At the parent's level the sub-lease's spend and its requests' live holds count as spent
-- (those requests' settles find their lease gone and return nothing to either).
local function lease_end(l, now)
  local p = l.p and lease_get(l.p, now)
  for f, h in pairs(l.h) do
    local back = 0
    if p then back = math.min(math.max((l.c[f] or 0) - ((l.a[f] or 0) - h), 0), h) end
    if h - back ~= 0 then redis.call('HINCRBY', KEYS[K_RESERVED], f, back - h) end
    if back > 0 then p.h[f] = (p.h[f] or 0) + back end
  end
  if p then
    p.rt = math.max(p.rt - (l.et or 0), 0)
    p.ru = math.max(p.ru - (l.eu or 0), 0)
    p.ut, p.uu = p.ut + l.ut + l.rt, p.uu + l.uu + l.ru
    lease_save(p)
  end
  redis.call('HDEL', KEYS[K_RES], LEASE .. l.id)
  redis.call('ZREM', KEYS[K_EXP], LEASE .. l.id)
end

-- Settle expired reservations, earliest first, at most a batch per call so one call never
-- stalls the server: a reservation admitted with x = 1 is CHARGED its hold (the gateway's own
-- upper estimate of what the provider generated before the stream was lost) to the windows
-- current now; any other is returned to the tenant.
-- An expired reservation of another scope in this hierarchy may count against a window the
-- caller did not name, whose key is then not in KEYS. Then nothing changes and the missing
-- window specs are returned: the script answers {'windows', now, spec...} and the client
-- calls again naming them too. Returns nil when done.
local function reclaim(now, spec, used_keys)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[K_EXP], '-inf', now, 'LIMIT', 0, RECLAIM_BATCH)
  if #expired > 0 then
    local by = windows_by_spec(spec.w, used_keys)
    local recs, missing, seen = {}, nil, {}
    for i, rid in ipairs(expired) do
      local raw = redis.call('HGET', KEYS[K_RES], rid)
      if raw then
        local rec = record_of(raw)
        recs[i] = rec
        if rec.x == 1 then
          for _, f in ipairs(rec.f) do
            local ws = window_of(f)
            if not by[ws] and not seen[ws] then
              seen[ws] = true
              missing = missing or {}
              table.insert(missing, ws)
            end
          end
        end
      end
    end
    if missing then return missing end
    for i, rid in ipairs(expired) do
      local rec = recs[i]
      if rec and rec.lease then
        lease_end(rec, now)  -- an expired lease: its unspent hold goes back
      elseif rec then
        release(rec)
        tpm_release(rec.r, rec.i + rec.o, now)
        if rec.x == 1 then charge_expired(rid, rec, by, now, spec.xm) end
        if rec.L then
          local charged = rec.x == 1
          lease_return(rec, charged and rec.i or 0, charged and rec.o or 0,
                       charged and amount('usd', rec.i, rec.o, rec.pi, rec.po) or 0, now)
        end
        redis.call('HDEL', KEYS[K_RES], rid)
      end
      redis.call('ZREM', KEYS[K_EXP], rid)
    end
  end
  forget_expired(now)
  return nil
end

-- The reply of a script that could not reclaim: the window specs it needs named.
local function needs_windows(now, missing)
  local reply = {'windows', now}
  for _, ws in ipairs(missing) do table.insert(reply, ws) end
  return reply
end

-- Read each budget's used and reserved counts: returns two arrays aligned with `budgets`.
local function read_counts(used_keys, budgets)
  local used, reserved = {}, {}
  for i, b in ipairs(budgets) do
    used[i] = tonumber(redis.call('HGET', used_keys[b[4]], b[1]) or '0')
    reserved[i] = tonumber(redis.call('HGET', KEYS[K_RESERVED], b[1]) or '0')
  end
  return used, reserved
end

-- Each budget row's limit here. A row of a limit that spans tenants (a route's or an
-- upstream's; b[5] = 1; hardcap_core/ledger/allowances.py) is checked against this hierarchy's
-- allowance of it, which allowance_credit.lua keeps in the row's used key as '<field>:a' (so it
-- ends with its window); b[3], its whole limit, only decides 'never'.
local function limits_of(used_keys, budgets)
  local caps = {}
  for i, b in ipairs(budgets) do
    caps[i] = b[3]
    if b[5] then caps[i] = tonumber(redis.call('HGET', used_keys[b[4]], b[1] .. ':a') or '0') end
  end
  return caps
end

-- Append, for each budget, remaining (limit - used - reserved, may be negative) and ms to reset.
local function append_budget_state(reply, budgets, windows, used, reserved, now)
  table.insert(reply, #budgets)
  for i, b in ipairs(budgets) do
    table.insert(reply, b[3] - used[i] - reserved[i])
    table.insert(reply, windows[b[4]][2] - now)
  end
  return reply
end

-- The used keys are KEYS[first..]; returns them as an array indexed like the window rows.
local function used_keys_from(first)
  local out = {}
  for i = first, #KEYS do out[#out + 1] = KEYS[i] end
  return out
end
