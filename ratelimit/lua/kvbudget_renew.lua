-- ARGV: lease id, ttl ms. Returns 1 if the lease was live (and now runs to now + ttl), else 0.
purge(0)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
hold(0, ARGV[1], now + tonumber(ARGV[2]))
return 1
