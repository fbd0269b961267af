-- POST one JSON body on every request and print wrk's figures as one JSON line.
--
-- Environment: WRK_BODY  path of the request body (JSON), read once per thread
--              WRK_KEY   bearer token; empty or unset: no Authorization header
-- Output (from done(), after wrk's own report): one line
--   WRK_JSON {"duration_us":..,"requests":..,"bytes":..,"errors":{..},"latency_us":{..}}
-- latency_us holds min, max, mean, stdev and percentiles "50", "75", "90", "99", "99.9"
-- (microseconds, wrk's histogram: time from writing a request to the end of its response,
-- the last byte of a chunked body included). errors.status counts responses with status > 399.
-- A script that wants more in the line defines extra_json() returning '"name": value, ...'.

local path = assert(os.getenv("WRK_BODY"), "WRK_BODY: path of the request body")
local file = assert(io.open(path, "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = "application/json"
local key = os.getenv("WRK_KEY")
if key and key ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. key
end

threads = {}

function setup(thread)
  table.insert(threads, thread)
end

local function sum_over_threads(name)
  local total = 0
  for _, t in ipairs(threads) do
    total = total + (t:get(name) or 0)
  end
  return total
end
wrk_sum = sum_over_threads

function done(summary, latency, requests)
  local e = summary.errors
  local pct = {}
  for _, q in ipairs({ 50, 75, 90, 99, 99.9 }) do
    table.insert(pct, string.format('"%s": %d', tostring(q), latency:percentile(q)))
  end
  local line = string.format(
    '{"duration_us": %d, "requests": %d, "bytes": %d, '
      .. '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, '
      .. '"latency_us": {"min": %d, "max": %d, "mean": %.1f, "stdev": %.1f, %s}',
    summary.duration, summary.requests, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.max, latency.mean, latency.stdev, table.concat(pct, ", ")
  )
  if extra_json then
    line = line .. ", " .. extra_json()
  end
  io.write("WRK_JSON " .. line .. "}\n")
end
