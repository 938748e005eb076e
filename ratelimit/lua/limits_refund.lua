-- KEYS = the hash of each scope with a tokens limit; ARGV = each one's tpm, then tokens.
-- An absent bucket is full: nothing to do.
local tokens, now = tonumber(ARGV[#ARGV]), clock()
for i, key in ipairs(KEYS) do
  local found = redis.call('HMGET', key, 'r', 't')
  if found[2] then
    local tat_t = give_back(tonumber(found[2]), now, tonumber(ARGV[i]), tokens)
    store(key, now, tonumber(found[1]) or now, tat_t)
  end
end
return 0
