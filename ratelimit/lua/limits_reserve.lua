-- KEYS = one hash per limited scope; ARGV = rpm, tpm per scope, then tokens.
-- Returns now and the TATs it found, two per scope.
local tokens, now = tonumber(ARGV[#ARGV]), clock()
local tats, limits, out = {}, {}, {fmt(now)}
for i, key in ipairs(KEYS) do
  local found = redis.call('HMGET', key, 'r', 't')
  tats[2 * i - 1], tats[2 * i] = tonumber(found[1]) or now, tonumber(found[2]) or now
  limits[2 * i - 1], limits[2 * i] = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  out[2 * i], out[2 * i + 1] = fmt(tats[2 * i - 1]), fmt(tats[2 * i])
end
local new = admit(tats, now, limits, tokens)
if new then
  for i, key in ipairs(KEYS) do store(key, now, new[2 * i - 1], new[2 * i]) end
end
return out
