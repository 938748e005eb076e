-- KEYS = one hash per limited scope (ARGV[1] of them), then one money counter per budget.
-- ARGV = the scope count S, rpm and tpm per scope, tokens, then (with counters) the amount to
-- reserve, the counters' TTL and each counter's limit.
-- Returns now and the TATs it found, two per scope; with counters and every bucket allowing,
-- money_reserve's answer after them. Nothing is written unless the buckets and the counters
-- all allow: one request, one script, all or nothing.
local s = tonumber(ARGV[1])
local tokens, now = tonumber(ARGV[2 * s + 2]), clock()
local tats, limits, out = {}, {}, {fmt(now)}
for i = 1, s do
  local found = redis.call('HMGET', KEYS[i], 'r', 't')
  tats[2 * i - 1], tats[2 * i] = tonumber(found[1]) or now, tonumber(found[2]) or now
  limits[2 * i - 1], limits[2 * i] = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  out[2 * i], out[2 * i + 1] = fmt(tats[2 * i - 1]), fmt(tats[2 * i])
end
local new = admit(tats, now, limits, tokens)
if new and #KEYS > s then
  local base, ceilings = 2 * s + 2, {}
  for i = s + 1, #KEYS do ceilings[i - s] = tonumber(ARGV[base + 2 + i - s]) end
  local money = money_reserve(s + 1, tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), ceilings)
  for _, value in ipairs(money) do out[#out + 1] = value end
  if money[1] ~= 0 then new = nil end
end
if new then
  for i = 1, s do store(KEYS[i], now, new[2 * i - 1], new[2 * i]) end
end
return out
