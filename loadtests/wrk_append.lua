-- wrk script: closed-loop msgpack appends (one request in flight per connection).
-- Environment: SEQLOG_LOG (log id), SEQLOG_SIZE (payload bytes), SEQLOG_BATCH (records per
-- request; >1 uses append-batch), SEQLOG_PIPELINE (requests written back to back per
-- connection before reading the answers; default 1), SEQLOG_INFLIGHT (only copied into the
-- output: wrk's -c, for loadtests.summarize). Body encoding is plain msgpack written by hand because wrk's
-- Lua has no msgpack module: map{"payload": bin} or map{"payloads": array of bin}.
local log_id = os.getenv("SEQLOG_LOG") or "1"
local size = tonumber(os.getenv("SEQLOG_SIZE") or "1024")
local batch = tonumber(os.getenv("SEQLOG_BATCH") or "1")
local pipeline = tonumber(os.getenv("SEQLOG_PIPELINE") or "1")

local function bin(n)
  local payload = string.rep("x", n)
  if n < 256 then return string.char(0xc4, n) .. payload end
  if n < 65536 then return string.char(0xc5, math.floor(n / 256), n % 256) .. payload end
  error("payload too big for this script")
end

local function str(s) return string.char(0xa0 + #s) .. s end

local body, path
if batch > 1 then
  local items = {}
  for i = 1, batch do items[i] = bin(size) end
  local header
  if batch < 16 then header = string.char(0x90 + batch)
  else header = string.char(0xdc, math.floor(batch / 256), batch % 256) end
  body = string.char(0x81) .. str("payloads") .. header .. table.concat(items)
  path = "/v1/logs/" .. log_id .. "/append-batch"
else
  body = string.char(0x81) .. str("payload") .. bin(size)
  path = "/v1/logs/" .. log_id .. "/append"
end

wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/msgpack"
wrk.headers["Accept"] = "application/msgpack"
local token = os.getenv("SEQLOG_TOKEN")
if token and token ~= "" then wrk.headers["Authorization"] = "Bearer " .. token end

local requests
function request()
  if requests == nil then requests = string.rep(wrk.format(nil, path), pipeline) end
  return requests
end

local errors = 0
function response(status, headers, body)
  if status ~= 200 then errors = errors + 1 end
end

function done(summary, latency, requests)
  io.write(string.format(
    '{"bench": "seqlog_append_wrk", "inflight": %d, "batch": %d, "size": %d, ' ..
    '"requests_per_s": %.1f, ' ..
    '"records_per_s": %.1f, "p50_ms": %.3f, "p99_ms": %.3f, "max_ms": %.3f, ' ..
    '"non_200": %d, "socket_errors": %d}\n',
    tonumber(os.getenv("SEQLOG_INFLIGHT") or "0"), batch, size,
    summary.requests / (summary.duration / 1e6),
    batch * summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000,
    summary.errors.status, summary.errors.connect + summary.errors.read +
    summary.errors.write + summary.errors.timeout))
end
