-- gcra.decide, gcra.refund and admit's all-or-nothing rule in Lua, the same expressions in the
-- same order. Lua numbers are doubles (Redis embeds Lua 5.1), so both sides compute bit-identical
-- TATs and decisions.
local WINDOW, SLACK = 60, 0.001

-- gcra.decide: the new TAT, or nil when `cost` does not fit (limit 0: unlimited)
local function take(tat, now, limit, cost)
  if limit == 0 then return tat end
  local interval = WINDOW / limit
  local base = math.max(tat, now)
  local available = limit - (base - now) / interval
  if cost > limit or cost > available + SLACK then return nil end
  return base + cost * interval
end

-- gcra.refund: back by `amount` units, never before now, never forward
local function give_back(tat, now, limit, amount)
  if limit == 0 then return tat end
  return math.min(tat, math.max(tat - amount * (WINDOW / limit), now))
end

-- admit: 1 request and `tokens` tokens from every bucket, all or nothing. `tats` and `limits`
-- hold (requests, tokens) pairs, scope after scope; the new TATs, or nil when a bucket refuses
local function admit(tats, now, limits, tokens)
  local new = {}
  for i = 1, #tats, 2 do
    new[i] = take(tats[i], now, limits[i], 1)
    new[i + 1] = take(tats[i + 1], now, limits[i + 1], tokens)
    if not (new[i] and new[i + 1]) then return nil end
  end
  return new
end

local function fmt(x) return string.format('%.17g', x) end
