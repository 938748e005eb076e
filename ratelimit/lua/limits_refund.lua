-- KEYS = the hash of each scope with a tokens limit (ARGV[1] of them), then money counters.
-- ARGV = that count T, each scope's tpm, tokens, then the money delta (nano-units).
-- An absent bucket is full: nothing to do.
local s = tonumber(ARGV[1])
local tokens, now = tonumber(ARGV[s + 2]), clock()
for i = 1, s do
  local found = redis.call('HMGET', KEYS[i], 'r', 't')
  if found[2] then
    local tat_t = give_back(tonumber(found[2]), now, tonumber(ARGV[i + 1]), tokens)
    store(KEYS[i], now, tonumber(found[1]) or now, tat_t)
  end
end
money_settle(s + 1, tonumber(ARGV[s + 3] or '0'))
return 0
