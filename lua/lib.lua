-- lib.lua: helpers shared by the ledger scripts.
--
-- Not a script of its own: hardcap_core/scripts.py prepends this file to admit, extend, settle
-- and usage when it registers them, so each registered script is self-contained on the server.
--
-- Conventions used by every ledger script:
--   * time comes from the server: now_ms() reads TIME, never a client clock;
--   * tokens are integers, money is integer nano-USD;
--   * a budget spec row is {field, dim, limit, used_key_index}; dim is 'in' | 'out' | 'tot' | 'usd';
--   * a window row is {start_ms, end_ms} of the window the client computed for each used key.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Amount of one dimension that `inp` input and `out` output tokens make.
local function amount(dim, inp, out, pin, pout)
  if dim == 'in' then return inp end
  if dim == 'out' then return out end
  if dim == 'tot' then return inp + out end
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

-- Release a reservation record's amounts from the reserved hash.
local function release(k_reserved, rec)
  for i, f in ipairs(rec.f) do
    local a = amount(rec.d[i], rec.i, rec.o, rec.pi, rec.po)
    if a ~= 0 then redis.call('HINCRBY', k_reserved, f, -a) end
  end
end

-- Return expired reservations to the tenant. Bounded per call so one call never stalls the server.
local function reclaim(k_reserved, k_res, k_exp, now)
  local expired = redis.call('ZRANGEBYSCORE', k_exp, '-inf', now, 'LIMIT', 0, 256)
  for _, rid in ipairs(expired) do
    local raw = redis.call('HGET', k_res, rid)
    if raw then
      release(k_reserved, cjson.decode(raw))
      redis.call('HDEL', k_res, rid)
    end
    redis.call('ZREM', k_exp, rid)
  end
  return #expired
end

-- Keep the reservation keys alive at least `ms`: they vanish by themselves once traffic stops,
-- and by then every reservation in them has expired.
local function keep_alive(ms, ...)
  for _, k in ipairs({...}) do
    if redis.call('PEXPIRE', k, ms, 'NX') == 0 then redis.call('PEXPIRE', k, ms, 'GT') end
  end
end

-- Read each budget's used and reserved counts: returns two arrays aligned with `budgets`.
local function read_counts(k_reserved, used_keys, budgets)
  local used, reserved = {}, {}
  for i, b in ipairs(budgets) do
    used[i] = tonumber(redis.call('HGET', used_keys[b[4]], b[1]) or '0')
    reserved[i] = tonumber(redis.call('HGET', k_reserved, b[1]) or '0')
  end
  return used, reserved
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
