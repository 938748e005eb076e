-- KEYS = money counters: what each holds (0 when absent).
local out = {}
for i, key in ipairs(KEYS) do out[i] = tonumber(redis.call('GET', key) or '0') end
return out
