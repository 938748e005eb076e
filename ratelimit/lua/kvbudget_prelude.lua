-- An engine's keys, from base offset ``e`` into KEYS: e+1 expiries (sorted set lease id ->
-- expiry ms), e+2 leases (hash lease id -> "tokens|tenant"), e+3 tenants (hash tenant ->
-- tokens), e+4 total (string), e+5 waiting (sorted set tenant -> until ms). The running totals
-- make a reservation O(log n + expired) instead of a sum over every lease. Every key expires at
-- least a second, and at most about two lease TTLs, after the last lease or waiter it holds, so
-- an engine nobody uses leaves nothing behind; when no lease is left the totals are reset, so
-- they cannot drift even if a key was evicted.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local function drop(e, id)
  redis.call('ZREM', KEYS[e+1], id)
  local held = redis.call('HGET', KEYS[e+2], id)
  if not held then return end
  redis.call('HDEL', KEYS[e+2], id)
  local bar = string.find(held, '|', 1, true)
  local tokens = tonumber(string.sub(held, 1, bar - 1))
  local tenant = string.sub(held, bar + 1)
  if redis.call('HINCRBY', KEYS[e+3], tenant, -tokens) <= 0 then
    redis.call('HDEL', KEYS[e+3], tenant)
  end
  if redis.call('DECRBY', KEYS[e+4], tokens) <= 0 then redis.call('DEL', KEYS[e+4]) end
end

local function purge(e)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[e+1], '-inf', now)
  if #expired > 0 then
    for _, id in ipairs(expired) do drop(e, id) end
    if redis.call('ZCARD', KEYS[e+1]) == 0 then
      redis.call('DEL', KEYS[e+2], KEYS[e+3], KEYS[e+4])
    end
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[e+5], '-inf', now)
end

local function total(e) return tonumber(redis.call('GET', KEYS[e+4]) or '0') end

-- Keep keys e+j0..e+j1 alive until at least `until_ms` + 1 s. A short expiry is pushed twice
-- as far as needed, so most calls only read one PTTL.
local function outlive(e, j0, j1, until_ms)
  local left = redis.call('PTTL', KEYS[e+j0])
  if left >= 0 and now + left >= until_ms + 1000 then return end
  local horizon = until_ms + 1000 + math.max(until_ms - now, 0)
  for j = j0, j1 do redis.call('PEXPIREAT', KEYS[e+j], horizon) end
end

local function hold(e, id, expiry)
  redis.call('ZADD', KEYS[e+1], expiry, id)
  outlive(e, 1, 4, expiry)
end
