-- ARGV: lease id, tenant, priority, ttl ms, waiting ttl ms, pressure threshold, the number of
-- weights and (tenant, weight) pairs, then (limit, tokens) per candidate, then how many of the
-- first candidates are preferred (tried first, in order, before the rest by free budget); KEYS: five per
-- candidate, in the same order. fairness.decide and fairness.route in Lua: the same integer
-- expressions in the same order. Returns {1, candidate} admitted, {0, 0} wait, {-1, 0} reject.
local id, tenant, priority = ARGV[1], ARGV[2], ARGV[3]
local ttl, wttl, threshold = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local weights, nw = {}, tonumber(ARGV[7])
for j = 0, nw - 1 do weights[ARGV[8 + 2 * j]] = tonumber(ARGV[9 + 2 * j]) end
local first = 8 + 2 * nw
local n = #KEYS / 5
local function weight(t) return weights[t] or 1 end
local function limit(i) return tonumber(ARGV[first + 2 * (i - 1)]) end
local function tokens(i) return tonumber(ARGV[first + 2 * (i - 1) + 1]) end

for i = 1, n do
  local e = 5 * (i - 1)
  purge(e)
  if redis.call('ZSCORE', KEYS[e+1], id) then hold(e, id, now + ttl); return {1, i} end
end

local function within_share(e, need, cap, waiting)
  local seen, sum, mine = {}, 0, 0
  local held = redis.call('HGETALL', KEYS[e+3])
  for j = 1, #held, 2 do
    local t, h = held[j], tonumber(held[j + 1])
    if t == tenant then mine = h end
    if h > 0 and not seen[t] then seen[t] = true; sum = sum + weight(t) end
  end
  for _, t in ipairs(waiting) do
    if not seen[t] then seen[t] = true; sum = sum + weight(t) end
  end
  if not seen[tenant] then sum = sum + weight(tenant) end
  return (mine + need) * sum <= cap * weight(tenant)
end

local function decide(e, reserved, cap, need)
  local after = reserved + need
  -- sheddable work fills at most 3/4 of the pressure line (ratelimit.fairness.SHEDDABLE_SHARE)
  if priority == 'sheddable' and after > cap * threshold * 0.75 then return 'reject' end
  if after > cap * threshold then
    if priority == 'standard' then return 'wait' end
  end
  if after > cap then return 'wait' end
  local waiting = redis.call('ZRANGE', KEYS[e+5], 0, -1)
  local others = false
  for _, t in ipairs(waiting) do if t ~= tenant then others = true end end
  if not others or within_share(e, need, cap, waiting) then return 'admit' end
  return 'wait'
end

local preferred = math.min(tonumber(ARGV[first + 2 * n]) or 0, n)
local order, free, totals = {}, {}, {}
for i = 1, n do
  totals[i] = total(5 * (i - 1))
  order[i] = i
  free[i] = totals[i] - limit(i)
end
local rest = {}
for i = preferred + 1, n do rest[#rest + 1] = i end
table.sort(rest, function(a, b)
  if free[a] ~= free[b] then return free[a] < free[b] end
  return a < b
end)
for j, i in ipairs(rest) do order[preferred + j] = i end

local waits = false
for _, i in ipairs(order) do
  local e, need = 5 * (i - 1), tokens(i)
  local verdict = decide(e, totals[i], limit(i), need)
  if verdict == 'admit' then
    redis.call('HSET', KEYS[e+2], id, need .. '|' .. tenant)
    redis.call('HINCRBY', KEYS[e+3], tenant, need)
    redis.call('INCRBY', KEYS[e+4], need)
    hold(e, id, now + ttl)
    return {1, i}
  end
  if verdict == 'wait' then waits = true end
end
if not waits then return {-1, 0} end
for i = 1, n do
  local e = 5 * (i - 1)
  redis.call('ZADD', KEYS[e+5], now + wttl, tenant)
  outlive(e, 5, 5, now + wttl)
end
return {0, 0}
