-- post.lua, and every response read and checked: status 200, the usage the body reports
-- (completion_tokens = WRK_EXPECT_TOKENS), and for a stream (WRK_STREAM=1) the closing
-- "data: [DONE]" and the number of SSE data events. Latency is not affected (wrk takes its
-- timestamp before calling response()); the next request on the connection waits for it.
--
-- Adds to the WRK_JSON line: "check": {"responses", "ok", "bad_status", "bad_tokens",
-- "no_done", "events_min", "events_max", "sample"} where sample is the first bad body's
-- first 200 bytes (or null).

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "post.lua")

local expect = tonumber(os.getenv("WRK_EXPECT_TOKENS") or "")
local stream = os.getenv("WRK_STREAM") == "1"

responses, ok, bad_status, bad_tokens, no_done = 0, 0, 0, 0, 0
events_min, events_max = -1, 0
sample = nil

local function bad(body)
  if sample == nil then
    sample = body:sub(1, 200)
  end
end

function response(status, headers, body)
  responses = responses + 1
  if status ~= 200 then
    bad_status = bad_status + 1
    bad(body)
    return
  end
  local good = true
  local tokens = tonumber(body:match('"completion_tokens":%s*(%d+)'))
  if expect and tokens ~= expect then
    bad_tokens = bad_tokens + 1
    good = false
  end
  if stream then
    local _, events = body:gsub("data: ", "")
    if events_min < 0 or events < events_min then events_min = events end
    if events > events_max then events_max = events end
    if not body:find("data: [DONE]", 1, true) then
      no_done = no_done + 1
      good = false
    end
  end
  if good then ok = ok + 1 else bad(body) end
end

local function first_sample()
  for _, t in ipairs(threads) do
    local s = t:get("sample")
    if s then
      return string.format("%q", s):gsub("\\\n", "\\n")
    end
  end
  return "null"
end

function extra_json()
  local lo = -1
  for _, t in ipairs(threads) do
    local m = t:get("events_min") or -1
    if m >= 0 and (lo < 0 or m < lo) then lo = m end
  end
  local hi = 0
  for _, t in ipairs(threads) do
    hi = math.max(hi, t:get("events_max") or 0)
  end
  return string.format(
    '"check": {"responses": %d, "ok": %d, "bad_status": %d, "bad_tokens": %d, '
      .. '"no_done": %d, "events_min": %d, "events_max": %d, "sample": %s}',
    wrk_sum("responses"), wrk_sum("ok"), wrk_sum("bad_status"), wrk_sum("bad_tokens"),
    wrk_sum("no_done"), lo, hi, first_sample()
  )
end
