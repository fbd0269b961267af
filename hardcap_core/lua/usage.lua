-- usage.lua: read used, reserved and reset for each budget, after reclaiming expired reservations.
--
-- KEYS[1..9] the ledger keys every script takes (lib.lua: reserved, res, exp, rl, expired,
--            expired_at, live, usage, restored)
-- KEYS[10..] hc:{root}:u:<window spec>:<window id>  hash  budget field -> used
--
-- ARGV[1]  JSON: {b: [[field, dim, limit, used_key_index]...], w: [[start_ms, end_ms, spec]...],
--                 xm: ms an expiry charge is remembered, lv: level tags whose live count to read,
--                 r: [[level_tag, rpm_or_0, tpm_or_0]...] (optional: the rate state to read)}
--
-- Units: tokens; money in integer nano-USD; times in epoch ms from the server's TIME.
--
-- Reply:            {'ok', now_ms, m, then m live counts (reservations holding on each level of
--                    ARGV lv, in order), n, then n triples (used, reserved, reset_ms)}, then with
--                    ARGV r: <rate state> as admit.lua's (k, then k quads: rpm_remaining,
--                    rpm_reset_ms, tpm_remaining, tpm_reset_ms; -1 where not set), read only
-- Reply, bad clock: {'clock', now_ms}
-- Reply, restore:   {'hydrate', now_ms}  (the counters are not in place: restore, call again)
-- Reply, windows:   {'windows', now_ms, spec...}  (an expired hold needs these windows named)
--
-- Live counts are per level, never the hierarchy's whole set: a tenant sees its own requests in
-- flight, not its siblings' in the same org.

local spec = cjson.decode(ARGV[1])
local now = now_ms()
if not windows_current(spec.w, now) then return {'clock', now} end
if not restored() then return {'hydrate', now} end
local used_keys = used_keys_from(10)
local missing = reclaim(now, spec, used_keys)
if missing then return needs_windows(now, missing) end
local used, reserved = read_counts(used_keys, spec.b)
local levels = spec.lv or {}
local reply = {'ok', now, #levels}
for _, tag in ipairs(levels) do
  table.insert(reply, tonumber(redis.call('HGET', KEYS[K_LIVE], tag) or '0'))
end
table.insert(reply, #spec.b)
for i, b in ipairs(spec.b) do
  table.insert(reply, used[i])
  table.insert(reply, reserved[i])
  table.insert(reply, spec.w[b[4]][2] - now)
end
if spec.r then
  table.insert(reply, #spec.r)
  for _, r in ipairs(spec.r) do
    local rpm, tpm = r[2], r[3]
    local st = rate_read(r[1], tpm, now)
    if rpm > 0 then
      table.insert(reply, math.max(math.floor(rpm - st.est), 0))
      table.insert(reply, MINUTE_MS - st.elapsed)
    else
      table.insert(reply, -1)
      table.insert(reply, -1)
    end
    if tpm > 0 then
      table.insert(reply, math.max(tpm - st.win_state.live - st.win_state.ended, 0))
      table.insert(reply, tpm_reset(st.win_state, math.floor(now / 1000), now))
    else
      table.insert(reply, -1)
      table.insert(reply, -1)
    end
  end
end
return reply
