-- 1735689600 is 2025-01-01T00:00:00Z, the origin of the Lua clock: ratelimit.limits._EPOCH (tested)
-- Redis >= 5 replicates scripts by their effects, so reading TIME before writing is allowed and
-- replicas receive the HSET/PEXPIRE, not the script.
local function clock()
  local t = redis.call('TIME')
  return (tonumber(t[1]) - 1735689600) + tonumber(t[2]) / 1000000
end

-- keep the key until both buckets are full again; a full bucket is an absent one
local function store(key, now, tat_r, tat_t)
  local ttl = math.ceil((math.max(tat_r, tat_t) - now) * 1000)
  if ttl > 0 then
    redis.call('HSET', key, 'r', fmt(tat_r), 't', fmt(tat_t))
    redis.call('PEXPIRE', key, ttl)
  else
    redis.call('DEL', key)
  end
end
