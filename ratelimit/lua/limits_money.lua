-- Money counters beside the rate limits (ratelimit.money): KEYS[first..] are counters in
-- nano-units, one per budget, with `limits` (-1: soft, never refuses) in the same order.
-- Reserve `amount` on every counter when none would pass its limit; else touch nothing.
-- Returns {0, each counter after} or {i, what counter i holds} (i 1-based: the refusal).
-- Each counter is added to at once and taken back on a refusal: one call per counter when
-- they allow (the common case); a counter's TTL is set when the reservation creates it.
local function money_reserve(first, amount, ttl, limits)
  local after = {0}
  for i = first, #KEYS do
    local value = redis.call('INCRBY', KEYS[i], amount)
    local limit = limits[i - first + 1]
    if limit >= 0 and value > limit then
      for j = first, i - 1 do redis.call('DECRBY', KEYS[j], amount) end
      if value == amount then  -- made by this call, without its TTL yet: removed again
        redis.call('DEL', KEYS[i])
      else
        redis.call('DECRBY', KEYS[i], amount)
      end
      return {i - first + 1, value - amount}
    end
    if value == amount then redis.call('EXPIRE', KEYS[i], ttl) end
    after[#after + 1] = value
  end
  return after
end

-- Add `delta` (negative: a refund) to each counter from KEYS[first] that still exists: a
-- window that ended took its counter with it, and a late settlement does not make it again.
-- A live reservation holds more than 0, so a counter that holds exactly `delta` after the
-- addition was absent (and has no TTL): it is removed.
local function money_settle(first, delta)
  if delta == 0 then return end
  for i = first, #KEYS do
    if redis.call('INCRBY', KEYS[i], delta) == delta and redis.call('TTL', KEYS[i]) == -1 then
      redis.call('DEL', KEYS[i])
    end
  end
end
